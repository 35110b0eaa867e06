"""The package's layers, kept by walking every import with ``ast``.

Lowest first: errors/settings/layout/native/logs < state < host < simulators
< daemon < cli/ctl.  A module imports only from its own layer or lower ones
(type-only imports under ``TYPE_CHECKING`` count too: they tangle the design
just the same).  A new top-level module must be placed in ``LAYERS`` here,
deliberately.
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
NAMES = {0: "base", 1: "state", 2: "host", 3: "simulators", 4: "daemon", 5: "cli"}


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
