"""Build target for ``libibshim.so``, the libibverbs LD_PRELOAD shim (ib ``full`` mode).

``native/build.py`` loads this file and calls ``build(out_dir, cc)``.  Plain
C against glibc: the few libibverbs structures the shim shares with
applications are declared in ``ibshim_abi.h`` (rdma-core's headers are not
needed, and the library does not link libibverbs: it finds the real
functions with ``dlsym`` when inert).  ``-fvisibility=hidden`` keeps every
helper out of the dynamic symbol table, so only the interposed entry points
(marked ``IBSHIM_EXPORT``) are exported.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from native.toolchain import compile_into

HERE = Path(__file__).resolve().parent

#: The artifact name (``mokka.native.IBSHIM_LIBRARY``); literal here so the
#: native build does not need the Python package importable.
LIBRARY = "libibshim.so"

SOURCES = ("tree.c", "verbs.c")

CFLAGS = (
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
    "-Wl,-soname," + LIBRARY,
)


def build(out_dir: Path, cc: str, extra_cflags: Sequence[str] = ()) -> list[Path]:
    """Compile the shim into ``out_dir/libibshim.so`` and return its path;
    ``extra_cflags`` serve experiments in tests (sanitizers)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / LIBRARY
    sources = [str(HERE / s) for s in SOURCES]
    args = [*CFLAGS, *extra_cflags, *sources, "-ldl", "-pthread"]
    compile_into(output, cc, args, label="native/ibshim")
    return [output]
