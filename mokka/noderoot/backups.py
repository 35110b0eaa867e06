"""Backups of what a converge replaces, and putting them back on discard.

Teardown must leave the node byte for byte as it was found, so a foreign
file, link, fifo or device node that an artifact replaces is saved first
(``save``) and restored when its owner lets the path go (``load`` then
``restore``).  Apart from ``mokka.noderoot.convergence`` because it is a trust
boundary of its own: a backup sits in the node root for as long as the
artifact does, where anyone with write access could change it, so every
record is checked to be one ``save`` could have written before any of it
is acted on, and set-id bits only come back to the user they belonged to.

Layout: ``<state>/backups/<owner>/<sha256 of the node path, 32 hex>`` holds a
regular file's bytes (its mode, owner and times in ``<name>.mode``) or, for
links, fifos and devices, a JSON record of what to make again.

A kill must never leave the only copy of a user's file where nothing
points to it, so a backup outlives every record of it: it is written
before the manifest names it (``save``, then the journal's ``add``), and
dropped only after the manifest has forgotten it (``restore``, the
journal's ``remove``, then ``drop``).  A manifest that names a backup can
therefore always restore from it, and a backup no manifest names is one
whose file is in place (never moved, or already put back): ``sweep``
removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

import attrs

from mokka.errors import HostPathError, UntrustedBookkeepingError
from mokka.layout import MOKKA_STATE_DIR as STATE_DIR
from mokka.noderoot import fsops
from mokka.noderoot.private_files import (
    check_private_dir,
    make_private_dir,
    read_private,
    write_private,
)


def owner_dir(backups: Path, owner: str, *, create: bool) -> Path | None:
    """``owner``'s private backup directory in ``backups`` (0700 like all bookkeeping).

    ``None`` when it is absent or fails the ownership checks (``create=False``).
    """
    mine = backups / owner
    if create:
        make_private_dir(backups)
        make_private_dir(mine)
        return mine
    if not check_private_dir(backups) or not check_private_dir(mine):
        return None
    return mine


def save(norm: str, real: Path, existing: os.stat_result, backups: Path, owner: str) -> str:
    """Keep a copy of a foreign entry we are about to replace; the backup's name.

    The copy is a private 0600 file whatever the original's mode: a
    setuid original must not be sitting in the backups as a second
    setuid file.  Its mode, owner and times go into the ``.mode`` record
    and come back on restore.
    """
    if stat.S_ISDIR(existing.st_mode):
        raise HostPathError(f"{norm}: a directory is in the way")
    if stat.S_ISSOCK(existing.st_mode):
        # A socket cannot be made again (its listener owns it): refuse, as
        # for a directory, rather than leave the node without it.
        raise HostPathError(f"{norm}: a socket is in the way")
    # imported here: only a converge that replaces a file someone else owns needs it
    import hashlib

    name = hashlib.sha256(norm.encode()).hexdigest()[:32]
    mine = owner_dir(backups, owner, create=True)
    assert mine is not None
    target = mine / name
    for stale in (target, mine / (name + ".mode")):
        # A killed earlier try left it (never restored: the manifest
        # did not record it yet); ours, so replaced.
        fsops.unlink(stale)
    if stat.S_ISLNK(existing.st_mode):
        meta = {"symlink": os.readlink(real)}
    elif stat.S_ISREG(existing.st_mode):
        meta = None
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            write_private(target, f.read())
        write_private(mine / (name + ".mode"), json.dumps({
            "mode": stat.S_IMODE(existing.st_mode),
            "uid": existing.st_uid,
            "gid": existing.st_gid,
            "mtime_ns": existing.st_mtime_ns,
        }).encode())
    elif stat.S_ISFIFO(existing.st_mode):
        meta = {"fifo": True, "mode": stat.S_IMODE(existing.st_mode)}
    else:
        meta = {
            "device": [os.major(existing.st_rdev), os.minor(existing.st_rdev)],
            "mode": stat.S_IMODE(existing.st_mode),
            "char": stat.S_ISCHR(existing.st_mode),
        }
    if meta is not None:
        meta.update(uid=existing.st_uid, gid=existing.st_gid)
        write_private(target, json.dumps(meta).encode())
    return name


@attrs.frozen
class Saved:
    """A checked backup: where it is, and what goes back (file content, or a link/node record)."""

    directory: Path
    path: Path
    mode_file: Path | None
    #: A regular file's bytes (its mode record is ``meta``); ``None`` for links and nodes.
    content: bytes | None
    meta: dict


def load(norm: str, name: str, backups: Path, owner: str) -> Saved:
    """A backup, read only once it passed the trust checks, and what it says checked."""
    mine = owner_dir(backups, owner, create=False)
    if mine is None:
        raise UntrustedBookkeepingError(
            f"{norm}: its backup {STATE_DIR}/backups/{owner}/{name} is missing"
        )
    saved = mine / name
    content = read_private(saved)
    if content is None:
        raise UntrustedBookkeepingError(f"{saved}: the backup of {norm} is missing")
    mode_file = mine / (name + ".mode")
    mode_record = read_private(mode_file)
    if mode_record is not None:
        meta = _checked_record(mode_file, mode_record, legacy_mode=True)
        return Saved(mine, saved, mode_file, content, meta)
    return Saved(mine, saved, None, None, _checked_record(saved, content, legacy_mode=False))


def present(name: str, backups: Path, owner: str) -> bool:
    """Whether the backup ``name`` of ``owner`` is still there (its directories checked).

    Asked of a path recorded with a backup that no longer holds our
    artifact: when the backup is gone, what stands there is the file it
    held, put back by a process killed before its record went, and it
    must be saved again before anything replaces it.
    """
    mine = owner_dir(backups, owner, create=False)
    return mine is not None and os.path.lexists(mine / name)


def restore(real: Path, saved: Saved) -> None:
    """Put a backed-up foreign file, link or device back where it was (``real`` is free).

    The backup stays: the caller drops it (``drop``) once the manifest no
    longer names it, so a kill in between leaves a record that can still
    be restored from rather than one naming a backup that is gone.  A
    restore cut short (a partial file) is undone by the next try, which
    removes the path and restores again.

    A setuid or setgid bit comes back only on a file owned by the user
    it belonged to, never on a file that would now be the daemon's.
    """
    meta = saved.meta
    if saved.content is not None:
        fd = os.open(
            real, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        with os.fdopen(fd, "wb") as f:
            f.write(saved.content)
            os.fchmod(f.fileno(), _restorable_mode(meta, _chown(f.fileno(), meta)))
        if "mtime_ns" in meta:
            os.utime(real, ns=(meta["mtime_ns"], meta["mtime_ns"]))
    elif "symlink" in meta:
        os.symlink(meta["symlink"], real)
        with contextlib.suppress(OSError, KeyError):
            os.lchown(real, meta["uid"], meta["gid"])
    elif meta.get("fifo"):
        os.mkfifo(real, 0o600)
        _restore_node_mode(real, meta)
    else:
        kind = stat.S_IFCHR if meta["char"] else stat.S_IFBLK
        os.mknod(real, kind | 0o600, os.makedev(*meta["device"]))
        _restore_node_mode(real, meta)


def drop(saved: Saved) -> None:
    """Remove a restored backup (no manifest names it any more), and its emptied directories."""
    fsops.unlink(saved.path)
    if saved.mode_file is not None:
        fsops.unlink(saved.mode_file)
    fsops.rmdir_empty_tree(saved.directory)


def sweep(backups: Path, owner: str, kept: set[str]) -> list[str]:
    """Remove ``owner``'s backups except ``kept`` (names the manifest still records).

    What a kill left between a backup and its record: a ``save`` not yet
    named by the journal (the file it copied was never replaced), or a
    restored backup not yet dropped (the file is back).  Either way its
    file stands in place, and the copy is only clutter that would keep
    the state directory from going.  Returns the names removed.  A link
    planted in place of ``backups`` is not this owner's to refuse (it may
    never have had a backup): left, unfollowed, for the leftovers to name.
    """
    if os.path.islink(backups):
        return []
    mine = owner_dir(backups, owner, create=False)
    if mine is None:
        return []
    swept = []
    for name in sorted(os.listdir(mine)):
        if name.removesuffix(".mode") in kept:
            continue
        path = mine / name
        if stat.S_ISDIR(os.lstat(path).st_mode):
            continue  # never made by ``save``: left for the leftovers report to name
        fsops.unlink(path)
        swept.append(name)
    fsops.rmdir_empty_tree(mine)
    return swept


def _checked_record(source: Path, raw: bytes, *, legacy_mode: bool) -> dict:
    """A backup record, checked to be one ``save`` could have written; else refused."""
    def refuse(problem: str) -> UntrustedBookkeepingError:
        return UntrustedBookkeepingError(f"{source}: {problem}; the backup is not restored")

    text = raw.decode(errors="replace").strip()
    if legacy_mode and text.startswith("0o"):
        # The ``.mode`` format of earlier releases: an octal mode alone.
        try:
            return {"mode": _check_mode(int(text, 8), refuse)}
        except ValueError:
            raise refuse(f"mode {text!r}, expected an octal number") from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError:
        raise refuse("not valid JSON") from None
    if not isinstance(meta, dict):
        raise refuse("expected a JSON object")
    for field in ("uid", "gid", "mtime_ns"):
        if field in meta and not (isinstance(meta[field], int) and meta[field] >= 0):
            raise refuse(f"{field} {meta[field]!r}, expected a non-negative integer")
    if legacy_mode:
        _check_mode(meta.get("mode"), refuse)
    elif "symlink" in meta:
        target = meta["symlink"]
        if not isinstance(target, str) or not target or "\x00" in target:
            raise refuse(f"symlink target {target!r}, expected a non-empty path")
    elif meta.get("fifo") is True:
        _check_mode(meta.get("mode"), refuse)
    elif "device" in meta:
        device = meta["device"]
        if not (
            isinstance(device, list) and len(device) == 2
            and all(isinstance(n, int) and 0 <= n < 1 << 20 for n in device)
            and isinstance(meta.get("char"), bool)
        ):
            raise refuse(f"device {device!r}, expected [major, minor] and 'char'")
        _check_mode(meta.get("mode"), refuse)
    else:
        raise refuse("expected a symlink, fifo or device record")
    return meta


def _check_mode(mode: object, refuse) -> int:
    if not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise refuse(f"mode {mode!r}, expected permission bits (0 to 0o7777)")
    return mode


def _chown(fd: int, meta: dict) -> int:
    """Give a restored file back to the user it belonged to, where we may; its owner now."""
    if "uid" in meta:
        with contextlib.suppress(PermissionError):
            os.fchown(fd, meta["uid"], meta["gid"])
    return os.fstat(fd).st_uid


def _restorable_mode(meta: dict, owner_now: int) -> int:
    """The recorded mode, without setuid/setgid unless the file is its original owner's again.

    A backup without an owner (the older format) gets them only as root's.
    """
    mode = meta["mode"]
    if owner_now != meta.get("uid", 0):
        mode &= ~(stat.S_ISUID | stat.S_ISGID)
    return mode


def _restore_node_mode(real: Path, meta: dict) -> None:
    """Owner, then mode (chown clears setuid bits) of a restored fifo or device node."""
    with contextlib.suppress(PermissionError, KeyError):
        os.lchown(real, meta["uid"], meta["gid"])
    os.chmod(real, _restorable_mode(meta, os.lstat(real).st_uid))
