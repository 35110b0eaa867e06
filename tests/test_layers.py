"""The package's layers, kept by walking every import with ``ast``.

Lowest first: errors/settings/layout/native/logs < state < noderoot <
simulators < daemon < cli/ctl.  A module imports only from its own layer or
lower ones (type-only imports under ``TYPE_CHECKING`` count too: they tangle
the design just the same).  A new top-level module must be placed in
``LAYERS`` here, deliberately.  Beyond the order: the node root is reached
only through its package's face, no two modules import each other however
indirectly, and the top level stays small.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mokka"

#: (layer number, module prefix).  The longest matching prefix wins.
LAYERS: dict[str, int] = {
    "mokka": 0,  # the package's own __init__: version only
    "mokka.errors": 0,
    "mokka.settings": 0,
    "mokka.layout": 0,
    "mokka.native": 0,
    "mokka.logs": 0,
    "mokka.lazylogger": 0,
    "mokka.loglimit": 0,
    "mokka.state": 1,
    "mokka.noderoot": 2,
    "mokka.simulators": 3,
    "mokka.daemon": 4,
    "mokka.cli": 5,
    "mokka.helpformat": 5,
    "mokka.ctl": 5,  # with fabricmanager-ctl, a stand-alone command (nv-fabricmanager-ctl style)
    "mokka.__main__": 5,
}
NAMES = {0: "base", 1: "state", 2: "noderoot", 3: "simulators", 4: "daemon", 5: "cli"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    """Layer of a ``mokka`` module; ``None`` when no prefix in ``LAYERS`` claims it."""
    candidates = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    if not candidates or (candidates == ["mokka"] and module != "mokka"):
        return None
    return LAYERS[max(candidates, key=len)]


def _exists(module: str) -> bool:
    base = PACKAGE.parent / module.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imports_in(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every ``mokka`` import in ``source``, wherever it is.

    ``module`` is the importing module's name (relative imports resolve
    against it); ``from x import y`` counts as ``x.y`` when that is a module.
    """
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.append((node.lineno, candidate if _exists(candidate) else target))
    return [(line, name) for line, name in found if name == "mokka" or name.startswith("mokka.")]


def imports_of(path: Path) -> list[tuple[int, str]]:
    return imports_in(path.read_text(), module_name(path), is_package=path.name == "__init__.py")


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_modules_to_check():
    names = {module_name(p) for p in MODULES}
    expected = {"mokka.noderoot.host", "mokka.daemon.reconciler", "mokka.state.model", "mokka.cli"}
    assert expected <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_module_imports_only_its_own_layer_or_lower(path: Path):
    module = module_name(path)
    layer = layer_of(module)
    assert layer is not None, f"{module} is in no layer: place it in LAYERS in {__file__}"
    problems = []
    for line, target in imports_of(path):
        target_layer = layer_of(target)
        if target_layer is None:
            problems.append(f"line {line}: imports {target}, which is in no layer")
        elif target_layer > layer:
            problems.append(
                f"line {line}: {module} ({NAMES[layer]}) imports {target} ({NAMES[target_layer]})"
            )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("from mokka.daemon import health\n", "mokka.state.x", ["mokka.daemon.health"]),
        ("from ..host import Host\n", "mokka.simulators.x", ["mokka.host"]),
        ("from . import base\n", "mokka.simulators.x", ["mokka.simulators.base"]),
        ("if TYPE_CHECKING:\n    import mokka.cli\n", "mokka.state.x", ["mokka.cli"]),
        (
            "def f():\n    from mokka.daemon.runner import R\n",
            "mokka.noderoot.host",
            ["mokka.daemon.runner"],
        ),
        ("import yaml, os\n", "mokka.state.x", []),
    ],
)
def test_the_walker_sees_every_kind_of_import(source: str, module: str, expected: list[str]):
    assert [name for _line, name in imports_in(source, module)] == expected


