"""One way to run the C compiler for every native target.

Each target (``native/<name>/target.py``) decides its own flags and sources;
this module owns what they all need the same: compile into a hidden partial
file beside the output and rename it over, so a process that maps the
library (a test, a running nvidia-smi) never sees a half-written file, and
fail with the whole command line and the compiler's own message.

Targets import it as ``native.toolchain``: the repository root is on
``sys.path`` in every way they are run (the package build's ``setup.py``,
``python native/build.py``, the test suite).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

#: The ``native/`` directory: one ``<name>/target.py`` per target.
NATIVE = Path(__file__).resolve().parent


def load_target(name: str) -> ModuleType:
    """``native/<name>/target.py`` as a module, imported by its path: the target
    directories are no packages (``nvidia-smi`` is no identifier).  For a target
    built on another (``nvidia-smi`` on ``nvml``) and the scripts that build one."""
    path = NATIVE / name / "target.py"
    spec = importlib.util.spec_from_file_location(f"native_{name.replace('-', '_')}_target", path)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reproducible_flags() -> list[str]:
    """Flags that keep the build's location out of what it produces.

    The source tree's path (a temp copy, an sdist unpacked by pip) and the
    compiler's working directory otherwise land in the debug info and in
    ``__FILE__`` (assertions), so two builds of the same sources in two
    directories would differ.  GCC applies the last matching map, so the
    tree's, the more specific one when the build runs inside it, comes last.
    """
    return [f"-fdebug-prefix-map={os.getcwd()}=.", f"-ffile-prefix-map={NATIVE.parent}=."]


def compile_into(output: Path, cc: str, args: Sequence[str], *, label: str) -> Path:
    """Run ``cc args... -o <partial>`` and rename the partial file to ``output``.

    ``label`` names the target in the error (``native/nvml``).  Raises
    ``RuntimeError`` with the command and the compiler's stderr on failure,
    leaving no partial file behind.
    """
    output = Path(output)
    partial = output.with_name(f".{output.name}.partial")
    command = [cc, *reproducible_flags(), *args, "-o", str(partial)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(
            f"{label}: compiling {output.name} failed (exit code {result.returncode}):\n"
            f"{' '.join(command)}\n{result.stderr}"
        )
    os.replace(partial, output)
    return output


#: Flags every LD_PRELOAD shim is built with: position-independent, only the
#: hooks exported (``-fvisibility=hidden`` plus explicit default visibility
#: in the sources), no undefined symbols left for the loader to trip over.
SHIM_CFLAGS = (
    "-std=gnu11",
    "-O2",
    "-g",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wl,-z,defs",
)


def build_shim(
    out_dir: Path,
    cc: str,
    *,
    library: str,
    sources: Sequence[Path],
    label: str,
    flags: Sequence[str] = (),
    extra_cflags: Sequence[str] = (),
) -> list[Path]:
    """Compile an LD_PRELOAD shim into ``out_dir/library``; ``flags`` are the
    target's own, ``extra_cflags`` serve experiments in tests (sanitizers)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / library
    args = [
        *SHIM_CFLAGS,
        *flags,
        f"-Wl,-soname,{library}",
        *extra_cflags,
        *(str(s) for s in sources),
        "-ldl",
        "-pthread",
    ]
    compile_into(output, cc, args, label=label)
    return [output]
