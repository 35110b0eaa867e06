"""The daemon's C heap: one malloc arena, so the worker threads do not grow it.

glibc gives a thread that allocates an arena of its own (up to eight per
core), and an arena other than the main one seldom hands freed memory back
to the kernel.  The daemon's filesystem work runs in trio's worker threads,
which come and go (a worker exits after ten idle seconds), so every burst of
changes left its fragments in yet another arena: under a ``mokka ctl`` loop
a daemon's PSS grew from 35 to 50 MiB over 1,000 changes and kept growing
(``bench/ctl_soak.py``).  With one arena it levels off near 38 MiB.

One arena costs no contention worth the name: the threads hold the GIL
while they allocate, so they take turns anyway.  ``MALLOC_ARENA_MAX`` in
the environment is an operator's own choice and is left as it is.
"""

from __future__ import annotations

import ctypes
import logging
import os

logger = logging.getLogger(__name__)

#: ``mallopt``'s parameter for the arena limit (``M_ARENA_MAX`` in glibc's ``malloc.h``).
M_ARENA_MAX = -8

#: The environment variable glibc reads for the same limit.
ARENA_ENV = "MALLOC_ARENA_MAX"


def limit_malloc_arenas(count: int = 1) -> bool:
    """Ask the C library for at most ``count`` arenas from now on; whether it took the limit.

    Call it before the first worker thread starts: a thread keeps the arena
    it was given.  ``False`` where the operator set ``MALLOC_ARENA_MAX`` or
    the C library has no such knob (musl has no arenas to limit).
    """
    if ARENA_ENV in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    taken = mallopt(M_ARENA_MAX, count) == 1
    if not taken:
        logger.debug("the C library refused a limit of %d malloc arena(s)", count)
    return taken
