"""The few filesystem operations a converge is built from, each with one meaning.

Kept apart from ``mokka.noderoot.convergence`` (what to place where) and
``mokka.noderoot.backups`` (what it replaced) because both need the same small
answers to "is anything there", "make this gone", "write all of this",
"flush the disk", and the fallback for a device node that cannot be made:
one definition each, so a fault test that replaces one replaces it for
every caller (callers reach them as ``fsops.name``, never as a copy).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import stat
from pathlib import Path

from mokka.noderoot.artifacts import CharDevice


def file_digest(path: Path) -> str:
    """sha256 of a file, read in 1 MiB chunks (libraries and binaries are megabytes)."""
    # imported here, as ctypes below: a process that only reads a node root
    # (``mokka ctl``) compares and syncs nothing
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def nothing_there(exc: OSError) -> bool:
    """Whether ``exc`` says no entry is at the path it names.

    A name longer than the filesystem allows (ENAMETOOLONG) cannot exist
    either: a recorded path whose creation failed that way (the journal
    notes a path before creating it) must not make every later removal fail.
    """
    return isinstance(exc, FileNotFoundError) or exc.errno == errno.ENAMETOOLONG


def stat_or_none(path: str | Path) -> os.stat_result | None:
    """``stat`` (links followed) or ``None`` when nothing is there."""
    try:
        return os.stat(path)
    except OSError as exc:
        if nothing_there(exc):
            return None
        raise


def lstat_or_none(path: str | Path) -> os.stat_result | None:
    """``lstat`` or ``None`` when nothing is there (the entry itself, links not followed)."""
    try:
        return os.lstat(path)
    except OSError as exc:
        if nothing_there(exc):
            return None
        raise


#: This process's mount table.
MOUNTINFO = Path("/proc/self/mountinfo")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def mounted_on(path: str | Path, mountinfo: Path = MOUNTINFO) -> bool:
    """Whether something is mounted on ``path`` in this mount namespace.

    ``os.path.ismount`` cannot tell: a bind mount from the same filesystem
    keeps the device number, so only the mount table knows.  Raises
    ``OSError`` when the table cannot be read.
    """
    real = os.path.realpath(path)
    for line in mountinfo.read_text().splitlines():
        fields = line.split(" ")
        if len(fields) > 4 and _unescape_mountinfo(fields[4]) == real:
            return True
    return False


def _unescape_mountinfo(field: str) -> str:
    """Undo mountinfo's octal escapes (``\\040`` for a space, and tab, newline, backslash)."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def read_bytes(path: str | Path) -> bytes:
    """A file's content (``Path.read_bytes`` for a path kept as a string)."""
    with open(path, "rb") as f:
        return f.read()


def unlink(path: str | Path) -> None:
    """Remove a non-directory entry; already gone is fine (discard is idempotent)."""
    try:
        os.unlink(path)
    except OSError as exc:
        if not nothing_there(exc):
            raise


def rmdir_empty_tree(path: Path) -> None:
    """Remove ``path`` and its subdirectories if, and only if, they hold no files.

    Used on Mokka's own bookkeeping directories, never on simulator output:
    a file left in them (a backup not yet restored) keeps them in place.
    """
    if not path.is_dir() or path.is_symlink():
        return
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            rmdir_empty_tree(child)
    with contextlib.suppress(OSError):
        path.rmdir()


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a full disk raises ENOSPC, naming no file)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def sync_file(path: str | Path) -> None:
    """Flush one regular file's data to disk (``fsync``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_filesystem(root: Path) -> None:
    """Flush the filesystem holding ``root`` (``syncfs``; ``sync`` where libc lacks it)."""
    syncfs = _libc_syncfs()
    if syncfs is None:
        os.sync()
        return
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if syncfs(fd) != 0:
            import ctypes  # loaded already: ``_libc_syncfs`` imported it

            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(root))
    finally:
        os.close(fd)


@functools.cache
def _libc_syncfs():
    """libc's ``syncfs`` (one filesystem, unlike ``os.sync``), or ``None`` where there is none."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


# -- device nodes without CAP_MKNOD ------------------------------------------


def placeholder(art: CharDevice) -> bytes:
    """Content of the regular file standing in for a device node without CAP_MKNOD.

    Recognisable, so a later converge with the capability replaces it and a
    later one without it leaves it (and reports it degraded again).
    """
    return f"mokka placeholder for character device {art.major}:{art.minor}\n".encode()


def placeholder_reason(art: CharDevice) -> str:
    """The readiness reason a placeholder device produces: what, why, and the fix."""
    return (
        f"{art.path}: no CAP_MKNOD, wrote a placeholder file instead of char device "
        f"{art.major}:{art.minor}; consumers cannot open it (run as root to get real nodes)"
    )


#: ``can_mknod``'s answer once probed (a process's capabilities do not change).
_MKNOD_PROBE: bool | None = None


def can_mknod(scratch: Path) -> bool:
    """Whether this process may create device nodes (probed once per process).

    The probe node goes in ``scratch`` (Mokka's state directory under the
    node root, which exists during every converge): nothing is written
    outside the root, and a read-only ``/tmp`` does not break the probe.
    """
    global _MKNOD_PROBE
    if _MKNOD_PROBE is None:
        import tempfile  # only here: most processes never probe

        with tempfile.TemporaryDirectory(dir=scratch, prefix=".mknod-probe-") as d:
            try:
                os.mknod(os.path.join(d, "probe"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
                _MKNOD_PROBE = True
            except PermissionError:
                _MKNOD_PROBE = False
    return _MKNOD_PROBE
