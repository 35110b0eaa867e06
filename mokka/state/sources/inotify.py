"""A small trio-native inotify: libc through ctypes, no polling.

``Inotify.open()`` makes a non-blocking inotify descriptor; ``read_events``
waits for it with ``trio.lowlevel.wait_readable`` (the kernel wakes us, no
timer) and returns the parsed events.  Only what the file source needs:
watch directories, read events, drop watches, close.

Directories, not files, are watched: a ConfigMap update (the kubelet swaps
the ``..data`` symlink) and an editor's save (write a temp file, rename it
over the old one) both replace the file's inode, and a watch on the old
inode would never fire again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct

import attrs
import trio

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
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

#: What a directory watch asks for: any way a name in it can get new content.
DIR_MASK = (
    IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ATTRIB
    | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
)

_HEADER = struct.Struct("iIII")
_READ_SIZE = 64 * 1024


@attrs.frozen
class Event:
    wd: int
    mask: int
    cookie: int
    #: the name inside the watched directory; empty for events on the directory itself
    name: str


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
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
        events.append(Event(wd, mask, cookie, os.fsdecode(raw.rstrip(b"\0"))))
    return events


class Inotify:
    """One inotify descriptor; ``close()`` it (or use ``with``) when done."""

    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self._fd = fd
        self._libc = libc

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
        """Watch a directory; returns the watch descriptor (the same one for the same inode)."""
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), mask)
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_add_watch {directory}: {os.strerror(code)}")
        return wd

    def rm_watch(self, wd: int) -> None:
        # EINVAL: the kernel already dropped it (directory deleted); nothing to do
        self._libc.inotify_rm_watch(self._fd, wd)

    async def read_events(self) -> list[Event]:
        """Wait until events are queued, then return all of them."""
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            return parse_events(data)

    def close(self) -> None:
        if self._fd >= 0:
            trio.lowlevel.notify_closing(self._fd)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
