"""The runtime overrides file: failure injection and metric pins, changed live.

What the file says (its model, validation and text) is
``mokka.state.override_doc``; this module owns the file itself.

Writers (``mokka ctl``, tests) go through ``update_overrides``: an exclusive
``flock`` on the sibling ``overrides.yaml.lock``, read, change, validate the
whole result, then write a temp file and rename it over the old one (mode
0644).  Readers never lock: a rename is atomic, so they see the old file or
the new one, never half of either.  The daemon calls ``reset_file`` at start:
runtime state does not survive a pod restart.

The file and its lock usually sit under the node root, where anyone who can
write the config directory could plant a symlink in their place.  Neither
is ever followed there: the lock is opened with ``O_NOFOLLOW`` always (it is
a file only Mokka creates), and given the ``root`` the path lies beneath,
the file, the lock and every directory on the way to them are reached from
the root without following any link (``mokka.state.reader.open_parent``).
Under the root, ``mokka ctl`` records both in the manifests of
``MANIFEST_OWNERS`` through ``Host`` before creating them, so
``mokka cleanup`` removes them after a killed daemon (``mokka.ctl.records``:
once recorded, a call rewrites the file without the host).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mokka.errors import MokkaError
from mokka.layout import temp_name
from mokka.lazylogger import LazyLogger
from mokka.state.override_doc import Overrides, parse_overrides, render
from mokka.state.reader import open_parent, read_input

logger = LazyLogger(__name__)

#: Readable by every user (``mokka ctl status``, a person inspecting the node),
#: writable only by its owner: changes go through ``update_overrides``.
FILE_MODE = 0o644
#: The ``Host`` manifest owners under which ``mokka ctl`` records the file
#: and its lock (and, shared, the directories above them) before creating
#: them; the daemon discards both when it resets the file.
MANIFEST_OWNERS = ("runtime-overrides", "runtime-overrides-lock")
#: Seconds ``reset_file`` waits for the lock before resetting without it: a
#: process that holds the lock and never lets go must not stall the daemon's
#: start or teardown (a writer holds it for milliseconds).
RESET_LOCK_TIMEOUT = 2.0


def load_overrides(path: Path, *, root: Path | None = None) -> Overrides | None:
    """The overrides at ``path``; ``None`` when the file does not exist (not an error).

    ``root``: the path is beneath that node root, so a symlink there is
    refused rather than followed (it could lead to any file on the host).
    """
    text = read_input(path, "the overrides file", optional=True, root=root)
    return None if text is None else parse_overrides(text, source=str(path))


def lock_path(path: Path) -> Path:
    """The sibling lock file, ``overrides.yaml.lock``.

    Not the overrides file itself: every write replaces that file by a
    rename, so two writers could hold locks on two different inodes.
    """
    return path.with_name(path.name + ".lock")


def open_lock(path: Path, *, root: Path | None = None, create: bool = True) -> int:
    """A descriptor of ``<path>.lock``, created if missing, never through a symlink.

    ``O_NOFOLLOW``: a planted ``overrides.yaml.lock`` symlink would otherwise
    make every writer (and the daemon, at start and at teardown) create a
    file wherever it points.  ``O_NONBLOCK`` and the ``fstat`` check: a FIFO
    or a device in its place is refused, not opened for good.  Refusals are
    ``OSError``s naming the lock file, as any failure to open it would be.
    ``root``: no directory on the way from it is followed either.
    ``create=False``: a missing lock file is a ``FileNotFoundError``, not made.
    """
    lpath = lock_path(path)
    # CLOEXEC: a lock must not outlive this process in a child it spawns
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    if create:
        flags |= os.O_CREAT
    dir_fd: int | None = None
    try:
        dir_fd, name = open_parent(lpath, root)
        fd = os.open(name, flags, FILE_MODE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, expected the lock file Mokka creates "
                          "(no link is followed: it could lead outside the node root)",
                          str(lpath)) from None
        raise
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file, expected the lock file Mokka creates",
                      str(lpath))
    return fd


def _flock(fd: int, timeout: float | None) -> bool:
    """Take the exclusive lock; ``False`` when ``timeout`` seconds passed first."""
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


#: Times ``locked`` opens the lock file again because the one it locked was
#: replaced meanwhile.  A reset replaces it once per waiter; a path that
#: never keeps naming the file just locked is someone swapping it, and
#: ``locked`` must fail saying so rather than spin on it.
RELOCK_ATTEMPTS = 100


@contextlib.contextmanager
def locked(
    path: Path, *, timeout: float | None = None, root: Path | None = None, create: bool = True
) -> Iterator[bool]:
    """Hold the exclusive ``flock`` on ``<path>.lock`` (blocking until it is ours).

    ``reset_file`` unlinks the lock file while holding it; a writer that was
    waiting then holds a lock on an unlinked inode, so it checks that the
    path still names its inode and retries otherwise (``RELOCK_ATTEMPTS``
    times at most, then an ``OSError`` naming the lock file).  With
    ``timeout``, yields ``False`` (without the lock) once that many seconds
    passed.  ``root``: see ``open_lock``.  ``create=False``: a missing lock
    file is not made; that yields ``False`` at once (no writer holds a
    lock file that does not exist).
    """
    lpath = lock_path(path)
    for _attempt in range(RELOCK_ATTEMPTS):
        try:
            fd = open_lock(path, root=root, create=create)
        except FileNotFoundError:
            if create:
                raise
            yield False
            return
        try:
            held_lock = _flock(fd, timeout)
            if not held_lock:
                logger.warning("%s: still locked after %ss, going on without the lock",
                               lpath, timeout)
                break
            held = os.fstat(fd)
            try:
                current = _lstat_beneath(lpath, root)
            except FileNotFoundError:
                current = None
            same = current is not None and (current.st_dev, current.st_ino) == (
                held.st_dev, held.st_ino)
            if same:
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    else:
        raise OSError(errno.EAGAIN, f"replaced each time it was locked ({RELOCK_ATTEMPTS} times), "
                      "expected the lock file Mokka creates to stay", str(lpath))
    try:
        yield held_lock
    finally:
        os.close(fd)


@contextlib.contextmanager
def records_locked(
    path: Path, *, timeout: float | None = None, root: Path | None = None
) -> Iterator[bool]:
    """Hold the exclusive ``flock`` on the directory ``path`` sits in (blocking until it is ours).

    One process at a time changes Mokka's records of the file and its lock.
    ``mokka ctl`` records the lock file (owner ``MANIFEST_OWNERS[1]``)
    before it exists, so that converge cannot run under the lock file's
    own ``flock``: two calls at once compacted that owner's manifest at
    once, and one failed (the other had renamed its temp snapshot away).
    The daemon holds this while it resets the file and discards both
    owners at start, so a reset never interleaves with a change either.
    The directory is the daemon's, never replaced by a writer, so unlike
    ``locked`` the lock needs no re-check.  A missing directory yields
    ``False`` at once: nothing is written there to keep apart.  ``timeout``
    and ``root`` as for ``locked``; no link beneath ``root`` is followed.
    """
    try:
        fd, _ = open_parent(path, root)
        if fd is None:
            fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    if fd is None:
        yield False
        return
    try:
        held = _flock(fd, timeout)
        if not held:
            logger.warning("%s: still locked after %ss, going on without the lock",
                           path.parent, timeout)
        yield held
    finally:
        os.close(fd)


def replace_text(path: Path, text: str, *, root: Path | None = None) -> None:
    """Replace ``path`` with ``text``: a temp file beside it, renamed over it.

    The caller holds the lock (``locked``); ``update_overrides`` does.  The
    temp file sits in the same directory because a rename is atomic only
    within one filesystem; it is ``layout.temp_name``'s dot file, so a
    listing of the config directory does not show it and removing a
    recorded file also removes one a killed writer left.  Readers (the
    daemon's file source, ``mokka ctl status``) only ever see a complete
    old or new file.  Created ``O_EXCL | O_NOFOLLOW`` and made ``FILE_MODE``
    whatever the umask; a stale one is removed first (the entry, never what
    a link there points to).  ``root``: no directory on the way from it is
    followed (``open_parent``).  No ``fsync``: the rename alone makes the
    switch atomic for readers, and the file is runtime state a restart
    resets anyway.  A failure names ``path`` and leaves the old file as it was.
    """
    dir_fd, name = open_parent(path, root)
    tmp = temp_name(name) if dir_fd is None else Path(temp_name(str(path))).name
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(tmp, flags, FILE_MODE, dir_fd=dir_fd)
        except FileExistsError:
            os.unlink(tmp, dir_fd=dir_fd)
            fd = os.open(tmp, flags, FILE_MODE, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                os.fchmod(f.fileno(), FILE_MODE)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    except OSError as exc:
        raise OSError(exc.errno or errno.EIO, exc.strerror or str(exc), str(path)) from None
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


def require_config_dir(path: Path) -> None:
    """Refuse ``path`` when the directory it would sit in is missing (``MokkaError``).

    Not something to create: a missing driver config directory almost always
    means a wrong ``--root`` or an agent that has not staged the node yet,
    and a file written there would never be read by the daemon or the
    library.  Readers (``mokka ctl status``) refuse the same way, so "no
    overrides" is only ever said of a node that could have some.
    """
    if not path.parent.is_dir():
        raise MokkaError(
            f"{path.parent}: no such directory, expected the node's driver config directory "
            "(is the node agent running with this root?)"
        )


def update_overrides(
    path: Path,
    change: Callable[[dict[str, Any]], dict[str, Any] | None],
    *,
    root: Path | None = None,
    store: Callable[[str], None] | None = None,
) -> Overrides:
    """Read-modify-write under the lock; ``change`` edits the document or returns a new one.

    The whole result is validated before anything is written (``SpecError``
    leaves the file as it was).  No update is lost to a concurrent writer.
    ``root``: the node root the file lies beneath (see the module docstring);
    ``store`` writes the new text instead of ``replace_text`` (``mokka ctl``
    passes ``Host``'s converge, which records the file before creating it).

    A missing config directory is a ``MokkaError`` (``require_config_dir``).
    """
    require_config_dir(path)
    with locked(path, root=root):
        current = load_overrides(path, root=root) or Overrides(source=str(path))
        doc = current.to_mapping()
        result = change(doc)
        doc = doc if result is None else result
        new = Overrides.from_mapping(doc, source=str(path))
        if store is None:
            replace_text(path, render(new), root=root)
        else:
            store(render(new))
        return new


def _lstat_beneath(path: Path, root: Path | None) -> os.stat_result:
    """``lstat`` of ``path``, reached without following links beneath ``root`` (if given)."""
    dir_fd, name = open_parent(path, root)
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


def _unlink_beneath(path: Path, root: Path | None) -> bool:
    """Remove the entry at ``path`` (a link itself, never its target); ``False`` if absent."""
    try:
        dir_fd, name = open_parent(path, root)
    except FileNotFoundError:
        return False
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


def reset_file(path: Path, *, root: Path | None = None) -> bool:
    """Remove the runtime content (the file and its lock file); ``True`` if there was a file.

    The daemon calls this at start: a pod restart resets runtime state, as a
    driver reload resets a real GPU's.  A missing directory is fine (nothing
    to reset yet).  ``root``: the node root the file lies beneath; no link
    on the way is followed (a directory swapped for one is an ``OSError``).
    A lock held for longer than ``RESET_LOCK_TIMEOUT`` is not waited for.

    Nothing is created: a missing lock file is not made to be taken (no
    writer holds one that does not exist), so a reset killed half way
    leaves nothing that no manifest records.  Beneath a ``root``, a
    symlink at either name is never what Mokka writes there: it is the
    user's (or planted), so it stays as it is, unfollowed, like any file
    a converge would back up and put back (the manifests of
    ``MANIFEST_OWNERS`` put back one ``mokka ctl`` replaced).  Anything
    else that is not a regular file (a FIFO, say) goes with the runtime
    state, unfollowed, and so does a link at the lock's name of a file
    outside the root (``--overrides``): a real lock file takes its place.
    """
    if not path.parent.is_dir():
        return False
    if root is not None and _is_link(path, root):
        logger.warning("%s: a symbolic link, expected the overrides file; left in place, "
                       "not followed", path)
        return False
    lpath = lock_path(path)
    lock = _lstat_or_none(lpath, root)
    planted = lock is not None and not stat.S_ISREG(lock.st_mode)
    if planted and root is not None and stat.S_ISLNK(lock.st_mode):
        # ``mokka ctl`` refuses to lock through it too: there is no writer to wait for.
        logger.warning("%s: a symbolic link, expected the lock file Mokka creates; "
                       "left in place, not followed", lpath)
        removed = _unlink_beneath(path, root)
    else:
        if planted:
            _unlink_beneath(lpath, root)
        with locked(path, timeout=RESET_LOCK_TIMEOUT, root=root, create=False):
            removed = _unlink_beneath(path, root)
            # unlink the lock while holding it: waiters notice and re-open (see ``locked``)
            _unlink_beneath(lpath, root)
    if removed:
        logger.info("reset runtime overrides %s", path)
    return removed


def _lstat_or_none(path: Path, root: Path | None) -> os.stat_result | None:
    """``_lstat_beneath``, ``None`` when nothing is there."""
    try:
        return _lstat_beneath(path, root)
    except FileNotFoundError:
        return None


def _is_link(path: Path, root: Path | None) -> bool:
    st = _lstat_or_none(path, root)
    return st is not None and stat.S_ISLNK(st.st_mode)