@pytest.mark.parametrize(
    ("importer", "imported", "allowed"),
    [
        ("mokka.state.compile", "mokka.noderoot.host", False),
        ("mokka.state.compile", "mokka.simulators.base", False),
        ("mokka.simulators.gpudriver", "mokka.daemon.health", False),
        ("mokka.simulators.gpudriver", "mokka.cli", False),
        ("mokka.noderoot.host", "mokka.errors", True),
        ("mokka.noderoot.host", "mokka.state.model", True),
        ("mokka.daemon.runner", "mokka.simulators.base", True),
        ("mokka.errors", "mokka.state.model", False),
        ("mokka.cli", "mokka.daemon.command", True),
    ],
)
def test_the_layer_order(importer: str, imported: str, allowed: bool):
    assert (layer_of(imported) <= layer_of(importer)) is allowed


# ---- the node root's face ------------------------------------------------------

#: Who sits above the node root and so reaches it only through its face.
NODEROOT_USERS = ("mokka.simulators", "mokka.daemon", "mokka.ctl", "mokka.cli")


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if _under(module_name(p), NODEROOT_USERS)],
    ids=lambda p: module_name(p),
)
def test_the_node_root_is_reached_only_through_its_face(path: Path):
    """``from mokka.noderoot import Host``, never ``from mokka.noderoot.host import ...``."""
    inner = [
        f"line {line}: imports {target}"
        for line, target in imports_of(path)
        if target.startswith("mokka.noderoot.")
    ]
    assert not inner, (
        f"{module_name(path)} reaches into the node root; import the name from "
        "mokka.noderoot (add it to its FACE if it is missing):\n" + "\n".join(inner)
    )


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if _under(module_name(p), ("mokka.noderoot",))],
    ids=lambda p: module_name(p),
)
def test_the_node_root_imports_nothing_above_it(path: Path):
    above = [
        f"line {line}: imports {target}"
        for line, target in imports_of(path)
        if _under(target, ("mokka.daemon", "mokka.simulators", "mokka.ctl", "mokka.cli"))
    ]
    assert not above, "\n".join(above)


def test_the_face_lists_what_it_serves():
    """Every name of the face loads from the module it names, and ``__all__`` says the same."""
    import importlib

    import mokka.noderoot as face

    assert sorted(face.__all__) == sorted(face.FACE)
    for name, module in face.FACE.items():
        defined = getattr(importlib.import_module(f"mokka.noderoot.{module}"), name)
        assert getattr(face, name) is defined, name
    with pytest.raises(AttributeError, match="no attribute 'convergence_helper'"):
        face.convergence_helper  # noqa: B018 - the lookup is the test


def test_the_walker_sees_a_name_of_the_face_as_the_package():
    """``from mokka.noderoot import Host`` is an import of the package, not of a module."""
    found = imports_in("from mokka.noderoot import Host, fsops\n", "mokka.simulators.x")
    assert [name for _line, name in found] == ["mokka.noderoot", "mokka.noderoot.fsops"]


# ---- no circles, a small top level ---------------------------------------------------


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the modules it imports (packages as their ``__init__``)."""
    names = {module_name(p) for p in MODULES}
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        module = module_name(path)
        targets = set()
        for _line, target in imports_of(path):
            while target not in names and "." in target:
                target = target.rpartition(".")[0]
            if target in names and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_modules_import_each_other():
    """Not even through others, nor for types only: the layering reads one way."""
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


#: At most about ten modules at the top of the package; the rest live in packages.
TOP_LEVEL_LIMIT = 12


def test_the_top_level_stays_small():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, top


def test_every_package_says_what_it_owns_and_may_use():
    """Each package's ``__init__`` opens with a docstring that names what it may use."""
    missing = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        if init.parent.name == "__pycache__" or not any(init.parent.glob("*.py")):
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if module_name(init).count(".") <= 1 and "may use" not in doc.lower():
            missing.append(module_name(init))
    assert missing == []
