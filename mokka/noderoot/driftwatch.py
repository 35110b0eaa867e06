"""Telling, without looking, that nothing an owner placed has changed: inotify on its directories.

A repair pass's drift check (``Settled.holds``) is one ``lstat`` per path an
owner placed: 1,150 for an h100 node, 2,600 with 2,048 IMEX channels, each
minute, on every node.  The kernel already knows whether any of them
changed: every write, chmod, chown, rename, link or delete of an entry
raises an inotify event on the directory that holds it (and a directory's
own chmod or removal on itself).  So an owner's record, once checked by
``lstat`` right after its directories were put under watch, stays good
until an event arrives on one of them; a repair pass that finds no event
since makes no ``lstat`` at all.

The order is what makes it sound: the watches are added *first*, then the
queue is drained, then the record is checked by ``lstat``.  A change before
the drain is seen by the check; one after it is in the queue for the next
drain, which marks its directory changed.  Anything the kernel cannot
report to us makes a record be checked by ``lstat`` again, as before:
a watch that could not be added (``max_user_watches``, a filesystem
without inotify), a watch the kernel dropped (``IN_IGNORED``), an overflowed
queue (``IN_Q_OVERFLOW``: everything is checked).  Changes inotify never
reports (a write through a shared mapping, a remote filesystem's other
clients) are caught by the ``lstat`` check a record gets at least every
``RECHECK_AFTER`` seconds anyway.

Our own converges raise events too: they only make the next pass check the
records sharing those directories by ``lstat``, once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable

from mokka.noderoot.settled import Settled
from mokka.state.sources.inotify import (
    IN_ATTRIB,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Inotify,
)
from mokka.state.sources.shared_inotify import View, open_shared

logger = logging.getLogger(__name__)

#: ``IN_DONT_FOLLOW``: the directories watched are real paths; a link swapped
#: in for one since is not followed (its parent's event says it changed).
IN_DONT_FOLLOW = 0x02000000
#: Every change of an entry's content, metadata or name, and of the directory
#: itself.  ``IN_MODIFY`` as well as ``IN_CLOSE_WRITE``: a writer that keeps
#: its descriptor open has changed the file before it closes it.
MASK = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
    | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW
)
#: Seconds a record is trusted on the strength of no event: then it is
#: checked by ``lstat`` again (changes inotify does not report, see above).
RECHECK_AFTER = 600.0


def watched_directories(settled: Settled) -> frozenset[str]:
    """The directories whose events cover every entry ``settled`` checks.

    The directory holding each placed path and each bookkeeping file, and
    each directory on the way both itself (its chmod) and in its parent (its
    removal, rename or replacement).  Copied sources are outside the root
    and followed through links: those are always checked by ``stat``.
    """
    paths = [real for _artifact, real, _sig in settled.files.values()]
    paths.extend(settled.bookkeeping)
    paths.extend(settled.dirs)
    directories = {os.path.dirname(path) for path in paths}
    directories.update(settled.dirs)
    return frozenset(directories)


class DriftWatch:
    """One inotify descriptor watching the directories of the records it vouched for.

    ``holds(settled)`` is ``settled.holds(settled.wanted)`` made free when
    nothing changed: see the module docstring.  Thread-safe (the drift
    check runs in worker threads); ``close()`` releases the descriptor.
    """

    def __init__(
        self, inotify: Inotify | View, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._inotify = inotify
        self._clock = clock
        self._lock = threading.Lock()
        #: Drains so far; an event drained gets the count after its drain.
        self._stamp = 0
        #: The stamp of the last drain that brought any event at all.
        self._last_change = 0
        self._directory_of: dict[int, set[str]] = {}
        self._watch_of: dict[str, int] = {}
        #: Directory -> stamp of the drain that brought its last event.
        self._changed: dict[str, int] = {}
        #: Records checked by ``lstat``: (stamp of the drain before the
        #: check, clock then, the directories watched for them).
        self._vouched: weakref.WeakKeyDictionary[Settled, tuple[int, float, frozenset[str]]] = (
            weakref.WeakKeyDictionary()
        )
        #: Checks answered without a single ``lstat``, and checks made by ``lstat``
        #: (counters for tests and benchmarks).
        self.trusted = 0
        self.checked = 0

    @classmethod
    def open(cls) -> DriftWatch | None:
        """A new watch, or ``None`` where inotify is not available (every check by ``lstat``)."""
        try:
            return cls(open_shared(coalescing=True))
        except OSError as exc:
            logger.info("no inotify for the drift check (%s): every repair pass stats "
                        "each placed path", exc)
            return None

    def holds(self, settled: Settled) -> bool:
        """``settled.holds(settled.wanted)``: without a system call when no event says otherwise."""
        with self._lock:
            self._drain()
            vouched = self._vouched.get(settled)
            if vouched is not None and self._quiet(*vouched):
                self.trusted += 1
                return True
            self.checked += 1
            directories = watched_directories(settled) if vouched is None else vouched[2]
            watching = self._watch(directories)
            # Drained after the watches are in place and before the check:
            # any change the check cannot have seen is in the queue.
            self._drain()
            stamp, now = self._stamp, self._clock()
            if not settled.holds(settled.wanted):
                self._vouched.pop(settled, None)
                return False
            if watching:
                self._vouched[settled] = (stamp, now, directories)
            return True

    def close(self) -> None:
        """Release the descriptor (and with it every watch); idempotent."""
        with self._lock:
            self._inotify.close()
            self._directory_of.clear()
            self._watch_of.clear()
            self._vouched.clear()

    def _quiet(self, stamp: int, vouched_at: float, directories: frozenset[str]) -> bool:
        """No event on ``directories`` since drain ``stamp``, and not trusted too long."""
        if self._clock() - vouched_at > RECHECK_AFTER:
            return False
        if self._last_change <= stamp:
            return True  # no event at all since: nothing to look up
        watch_of, changed = self._watch_of, self._changed
        return all(
            directory in watch_of and changed.get(directory, 0) <= stamp
            for directory in directories
        )

    def _watch(self, directories: frozenset[str]) -> bool:
        """Watch each of ``directories``; False when any could not be (it stays unwatched).

        Added again even when the path is watched already: the kernel answers
        the same watch for the same directory, and a new one when another
        directory has been put at that path since (the old watch follows
        the old directory wherever it was moved).
        """
        every = True
        for directory in directories:
            try:
                wd = self._inotify.add_watch(directory, MASK)
            except OSError:
                self._unmap(directory)
                every = False
                continue
            if self._watch_of.get(directory) != wd:
                self._unmap(directory)
                self._watch_of[directory] = wd
                self._directory_of.setdefault(wd, set()).add(directory)
        return every

    def _unmap(self, directory: str) -> None:
        """Forget which watch ``directory`` had (the watch itself may cover another path)."""
        wd = self._watch_of.pop(directory, None)
        if wd is not None:
            self._directory_of.get(wd, set()).discard(directory)

    def _drain(self) -> None:
        """Read which watches saw events and mark their directories changed."""
        changes = self._inotify.read_changes()
        self._stamp += 1
        if not changes:
            return
        self._last_change = self._stamp
        for wd, mask in changes.items():
            if mask & IN_Q_OVERFLOW:
                # Events were lost: no record can be trusted on their absence.
                self._vouched.clear()
                continue
            directories = self._directory_of.get(wd, ())
            for directory in directories:
                self._changed[directory] = self._stamp
            if mask & IN_IGNORED:
                # The kernel dropped the watch (directory removed, filesystem
                # unmounted): its directories are unwatched from now on.
                for directory in self._directory_of.pop(wd, ()):
                    self._watch_of.pop(directory, None)
