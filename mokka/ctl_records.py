"""A ``mokka ctl`` call whose files are already recorded: rewrite, without the host.

A writing call records the overrides file and its lock in the manifests of
``overrides.MANIFEST_OWNERS`` before creating them (``mokka.ctl.change``),
through ``Host``, so that ``mokka cleanup`` removes them after a killed
daemon.  Those records stay until the daemon resets the file (at its start
and stop, under the same turn, ``overrides.records_locked``), and while
they stay a later call changes only the file's text: what cleanup must
remove is already written down.  Such a call need not load the host's
bookkeeping (about a third of a call's imports, and attrs with it):
``already_recorded`` reads the two snapshots as the host would trust them,
and ``rewrite`` replaces the file as a converge would, by a temp file
beside it (``noderoot.temp_name``, the name a removal also clears) renamed
over it.

Anything short of the plain case (no snapshot, a journal a killed call
left, a record of anything more, a bookkeeping file that is not private,
a link on the way) answers "not recorded", and the call takes the host's
way, which reports or repairs it.  Both run under the caller's
``records_locked``: a reset cannot come between the check and the write.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

from mokka import layout
from mokka.errors import UntrustedBookkeepingError
from mokka.noderoot import temp_name
from mokka.private_files import check_private, read_private
from mokka.state.overrides import FILE_MODE, MANIFEST_OWNERS, lock_path
from mokka.state.reader import open_parent

#: Where ``Host`` keeps the owners' manifests (``StateDir``), as a node path.
MANIFESTS = f"{layout.MOKKA_STATE_DIR}/manifests"
#: Each owner's one file, created by Mokka (the snapshot must say so): a
#: converge of the owner also records the directories above the file that
#: it shares with their maker, and nothing else.
RECORDED = dict(zip(
    MANIFEST_OWNERS, (layout.OVERRIDES, lock_path(Path(layout.OVERRIDES)).as_posix()),
    strict=True,
))
#: Files beside a snapshot that mean a converge did not finish (``Manifest``).
_UNFINISHED = (".journal", ".json.tmp")


def already_recorded(root: Path) -> bool:
    """Whether both owners' snapshots record their one file and nothing else, trusted."""
    manifests = root / MANIFESTS.lstrip("/")
    try:
        # the directory the snapshots sit in, reached from the root without a link
        dir_fd, _ = open_parent(manifests / f"{MANIFEST_OWNERS[0]}.json", root)
    except OSError:
        return False  # no manifests yet, or a link on the way: the host's way decides
    assert dir_fd is not None
    try:
        check_private(manifests, os.fstat(dir_fd), directory=True)
        return all(_records(manifests, dir_fd, owner, path) for owner, path in RECORDED.items())
    except (OSError, UntrustedBookkeepingError):
        return False
    finally:
        os.close(dir_fd)


def _records(manifests: Path, dir_fd: int, owner: str, node_path: str) -> bool:
    """Whether ``owner``'s snapshot, and nothing unfinished, records ``node_path`` as the host
    would leave it: the file, maybe directories above it, and no backup."""
    for suffix in _UNFINISHED:
        try:
            os.stat(owner + suffix, dir_fd=dir_fd, follow_symlinks=False)
            return False
        except FileNotFoundError:
            pass
    raw = read_private(manifests / f"{owner}.json", dir_fd=dir_fd)
    try:
        data = json.loads(raw) if raw is not None else None
    except ValueError:  # not JSON, or not UTF-8: the host's way refuses it, naming the file
        return False
    if not isinstance(data, dict) or data.get("backups") != {} or set(data) != {
            "entries", "backups"}:
        return False
    entries = data["entries"]
    above = {node_path.rsplit("/", n)[0] for n in range(1, node_path.count("/"))}
    return isinstance(entries, dict) and entries.get(node_path) == "file" and all(
        path == node_path or (kind == "dir" and path in above) for path, kind in entries.items())


def rewrite(path: Path, text: str, root: Path) -> None:
    """Replace the recorded file ``path`` beneath ``root`` with ``text``; no link is followed.

    The temp file is created ``O_EXCL | O_NOFOLLOW`` beside the file, made
    ``FILE_MODE`` whatever the umask, then renamed over it.  One a killed
    call left is removed first (the name is ``temp_name``'s, so cleanup
    would have removed it too).  No ``fsync``: the file is runtime state a
    restart resets, as for ``overrides.write_overrides``.  A failure names
    ``path`` and leaves the old file as it was.
    """
    dir_fd, name = open_parent(path, root)
    assert dir_fd is not None
    tmp = Path(temp_name(str(path))).name
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(tmp, flags, FILE_MODE, dir_fd=dir_fd)
        except FileExistsError:
            os.unlink(tmp, dir_fd=dir_fd)  # the entry itself: a link is not followed
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
        os.close(dir_fd)
