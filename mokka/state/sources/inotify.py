"""A small trio-native inotify: libc through ctypes, no polling.

``Inotify.open()`` makes a non-blocking inotify descriptor; ``read_events``
waits for it with ``trio.lowlevel.wait_readable`` (the kernel wakes us, no
timer) and returns the parsed events.  Only what the file source needs:
watch directories, read events, drop watches, close.

Directories, not files, are watched: a ConfigMap update (the kubelet swaps
the ``..data`` symlink) and an editor's save (write a temp file, rename it
over the old one) both replace the file's inode, and a watch on the old
inode would never fire again.

ctypes rather than a third-party binding: the file source needs three
system calls and one fixed-layout record, and ``wait_readable`` already
makes the descriptor trio-native.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import struct

import attrs
import trio

# Event bits from <sys/inotify.h>.
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
# inotify_init1 flags: O_NONBLOCK and O_CLOEXEC, the asm-generic values that
# x86_64 and arm64 share (a few other architectures differ).
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

#: What a directory watch asks for: any way a name in it can get new content.
#: ``IN_CLOSE_WRITE`` rather than ``IN_MODIFY``: an in-place save fires
#: MODIFY per ``write()``, and reading then would catch half a file.  CREATE,
#: DELETE and the MOVEs cover renames and symlink swaps (the kubelet's
#: ``..data``); ATTRIB a chmod; the SELF bits the watched directory itself
#: going away; ``IN_ONLYDIR`` makes a watch on a non-directory fail at once.
DIR_MASK = (
    IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ATTRIB
    | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
)

#: ``struct inotify_event`` without its name: ``int wd; uint32 mask, cookie,
#: len``, native byte order (16 bytes); ``len`` bytes of name follow.
_HEADER = struct.Struct("iIII")
#: One read's buffer.  The kernel hands out whole events only (and fails with
#: EINVAL if the next one does not fit); one event is at most 16 + 256 bytes,
#: so 64 KiB drains hundreds of events per wakeup.
_READ_SIZE = 64 * 1024


@attrs.frozen
class Event:
    """One inotify event, as the kernel reported it."""

    #: the watch descriptor ``add_watch`` returned for the directory
    wd: int
    #: ``IN_*`` bits
    mask: int
    #: pairs an ``IN_MOVED_FROM`` with its ``IN_MOVED_TO`` (0 otherwise)
    cookie: int
    #: the name inside the watched directory; empty for events on the directory itself
    name: str


@functools.cache
def _libc() -> ctypes.CDLL:
    """libc with the inotify prototypes declared; ``use_errno`` so failures can say why.

    The process's own symbols (``CDLL(None)``), where libc already is:
    looking libc up by name (``ctypes.util.find_library``) runs
    ``ldconfig``, a process per daemon start.  Once per process: several
    watchers open descriptors.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def parse_events(data: bytes) -> list[Event]:
    """Split a ``read()`` of the inotify descriptor into events."""
    events: list[Event] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        wd, mask, cookie, length = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        raw = data[offset : offset + length]
        offset += length
        # ``len`` counts NUL padding up to an alignment boundary; fsdecode maps
        # bytes that are not UTF-8 to surrogates, so any name round-trips
        events.append(Event(wd, mask, cookie, os.fsdecode(raw.rstrip(b"\0"))))
    return events


def coalesced(events: list[Event], into: dict[int, int] | None = None) -> dict[int, int]:
    """``events`` as watch descriptor -> the union of their masks (``into``, updated).

    For a reader that only asks which watches saw anything (the drift
    watch): bounded by the number of watches, however many events.  An
    overflow is under its own descriptor, -1.
    """
    changes = {} if into is None else into
    for event in events:
        changes[event.wd] = changes.get(event.wd, 0) | event.mask
    return changes


class Inotify:
    """One inotify descriptor; ``close()`` it (or use ``with``) when done.

    ``add_watch`` and ``rm_watch`` are plain system calls and may run in a
    worker thread (the file source re-plans its watches there) while a trio
    task waits in ``read_events``.
    """

    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self._fd = fd
        self._libc = libc

    def fileno(self) -> int:
        """The descriptor (-1 once closed)."""
        return self._fd

    @classmethod
    def open(cls) -> Inotify:
        """Raises ``OSError`` when inotify is unavailable (ENOSYS, EMFILE, a seccomp filter)."""
        libc = _libc()
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        return cls(fd, libc)

    def add_watch(self, directory: str, mask: int = DIR_MASK) -> int:
        """Watch a directory; returns the watch descriptor (the same one for the same inode).

        Watching an inode again replaces its mask rather than adding to it;
        the file source always passes the same mask, so that is harmless.
        Raises ``OSError`` (ENOENT, ENOTDIR, ENOSPC when ``max_user_watches``
        is exhausted).
        """
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), mask)
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_add_watch {directory}: {os.strerror(code)}")
        return wd

    def rm_watch(self, wd: int) -> None:
        """Stop watching ``wd``; the kernel then queues an ``IN_IGNORED`` for it."""
        # EINVAL: the kernel already dropped it (directory deleted); nothing to do
        self._libc.inotify_rm_watch(self._fd, wd)

    async def read_events(self) -> list[Event]:
        """Wait until events are queued, then return all of them."""
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                # a wakeup with nothing to read (spurious, or already drained)
                continue
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            return parse_events(data)

    def read_changes(self) -> dict[int, int]:
        """The events queued now, without waiting, as ``coalesced``."""
        return coalesced(self.read_pending())

    def read_pending(self) -> list[Event]:
        """Every event queued now, without waiting (an empty list when there is none)."""
        events: list[Event] = []
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return events
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            events.extend(parse_events(data))

    def close(self) -> None:
        """Close the descriptor; idempotent.

        ``notify_closing`` first: a task waiting in ``read_events`` gets
        ``ClosedResourceError`` instead of waiting on a number the next
        ``open()`` may reuse.  Outside trio (a descriptor only ever read
        with ``read_pending``) there is no such task to tell.
        """
        if self._fd >= 0:
            with contextlib.suppress(RuntimeError):  # not in trio: nobody waits on it
                trio.lowlevel.notify_closing(self._fd)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
