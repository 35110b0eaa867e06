"""Build target for ``libmockfs.so``, the filesystem LD_PRELOAD shim.

``native/build.py`` loads this file and calls ``build(out_dir, cc)``.  The
shim is plain C against glibc (``dlsym``, ``pthread_once``): no third-party
library, warnings are errors.  ``_FORTIFY_SOURCE`` is forced off because
the shim *defines* ``open`` and friends, which fortified headers turn into
inline wrappers; ``-fvisibility=hidden`` keeps every helper out of the
dynamic symbol table so only the hooks interpose.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from native.toolchain import build_shim

HERE = Path(__file__).resolve().parent

#: The artifact name (``mokka.native.MOCKFS_LIBRARY``); kept literal here so
#: the native build does not need the Python package importable.
LIBRARY = "libmockfs.so"

SOURCES = (
    "config.c",
    "rewrite.c",
    "confine.c",
    "hooks_open.c",
    "hooks_stat.c",
    "hooks_path.c",
    "hooks_ports.c",
)

#: The shim implements the fortified entry points itself (``__open_2``, ...);
#: building it fortified would route its own calls through them.
FLAGS = ("-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0")


def build(out_dir: Path, cc: str, extra_cflags: Sequence[str] = ()) -> list[Path]:
    """Compile the shim into ``out_dir/libmockfs.so`` and return its path;
    ``extra_cflags`` serve experiments in tests (sanitizers)."""
    return build_shim(
        out_dir,
        cc,
        library=LIBRARY,
        sources=[HERE / s for s in SOURCES],
        label="native/mockfs",
        flags=FLAGS,
        extra_cflags=extra_cflags,
    )
