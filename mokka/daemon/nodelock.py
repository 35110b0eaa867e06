"""One daemon per node root, enforced with a lock that leaves no file behind.

Two daemons converging the same root would undo each other: the first one's
teardown discards, through the shared manifests, everything the second one
staged, and the second one would not notice (an unchanged state causes no new
pass).  That happens during a DaemonSet rolling update with ``maxSurge`` (the
new pod starts before the old one has finished its teardown) and when a local
run is started twice on one root.

The lock is ``flock`` on the root *directory* itself: no lock file is
created, so teardown still leaves the root exactly as it was, and the lock
goes away with the process however it ends (a killed pod cannot leave a stale
lock).  In the pod the root is the host's ``/`` mounted at ``/host``, the
same inode for every pod on the node, so pods exclude each other.  A daemon
that finds the lock taken logs why and waits for it: the old pod's teardown
is bounded by its ``--shutdown-timeout``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import trio

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def try_hold_node_root(root: Path) -> Iterator[bool]:
    """Hold the node root for the body if it is free; yields whether it is held.

    For ``mokka cleanup``: discarding under a live daemon would pull the
    node out from under it, so cleanup refuses instead of waiting.
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


@contextlib.asynccontextmanager
async def hold_node_root(root: Path) -> AsyncIterator[None]:
    """Hold the node root exclusively for the body; waits while another daemon holds it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning(
                "another Mokka daemon holds the node root %s; waiting for it to finish "
                "its teardown before staging anything",
                root,
            )
            # A blocking flock in a worker thread: no polling.  Abandoned on
            # cancellation (SIGTERM while waiting); the process exits anyway.
            await trio.to_thread.run_sync(
                fcntl.flock, fd, fcntl.LOCK_EX, abandon_on_cancel=True
            )
            logger.info("node root %s is free now; starting", root)
        yield
    finally:
        # Closing the descriptor releases the lock.
        os.close(fd)
