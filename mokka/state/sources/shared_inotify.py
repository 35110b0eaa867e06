"""One inotify descriptor per process, shared by every watcher in it.

inotify descriptors are counted per user (``fs.inotify.max_user_instances``,
128 by default), and every program of that user on the machine draws on the
same count: the kubelet, containerd, and every node agent when many run as
one user on one machine (a kind cluster, a fleet benchmark).  A daemon has
four watchers (its input files, the fabric manager's marker, the kubelet's
socket, the drift watch); each with a descriptor of its own, a fleet of 32
used the whole count, and the rest fell back to polling on timers.  So every
watcher gets a ``View`` of one shared descriptor instead, with the
interface of ``Inotify``:

* ``add_watch`` adds to the directory's mask (``IN_MASK_ADD``: the kernel
  keeps one watch per inode and descriptor, and two watchers of one
  directory must both keep what they asked for); ``rm_watch`` removes the
  kernel's watch only when no other view still holds it.
* Events are read once and handed to the views holding their watch (an
  overflow to every view).  ``read_events`` waits for a view's own events:
  one trio system task per run waits on the descriptor for all of them;
  ``read_pending`` (the drift watch, from worker threads) reads whatever is
  queued without waiting, and wakes any view it brought events for.
* A ``coalescing`` view (the drift watch, which reads only at each resync)
  keeps which of its watches saw anything (``read_changes``), not every
  event: bounded by its watches, however busy the node is in between.
* The descriptor is opened with the first view and closed with the last.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque

import trio

from mokka.state.sources.inotify import (
    DIR_MASK,
    IN_IGNORED,
    IN_Q_OVERFLOW,
    Event,
    Inotify,
    coalesced,
)

#: ``IN_MASK_ADD``: add to the watch's mask instead of replacing it.
IN_MASK_ADD = 0x20000000


class View:
    """One watcher's share of the process's descriptor (the interface of ``Inotify``)."""

    def __init__(self, hub: _Hub, coalescing: bool = False) -> None:
        self._hub = hub
        self._queue: deque[Event] = deque()
        #: A coalescing view's watches that saw events, with their masks' union.
        self._changes: dict[int, int] | None = {} if coalescing else None
        #: The waiting task's run and its event, while one waits in ``read_events``.
        self._waiter: tuple[trio.lowlevel.TrioToken, trio.Event] | None = None
        self._closed = False

    def add_watch(self, directory: str, mask: int = DIR_MASK) -> int:
        """Watch a directory for at least ``mask``; the watch descriptor (``Inotify.add_watch``)."""
        return self._hub.add_watch(self, directory, mask)

    def rm_watch(self, wd: int) -> None:
        """Stop this view's watch ``wd`` (the kernel's goes with the last view holding it)."""
        self._hub.rm_watch(self, wd)

    def read_pending(self) -> list[Event]:
        """This view's events queued now, without waiting."""
        self._hub.pump()
        return self._take()

    def read_changes(self) -> dict[int, int]:
        """Which of this view's watches saw events since the last read (``coalesced``)."""
        self._hub.pump()
        return self._hub.take_changes(self) or coalesced(self._take())

    async def read_events(self) -> list[Event]:
        """Wait until this view has events, then return all of them."""
        while True:
            events = self._take()
            if events:
                return events
            if self._closed:
                raise trio.ClosedResourceError("the inotify view was closed")
            ready = trio.Event()
            self._waiter = (trio.lowlevel.current_trio_token(), ready)
            try:
                self._hub.ensure_reader()
                if not self._queue:  # nothing delivered since the take above
                    await ready.wait()
            finally:
                self._waiter = None

    def close(self) -> None:
        """Drop this view's watches and its share of the descriptor; idempotent."""
        if not self._closed:
            self._closed = True
            self._hub.detach(self)
            self._wake()

    def _take(self) -> list[Event]:
        events = list(self._queue)
        for _ in events:
            self._queue.popleft()
        return events

    def _wake(self) -> None:
        """Wake the task waiting in ``read_events``, from its own run's thread or any other."""
        waiter = self._waiter
        if waiter is None:
            return
        token, ready = waiter
        try:
            here = trio.lowlevel.current_trio_token()
        except RuntimeError:
            here = None
        if here is token:
            ready.set()
        else:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(ready.set)

    def __enter__(self) -> View:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Hub:
    """The process's descriptor, its views, and which views hold each watch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inotify: Inotify | None = None
        self._views: set[View] = set()
        self._holders: dict[int, set[View]] = {}
        #: The run whose system task reads the descriptor, and the descriptor
        #: it reads (a closed one's reader may still be on its way out).
        self._reader: tuple[trio.lowlevel.TrioToken, Inotify] | None = None

    def attach(self, coalescing: bool) -> View:
        with self._lock:
            if self._inotify is None:
                self._inotify = Inotify.open()  # OSError: the caller's fallback
            view = View(self, coalescing)
            self._views.add(view)
            return view

    def add_watch(self, view: View, directory: str, mask: int) -> int:
        with self._lock:
            if self._inotify is None or view not in self._views:
                raise OSError("the inotify view is closed")
            wd = self._inotify.add_watch(directory, mask | IN_MASK_ADD)
            self._holders.setdefault(wd, set()).add(view)
            return wd

    def rm_watch(self, view: View, wd: int) -> None:
        with self._lock:
            self._release(view, wd)

    def _release(self, view: View, wd: int) -> None:
        holders = self._holders.get(wd)
        if holders is None or view not in holders:
            return
        holders.discard(view)
        if not holders:
            del self._holders[wd]
            if self._inotify is not None:
                self._inotify.rm_watch(wd)

    def pump(self) -> None:
        """Read every queued event and hand each to the views holding its watch."""
        woken: set[View] = set()
        with self._lock:
            if self._inotify is None:
                return
            for event in self._inotify.read_pending():
                if event.mask & IN_Q_OVERFLOW:
                    views = set(self._views)  # events were lost: everyone must know
                else:
                    views = self._holders.get(event.wd, set())
                for view in views:
                    if view._changes is None:
                        view._queue.append(event)
                        woken.add(view)
                    else:
                        view._changes[event.wd] = view._changes.get(event.wd, 0) | event.mask
                if event.mask & IN_IGNORED:
                    self._holders.pop(event.wd, None)  # the kernel dropped the watch
        for view in woken:
            view._wake()

    def take_changes(self, view: View) -> dict[int, int]:
        """A coalescing view's changes, emptied (under the lock the pump fills them under)."""
        with self._lock:
            changes = view._changes
            if not changes:
                return {}
            view._changes = {}
            return changes

    def ensure_reader(self) -> None:
        """A system task of the current run waits on the descriptor for every view."""
        token = trio.lowlevel.current_trio_token()
        with self._lock:
            inotify = self._inotify
            if inotify is None or self._reader == (token, inotify):
                return
            reader = self._reader = (token, inotify)
        trio.lowlevel.spawn_system_task(self._read, reader)

    async def _read(self, reader: tuple[trio.lowlevel.TrioToken, Inotify]) -> None:
        _token, inotify = reader
        try:
            # Closed with its last view: told (``notify_closing``) while
            # waiting, or found closed before the next wait.
            while (fd := inotify.fileno()) >= 0:
                await trio.lowlevel.wait_readable(fd)
                self.pump()
        except (trio.ClosedResourceError, OSError):
            pass  # the descriptor was closed with its last view
        finally:
            with self._lock:
                if self._reader is reader:
                    self._reader = None

    def detach(self, view: View) -> None:
        with self._lock:
            self._views.discard(view)
            for wd in [wd for wd, holders in self._holders.items() if view in holders]:
                self._release(view, wd)
            if self._views or self._inotify is None:
                return
            inotify, self._inotify = self._inotify, None
            reader, self._reader = self._reader, None
        self._close(inotify, None if reader is None else reader[0])

    @staticmethod
    def _close(inotify: Inotify, reader: trio.lowlevel.TrioToken | None) -> None:
        """Close the descriptor; the reader task, if any, is told in its own thread first."""
        try:
            here = trio.lowlevel.current_trio_token()
        except RuntimeError:
            here = None
        if reader is None or here is reader:
            inotify.close()  # ``notify_closing`` ends the reader's wait
            return
        try:
            reader.run_sync_soon(inotify.close)
        except trio.RunFinishedError:
            inotify.close()  # its run is over: nobody waits on it


_hub = _Hub()


def open_shared(*, coalescing: bool = False) -> View:
    """A view of the process's inotify descriptor; ``OSError`` when there is none to be had."""
    return _hub.attach(coalescing)
