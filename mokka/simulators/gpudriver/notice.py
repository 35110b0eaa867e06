"""The change notice: a counter beside the engine config that says "re-read now".

The mock NVML library maps ``layout.CONFIG_GENERATION`` (8 bytes, a
little-endian unsigned counter) read-only and shared at ``nvmlInit``, and
compares it with the value its snapshot was loaded at on every call, so a new
engine config or workload file is seen by the next call instead of within a
second (protocol: docs/engine-config.md, "Change notice").

* The gpudriver config batch creates the file, through ``Host`` like every
  other artifact (recorded, so discard and ``mokka cleanup`` remove it), and
  lists it on every stage with the bytes it has now, so converging never
  rewrites it: a rename would leave the library's mapping on the old inode.
* Whoever renamed a file the library reads into place then bumps the
  counter *in place*: one 8-byte write at offset 0 through an ``O_NOFOLLOW``
  descriptor of the resolved path.  Rename first, bump second: a reader that
  sees the new value re-reads and finds the new file.
* One lock in this process orders the config batch's converge and every
  bump, so a bump can never fall between reading the counter's bytes and
  converging them (which would write an older value by rename).

The counter is only a hint: the files stay the truth, and the library's
once-a-second stat catches anything a lost bump (a crash between rename and
bump) would miss.
"""

from __future__ import annotations

import os
import stat
import struct
import threading
from collections.abc import Iterable

from mokka import layout
from mokka.errors import HostPathError
from mokka.noderoot import Artifact, ConvergeReport, File, Host

#: The counter's size and encoding; readers only compare it for a change.
NOTICE_BYTES = 8
_FORMAT = "<Q"
#: Readable by every consumer, as the engine config is.
NOTICE_MODE = 0o644

_lock = threading.Lock()


def _open(host: Host, flags: int) -> int | None:
    """A descriptor of the counter file, or None when there is none (or no regular file)."""
    try:
        path = host.resolve(layout.CONFIG_GENERATION)
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, HostPathError):
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != NOTICE_BYTES:
        os.close(fd)
        return None
    return fd


def _current(host: Host) -> bytes:
    """The counter's bytes as they are (zero when there is no valid file yet)."""
    fd = _open(host, os.O_RDONLY)
    if fd is None:
        return bytes(NOTICE_BYTES)
    try:
        raw = os.pread(fd, NOTICE_BYTES, 0)
    finally:
        os.close(fd)
    return raw if len(raw) == NOTICE_BYTES else bytes(NOTICE_BYTES)


def _bump_locked(host: Host) -> int | None:
    fd = _open(host, os.O_RDWR)
    if fd is None:
        return None
    try:
        raw = os.pread(fd, NOTICE_BYTES, 0)
        value = struct.unpack(_FORMAT, raw)[0] if len(raw) == NOTICE_BYTES else 0
        value = (value + 1) % (1 << 64)
        os.pwrite(fd, struct.pack(_FORMAT, value), 0)
    finally:
        os.close(fd)
    return value


def bump(host: Host) -> int | None:
    """Announce a renamed file: the counter's new value, None when there is no counter.

    Blocking (call it in a worker thread).  No counter (gpudriver not staged,
    or torn down) is no error: the library's once-a-second stat still sees
    the file.
    """
    with _lock:
        return _bump_locked(host)


def converge_announced(host: Host, owner: str, artifacts: Iterable[Artifact]) -> ConvergeReport:
    """Converge the batch that holds the engine config, with the counter, then bump.

    An empty batch (discard) removes the counter with the rest.  Otherwise
    the counter is listed with its current bytes (created as zero the first
    time) and bumped after the converge when anything changed.  Blocking.
    """
    wanted = list(artifacts)
    with _lock:
        if not wanted:
            return host.converge(owner, wanted)
        counter = File(layout.CONFIG_GENERATION, _current(host), NOTICE_MODE)
        report = host.converge(owner, [*wanted, counter])
        if report.changed:
            _bump_locked(host)
            host.rewrote_in_place(owner, layout.CONFIG_GENERATION)
        return report
