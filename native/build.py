"""Builds every native target into one output directory.

Each ``native/<target>/target.py`` exposes ``build(out_dir: Path, cc: str) -> list[Path]``
and owns its own sources.  This driver only finds the compiler, runs the
targets in a stable order and reports what was produced, so a missing compiler
or a failing target stops the package build with a message naming it.

Run it directly to build into a directory of your choice:
``python native/build.py OUT_DIR``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

NATIVE = Path(__file__).resolve().parent
# Targets import ``native.toolchain``: make the repository root importable
# however this driver was started (``python native/build.py`` puts only
# ``native/`` itself on the path).
if str(NATIVE.parent) not in sys.path:
    sys.path.insert(0, str(NATIVE.parent))


def find_compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit("native build: no C compiler found (install gcc or set CC)")
    return cc


def targets() -> list[Path]:
    return sorted(p for p in NATIVE.glob("*/target.py"))


def build_all(out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = find_compiler()
    produced: list[Path] = []
    for target in targets():
        name = target.parent.name
        spec = importlib.util.spec_from_file_location(f"native_{name}_target", target)
        assert spec
        assert spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        built = module.build(out_dir, cc)
        for path in built:
            print(f"native build: {name}: {path}", file=sys.stderr)
        produced.extend(built)
    return produced


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python native/build.py OUT_DIR")
    build_all(Path(sys.argv[1]))
