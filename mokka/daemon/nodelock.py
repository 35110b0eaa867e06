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
that finds the lock taken says whose it is (the holder's pid, from
``/proc/locks``, when the kernel tells) and waits for it: the old pod's
teardown is bounded by its ``--shutdown-timeout``.

The first daemon may remove the root on its way out (a local run removes the
``./mokka-node`` it made).  It does so while it still holds the lock
(``remove_on_exit``), so a waiter never starts on a root that is about to
vanish.  The waiter's descriptor then names a deleted directory: a lock on
it protects nothing, and every write through the path would fail.  So once
the lock is granted the waiter checks that its descriptor is still the
directory at the path, and otherwise re-creates the root (remembering that
it did, so it removes it again on exit) and locks the live directory instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import attrs
import trio

from mokka.errors import HostFaultError

logger = logging.getLogger(__name__)

#: The kernel's table of file locks (``man 5 proc``).
PROC_LOCKS = Path("/proc/locks")


@attrs.define
class HeldRoot:
    """What holding the root found out: whether this daemon had to re-create it."""

    #: The root was gone when the lock was granted (its previous holder
    #: removed it) and was made again: it is this daemon's to remove on exit.
    recreated: bool = False
    #: The lock was granted (the body ran).
    taken: bool = False


def lock_holder(root: Path, *, locks: Path = PROC_LOCKS) -> int | None:
    """The pid holding a ``flock`` on the directory ``root``; ``None`` when not knowable.

    ``/proc/locks`` names each lock's device as ``MAJOR:MINOR:INODE`` (hex
    major and minor).  A pid of another pid namespace reads as 0 or is
    absent there, and then nothing is claimed.
    """
    try:
        st = os.stat(root)
        table = locks.read_text()
    except OSError:
        return None
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        # ``N: FLOCK ADVISORY WRITE PID DEV START END``; a waiter's line has ``->``.
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue
        if fields[5] == wanted and fields[4].isdigit() and int(fields[4]) > 0:
            return int(fields[4])
    return None


def describe_holder(root: Path) -> str:
    """``another Mokka daemon (pid N)``, or without the pid when it is not knowable."""
    pid = lock_holder(root)
    return "another Mokka daemon" + ("" if pid is None else f" (pid {pid})")


@contextlib.contextmanager
def try_hold_node_root(root: Path) -> Iterator[bool]:
    """Hold the node root for the body if it is free; yields whether it is held.

    For ``mokka cleanup``: discarding under a live daemon would pull the
    node out from under it, so cleanup refuses instead of waiting.
    """
    fd = _open_dir(root)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _is_live(fd: int, root: Path) -> bool:
    """Whether ``fd`` is still the directory found at ``root``."""
    try:
        here = os.stat(root)
    except FileNotFoundError:
        return False
    there = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _open_root(root: Path, held: HeldRoot) -> int:
    """A descriptor of the root directory, made again if its previous holder removed it."""
    if not root.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        held.recreated = True
    return _open_dir(root)


def _open_dir(root: Path) -> int:
    """The root directory's descriptor (what ``flock`` locks)."""
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except PermissionError as exc:
        # An expected fault (a root this user may not enter): one line, not a traceback.
        raise HostFaultError(
            f"cannot open the node root {root}: {exc.strerror} (EACCES): "
            f"uid {os.geteuid()} may not enter it"
        ) from exc


@contextlib.asynccontextmanager
async def hold_node_root(
    root: Path,
    *,
    on_wait: Callable[[str], object] | None = None,
    remove_on_exit: bool = False,
) -> AsyncIterator[HeldRoot]:
    """Hold the node root exclusively for the body; waits while another daemon holds it.

    ``on_wait(message)`` is called while waiting (the probes report it);
    the body gets a ``HeldRoot``.  With ``remove_on_exit`` (the caller made
    the root), or when the root had to be made again, an empty root is
    removed before the lock is released.
    """
    held = HeldRoot()
    while True:
        fd = _open_root(root, held)
        try:
            await _lock(fd, root, on_wait)
        except BaseException:
            os.close(fd)
            raise
        if _is_live(fd, root):
            break
        logger.info("node root %s was removed or replaced by its previous holder; "
                    "taking the lock on the live directory", root)
        os.close(fd)
    held.taken = True
    try:
        yield held
    finally:
        if remove_on_exit or held.recreated:
            with contextlib.suppress(OSError):  # not empty: left on purpose or by a failure
                os.rmdir(root)
        # Closing the descriptor releases the lock.
        os.close(fd)


async def _lock(fd: int, root: Path, on_wait: Callable[[str], object] | None) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    message = (
        f"waiting for the node root {root}: {describe_holder(root)} holds it; "
        "nothing is staged until it has finished its teardown"
    )
    logger.warning("%s", message, extra={"root": str(root)})
    if on_wait is not None:
        on_wait(message)
    # A blocking flock in a worker thread: no polling.  Abandoned on
    # cancellation (SIGTERM while waiting); the thread ends with the process,
    # or when the lock is granted and the descriptor closed.
    await trio.to_thread.run_sync(fcntl.flock, fd, fcntl.LOCK_EX, abandon_on_cancel=True)
    logger.info("node root %s is free now; starting", root)
