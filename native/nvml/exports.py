"""Generates the mock NVML library's complete export surface from ``nvml.h``.

Every function NVIDIA's header declares must exist in the library with its
exact prototype: consumers resolve names lazily (nvidia-smi looks up 234 of
them with ``dlsym``) and print "Function Not Found" for a missing one.  The
hand-written C files implement what consumers use and mark each definition
with ``MOCK_API``; this module finds those, then writes ``stubs.c`` with a
definition for every other declared function that returns
``NVML_ERROR_NOT_SUPPORTED`` and leaves its outputs untouched.

The header is compiled with ``NVML_NO_UNVERSIONED_FUNC_DEFS`` so it also
declares the unversioned names (``nvmlInit``, ``nvmlDeviceGetCount``...),
which keep their older ABI; both spellings are exported.

Names consumers call that the header does not declare are listed in
``EXTRA_PROTOTYPES`` and exported anyway.  This runs inside pip's isolated
build environment, so it uses the standard library only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Functions outside the header that consumers need exported.
#: ``nvmlInternalGetExportTable``: nvidia-smi refuses to run without it.
EXTRA_PROTOTYPES: dict[str, tuple[str, str]] = {
    "nvmlInternalGetExportTable": (
        "nvmlReturn_t",
        "const void **ppExportTable, const unsigned char *pExportTableId",
    ),
}

#: Where the wheels of ``nvidia-nvml-dev`` put the header, relative to the
#: ``nvidia`` namespace package (CUDA 13 layout first, then the CUDA 12 one).
_HEADER_CANDIDATES = ("cu13/include/nvml.h", "nvml_dev/include/nvml.h", "include/nvml.h")

_IMPLEMENTED = re.compile(r"MOCK_API\s+[^;{()]*?\b(nvml\w+)\s*\(", re.S)
_DECLARATION = re.compile(r"^([A-Za-z_][\w\s\*]*?)\s*\b(nvml\w+)\s*\((.*)\)$", re.S)


class HeaderNotFound(RuntimeError):
    """NVIDIA's nvml.h is not installed where the build can see it."""


@dataclass(frozen=True)
class Prototype:
    name: str
    #: return type, e.g. ``nvmlReturn_t``
    returns: str
    #: parameter list as declared, e.g. ``nvmlDevice_t device, unsigned int *count``
    params: str


def find_header() -> Path:
    """Locate ``nvml.h``: ``NVML_HEADER``, else the ``nvidia-nvml-dev`` package.

    The package is a build requirement, so inside pip's isolated build
    environment it is importable as the ``nvidia`` namespace package; from a
    checkout, ``.venv/bin/pip install nvidia-nvml-dev==...`` (the ``test``
    extra pins it) makes it importable the same way.
    """
    override = os.environ.get("NVML_HEADER")
    if override:
        path = Path(override)
        if not path.is_file():
            raise HeaderNotFound(f"NVML_HEADER={override} does not name a file")
        return path
    locations: list[Path] = []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        locations.extend(Path(p) for p in spec.submodule_search_locations)
    locations.extend(Path(p) / "nvidia" for p in sys.path if p)
    for base in locations:
        for candidate in _HEADER_CANDIDATES:
            path = base / candidate
            if path.is_file():
                return path
    raise HeaderNotFound(
        "nvml.h not found: install the build requirement, e.g. "
        "`.venv/bin/pip install nvidia-nvml-dev==13.0.39`, or set NVML_HEADER"
    )


