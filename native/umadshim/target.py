"""Build target for ``libumadshim.so``, the management-datagram LD_PRELOAD shim.

``native/build.py`` loads this file and calls ``build(out_dir, cc)``.  Plain
C against glibc: the shim turns ``open("/dev/infiniband/umad<N>")`` into a
connected ``SOCK_SEQPACKET`` socket to the node's ``mock-ib`` daemon and
answers the umad ioctls over it (``umadshim.c`` says how), so libibumad's
reads and writes need no hooks at all.  Fortification is off for the same
reason as in ``libmockfs.so``: the shim defines ``open`` and ``__open_2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from native.toolchain import build_shim

HERE = Path(__file__).resolve().parent

#: The artifact name (``mokka.native.UMADSHIM_LIBRARY``); literal here so the
#: native build does not need the Python package importable.
LIBRARY = "libumadshim.so"

SOURCES = ("umadshim.c",)

FLAGS = ("-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0")


def build(out_dir: Path, cc: str, extra_cflags: Sequence[str] = ()) -> list[Path]:
    """Compile the shim into ``out_dir/libumadshim.so`` and return its path."""
    return build_shim(
        out_dir,
        cc,
        library=LIBRARY,
        sources=[HERE / s for s in SOURCES],
        label="native/umadshim",
        flags=FLAGS,
        extra_cflags=extra_cflags,
    )
