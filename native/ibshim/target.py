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

from native.toolchain import build_shim

HERE = Path(__file__).resolve().parent

#: The artifact name (``mokka.native.IBSHIM_LIBRARY``); literal here so the
#: native build does not need the Python package importable.
LIBRARY = "libibshim.so"

SOURCES = ("tree.c", "verbs.c", "queries.c")

FLAGS: tuple[str, ...] = ()


def build(out_dir: Path, cc: str, extra_cflags: Sequence[str] = ()) -> list[Path]:
    """Compile the shim into ``out_dir/libibshim.so`` and return its path;
    ``extra_cflags`` serve experiments in tests (sanitizers)."""
    return build_shim(
        out_dir,
        cc,
        library=LIBRARY,
        sources=[HERE / s for s in SOURCES],
        label="native/ibshim",
        flags=FLAGS,
        extra_cflags=extra_cflags,
    )