def header_statements(header: Path, cc: str) -> list[str]:
    """The header's top-level C statements (declarations, typedefs), preprocessed
    the way the library compiles it, whitespace collapsed."""
    text = subprocess.run(
        [cc, "-E", "-P", "-DNVML_NO_UNVERSIONED_FUNC_DEFS", "-x", "c", str(header)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return list(_top_level_statements(text))


def parameters(params: str) -> list[tuple[str, str]]:
    """``(type, name)`` of each parameter of a prototype's parameter list
    (NVML's have no function-pointer or array parameters); ``[]`` for ``void``."""
    if params.strip() in ("", "void"):
        return []
    result = []
    for param in params.split(","):
        match = re.fullmatch(r"\s*(.*?[\s\*])(\w+)\s*", param)
        if match is None:
            raise ValueError(f"cannot parse the parameter {param!r}")
        ctype = re.sub(r"\s*\*\s*", " *", match.group(1).strip()).replace("* *", "**")
        result.append((ctype, match.group(2)))
    return result


def declared_prototypes(header: Path, cc: str) -> dict[str, Prototype]:
    """Every function the header declares, parsed from its preprocessed text."""
    result: dict[str, Prototype] = {}
    for statement in header_statements(header, cc):
        if statement.startswith(("typedef", "extern", "enum", "struct", "union")):
            continue
        match = _DECLARATION.match(statement)
        if match:
            returns, name, params = (part.strip() for part in match.groups())
            result[name] = Prototype(name=name, returns=" ".join(returns.split()), params=params)
    return result


def _top_level_statements(text: str) -> Iterable[str]:
    """Split C at top-level semicolons (braces nest), whitespace collapsed."""
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        if char == ";" and depth == 0:
            yield " ".join("".join(current).split())
            current = []
        else:
            current.append(char)


def implemented_names(sources: Iterable[Path]) -> set[str]:
    """Names the hand-written C files define with ``MOCK_API``."""
    names: set[str] = set()
    for source in sources:
        names.update(_IMPLEMENTED.findall(source.read_text()))
    return names


@dataclass(frozen=True)
class Surface:
    """The export surface: what is implemented, what is stubbed."""

    header: Path
    prototypes: dict[str, Prototype]
    implemented: frozenset[str]

    @property
    def stubs(self) -> list[Prototype]:
        return [p for name, p in sorted(self.prototypes.items()) if name not in self.implemented]

    def coverage(self) -> dict[str, object]:
        return {
            # the package-relative spelling, e.g. nvidia/cu13/include/nvml.h
            "header": "/".join(self.header.parts[-4:]),
            "total": len(self.prototypes),
            "implemented": len(self.implemented),
            "stubs": len(self.stubs),
            "implemented_names": sorted(self.implemented),
        }


def surface(header: Path, cc: str, sources: Iterable[Path]) -> Surface:
    prototypes = declared_prototypes(header, cc)
    for name, (returns, params) in EXTRA_PROTOTYPES.items():
        prototypes.setdefault(name, Prototype(name=name, returns=returns, params=params))
    implemented = implemented_names(sources)
    unknown = sorted(implemented - prototypes.keys())
    if unknown:
        raise RuntimeError(
            f"native/nvml: MOCK_API functions not declared by {header} nor listed in "
            f"EXTRA_PROTOTYPES: {', '.join(unknown)}"
        )
    odd = [
        p.name
        for p in prototypes.values()
        if p.name not in implemented and p.returns != "nvmlReturn_t"
    ]
    if odd:
        raise RuntimeError(
            f"native/nvml: cannot stub functions that do not return nvmlReturn_t: {', '.join(odd)}"
        )
    return Surface(header=header, prototypes=prototypes, implemented=frozenset(implemented))


def render_stubs(s: Surface) -> str:
    """C source defining every unimplemented function as NOT_SUPPORTED."""
    lines = [
        "/* Generated by native/nvml/exports.py from " + s.header.name + ": do not edit.",
        " * Every declared NVML function the mock does not implement: it reports",
        " * NOT_SUPPORTED and leaves its outputs untouched. */",
        '#include "mock.h"',
        "",
        '#pragma GCC diagnostic ignored "-Wunused-parameter"',
        "",
    ]
    for name, (returns, params) in sorted(EXTRA_PROTOTYPES.items()):
        # Declare the extra names so their definitions (stubbed or not) have a prototype.
        lines.append(f"{returns} {name}({params});")
    lines.append("")
    for proto in s.stubs:
        lines.append(f"MOCK_API {proto.returns} {proto.name}({proto.params})")
        lines.append("{")
        lines.append('    mock_debug("%s: not supported by the mock", __func__);')
        lines.append("    return NVML_ERROR_NOT_SUPPORTED;")
        lines.append("}")
        lines.append("")
    return "\n".join(lines)


def write_coverage(s: Surface, path: Path) -> None:
    path.write_text(json.dumps(s.coverage(), indent=2) + "\n")
