"""Mokka's private bookkeeping files: made 0600/0700, and trusted only while they still are.

The daemon (usually root) acts on what its bookkeeping says: a journal line
makes teardown delete a path, a backup makes it create a file with a
recorded mode.  So every bookkeeping directory is created 0700 and every
file 0600 whatever the umask, and before anything in one is acted on, the
file and its directory must be owned by the daemon's uid (or root) and not
writable by group or others (``check_private``); anything else is an
``UntrustedBookkeepingError`` naming the file and why.

Kept apart from ``mokka.noderoot.manifest`` (which owns what the records mean) so
that a reader that only asks what a manifest says (``mokka ctl``'s
``mokka.ctl.records``) loads none of the host's models to ask it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from mokka.errors import UntrustedBookkeepingError

#: Modes of Mokka's own bookkeeping: nobody but the daemon reads or writes it.
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def trusted_uids() -> frozenset[int]:
    """The owners bookkeeping may have: the daemon's effective uid, and root."""
    return frozenset({0, os.geteuid()})


def check_private(path: Path, st: os.stat_result, *, directory: bool) -> None:
    """Refuse bookkeeping that is not what the daemon made it: type, owner, mode.

    ``st`` comes from ``lstat`` (or ``fstat`` of a descriptor opened with
    ``O_NOFOLLOW``): a symlink standing where a journal or the manifest
    directory should be is refused too, since its target is someone's choice.
    """
    want = "a directory" if directory else "a regular file"
    is_right_type = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if not is_right_type:
        raise UntrustedBookkeepingError(
            f"{path}: Mokka bookkeeping is not {want} (a symlink or something else stands "
            "there); refusing to act on it"
        )
    if st.st_uid not in trusted_uids():
        raise UntrustedBookkeepingError(
            f"{path}: Mokka bookkeeping owned by uid {st.st_uid}, expected {_expected_owner()}; "
            "someone else could have written it, so "
            "nothing in it is acted on (check it, then fix its owner or remove it)"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        wanted = PRIVATE_DIR_MODE if directory else PRIVATE_FILE_MODE
        raise UntrustedBookkeepingError(
            f"{path}: Mokka bookkeeping has mode {stat.S_IMODE(st.st_mode):04o}, writable by "
            "group or others; someone else could have written it, so nothing in it is acted "
            f"on (check it, then chmod it {wanted:04o}"
            " or remove it)"
        )


def _expected_owner() -> str:
    euid = os.geteuid()
    return "uid 0 (root, the daemon)" if euid == 0 else f"uid {euid} (the daemon) or 0 (root)"


def check_private_dir(path: Path) -> bool:
    """Whether the bookkeeping directory ``path`` exists; refused when it is not private."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    check_private(path, st, directory=True)
    return True


def make_private_dir(path: Path) -> None:
    """Create a bookkeeping directory 0700 (whatever the umask), or check the one there."""
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        check_private_dir(path)
        return
    # mkdir honours the umask, which could only have removed bits; chmod is
    # for the record: the mode is the one the check expects, exactly.
    os.chmod(path, PRIVATE_DIR_MODE)


def write_private(path: Path, data: bytes) -> None:
    """Write a new bookkeeping file 0600; a failure (ENOSPC) leaves no partial file.

    ``O_EXCL | O_NOFOLLOW``: a name someone planted (a link to ``/etc/shadow``)
    makes the write fail instead of writing through it.
    """
    fd = os.open(
        path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE_MODE
    )
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # a failed ``write`` (ENOSPC) names no file
        raise
    os.close(fd)


def write_private_replacing(path: Path, data: bytes) -> None:
    """Write a bookkeeping file whole, replacing the one there atomically (temp and rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    write_private(tmp, data)
    os.replace(tmp, path)


def read_private(path: Path, *, dir_fd: int | None = None) -> bytes | None:
    """A bookkeeping file's content once it passed ``check_private``; ``None`` when absent.

    ``dir_fd``: the directory ``path`` sits in, already open (reached
    without following links); the file is then opened by its name there.
    """
    name = path if dir_fd is None else path.name
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            check_private(path, os.stat(name, dir_fd=dir_fd, follow_symlinks=False),
                          directory=False)
        raise
    try:
        check_private(path, os.fstat(fd), directory=False)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read()
