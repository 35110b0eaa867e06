"""Removal of what an owner created before and no longer wants.

The downward half of one ``Host.converge`` call (8 → 4 GPUs removes
``nvidia4..7``; a discard removes everything): each stale manifest entry is
removed path by path, what it replaced is restored from its backup, a bind
mount a killed process left is detached, and directories are removed
deepest first while the ones wanted paths still live in stay.

Kept apart from ``mokka.noderoot.convergence``, which places what is wanted, because
removal has its own order, its own best-effort failure handling and its own
reading of which directories to keep; it works on the call's
``Convergence`` (its manifest, the paths and directories it placed) and
never imports ``mokka.noderoot.host``.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from mokka.errors import HostPathError, MokkaError
from mokka.layout import MOKKA_STATE_DIR as STATE_DIR
from mokka.layout import temp_name
from mokka.lazylogger import LazyLogger
from mokka.noderoot import backups, fsops
from mokka.noderoot.artifacts import Artifact
from mokka.noderoot.manifest import Manifest
from mokka.noderoot.paths import NodeRoot, ResolveCache

logger = LazyLogger(__name__)


class Convergence(Protocol):
    """What removal needs of one converge call (``mokka.noderoot.convergence``).

    Named here rather than imported, so the layering reads one way: the
    converge calls removal, and removal knows only this much of it.
    """

    paths: NodeRoot
    manifest: Manifest
    dirs_lock: threading.Lock
    run: Callable[..., object]
    removed: list[str]
    resolved: ResolveCache
    placed: dict[str, tuple[Artifact, str]]
    dirs: dict[str, None]

    def backups_dir(self) -> Path: ...

    def forget_directory(self, norm: str, parts: list[str]) -> None: ...

    def note_dir(self, op: str, key: str) -> None: ...

    def listed_by_other_owner(self, key: str) -> bool: ...


def remove_unwanted(work: Convergence, wanted: set[str]) -> None:
    """Remove what this owner created before but ``wanted`` no longer lists.

    Files, links and devices first, then directories deepest first, so
    directories are empty by the time they are reached (directories are
    recorded under their real paths, files under the path asked for:
    only this order holds for both); directories that wanted paths live
    in stay.

    Best effort, path by path: one path that cannot go (a busy mount, a
    permission) must not keep every later path of the owner in place, in
    every later discard too.  A failed path stays in the manifest, and so
    do its parent directories (forgotten, they would outlive it once the
    next try removes it); the failures are raised together at the end.
    """
    stale = [p for p in work.manifest.entries if p not in wanted]
    stale_dirs = [p for p in stale if work.manifest.entries[p] == "dir"]
    stale_other = [p for p in stale if work.manifest.entries[p] != "dir"]
    keep = _placed_parents(work, wanted) if stale_dirs else set()
    failures: list[str] = []
    for norm in [
        *sorted(stale_other),
        *sorted(stale_dirs, key=lambda p: (-p.count("/"), p)),
    ]:
        if norm in keep:
            continue
        try:
            _remove(work, norm)
        except (OSError, MokkaError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            failures.append(f"{norm} ({reason})")
            logger.warning("could not remove %s: %s", norm, reason)
            keep |= _real_parents(work, [norm]) | _prefixes(norm)
    if not wanted:
        try:
            _sweep_backups(work)
        except (OSError, MokkaError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            failures.append(f"{STATE_DIR}/backups/{work.manifest.owner} ({reason})")
    if failures:
        raise HostPathError(
            f"could not remove {', '.join(failures)}; kept in the manifest for the next try"
        )


def _sweep_backups(work: Convergence) -> None:
    """Remove the backups a kill left that the owner's manifest no longer names.

    Asked on a discard, the owner's last converge: its manifest then names
    only the backups of paths that could not go (``mokka.noderoot.backups.sweep``).
    """
    swept = backups.sweep(
        work.backups_dir(), work.manifest.owner, set(work.manifest.backups.values())
    )
    if swept:
        logger.info("%s: removed %d backup file(s) a killed process left (their files are in "
                    "place)", work.manifest.owner, len(swept))


def _placed_parents(work: Convergence, wanted: set[str]) -> set[str]:
    """``_real_parents(wanted)``, from the real paths this call placed: no resolving again.

    Every wanted path was placed (or found still placed) by this call
    before any removal, which noted its real path (``Convergence.placed``) and
    every real directory it made sure of (``Convergence.dirs``): their prefixes
    are exactly what resolving each wanted parent again would give.
    """
    keep: set[str] = set()
    for path in wanted:
        _add_prefixes(keep, path)
    root = len(str(work.paths.root))
    for _art, real in work.placed.values():
        _add_prefixes(keep, real[root:])
    for real in work.dirs:
        _add_prefixes(keep, real[root:])
    return keep


def _real_parents(work: Convergence, paths: Iterable[str]) -> set[str]:
    """``paths`` and every directory above them, as written and as really found."""
    logical: set[str] = set()
    for path in paths:
        logical |= _prefixes(path, inclusive=True)
    real: set[str] = set()
    for parent in logical:
        try:
            resolved = work.paths.resolve_parts(
                parent, follow_last=True, cache=work.resolved
            )
        except HostPathError:
            continue
        for i in range(1, len(resolved) + 1):
            real.add("/" + "/".join(resolved[:i]))
    return logical | real


def _remove(work: Convergence, norm: str) -> None:
    """Remove one recorded entry, restore what it replaced, and forget it."""
    kind = work.manifest.entries[norm]
    try:
        parts = work.paths.resolve_parts(norm, cache=work.resolved)
    except HostPathError:
        logger.warning(
            "manifest path %s no longer resolves inside the root; forgetting it", norm
        )
        if kind == "dir":
            with work.dirs_lock:
                work.note_dir("remove", norm)
        else:
            work.manifest.note("remove", norm)
        return
    real = work.paths.real_text(parts)
    if kind == "dir":
        # Under the directory lock: see ``Convergence._ensure_dir``.
        with work.dirs_lock:
            if work.listed_by_other_owner(norm):
                # Shared, and another owner still records it: the last owner out
                # removes it.  Empty is not enough: an owner may want the empty
                # directory itself (the fabric manager's state directory, which
                # the CDI spec mounts, outlives the marker that made it).
                work.note_dir("remove", norm)
                return
            busy = _rmdir(norm, real)
            if not busy:
                work.note_dir("remove", norm)
        if busy:
            _unmount(work, norm, real)
            with work.dirs_lock:
                if _rmdir(norm, real):
                    raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), real)
                work.note_dir("remove", norm)
        work.forget_directory(norm, parts)
        work.removed.append(norm)
        return
    backup = work.manifest.backups.get(norm)
    saved = None
    if backup:
        owner, store = work.manifest.owner, work.backups_dir()
        if not backups.present(backup, store, owner):
            _forget_restored(work, norm, real)
            return
        # Checked before anything is removed: a backup that cannot be trusted
        # leaves our file in place, recorded, rather than the node without either.
        saved = backups.load(norm, backup, store, owner)
    # A process killed between writing the temp file and renaming it
    # leaves the temp file beside the path (``WriteBatch.write``); it is ours too.
    fsops.unlink(temp_name(real))
    try:
        fsops.unlink(real)
    except IsADirectoryError:
        # Replaced by a directory since (someone made one in its place):
        # not ours any more, and what it replaced cannot go back there.
        logger.warning(
            "leaving %s in place: it is a directory now%s", norm,
            f" (the file it replaced is kept in {STATE_DIR}/backups)" if backup else "",
        )
        work.manifest.note("remove", norm)
        return
    if saved is None:
        work.manifest.note("remove", norm)
    else:
        backups.restore(Path(real), saved)
        # Forgotten on disk before the backup goes: a kill in between leaves a
        # record whose backup is still there (``mokka.noderoot.backups``).
        work.manifest.note("remove", norm, durable=True)
        backups.drop(saved)
    work.removed.append(norm)


def _forget_restored(work: Convergence, norm: str, real: str) -> None:
    """Forget a recorded path whose backup is gone: what stands there is the user's again.

    A backup goes only after the manifest forgot its path; one that is
    gone while still named was restored by a release that dropped it
    first and was killed before forgetting the path.  Whatever is there
    now is the file the backup held: it stays, and so does a path with
    nothing there (there is nothing to put back).
    """
    if os.path.lexists(real):
        logger.warning(
            "leaving %s in place: its backup is gone, so it was restored by a process killed "
            "before forgetting it", norm,
        )
    work.manifest.note("remove", norm)


def _unmount(work: Convergence, norm: str, real: str) -> None:
    """Detach what is mounted on a recorded directory that ``rmdir`` found busy.

    A bind mount we published (the driver tree at /run/nvidia/driver)
    outliving a killed process.  Asked of the mount table only once
    ``rmdir`` says EBUSY: a removal pays nothing for the check, and the
    table, unlike ``os.path.ismount``, also knows a bind mount from the
    same filesystem.  Lazy, because a consumer may still hold files open
    in it.  Anything else that keeps it busy is the caller's EBUSY.
    """
    try:
        mounted = fsops.mounted_on(real)
    except OSError as exc:
        logger.warning("could not read the mount table to free %s: %s", norm, exc)
        return
    if mounted:
        result = work.run(["umount", "--lazy", real])
        if result.returncode != 0:
            logger.warning("could not unmount %s: %s", norm, result.stderr.strip())


def _rmdir(norm: str, real: str) -> bool:
    """``rmdir`` a recorded directory; one that is not empty (or not a directory) stays.

    Returns whether it is busy (something is mounted on it); other errors raise.
    """
    try:
        os.rmdir(real)
    except OSError as exc:
        if fsops.nothing_there(exc):
            return False
        if exc.errno == errno.EBUSY:
            return True
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            # Still holds another owner's files (shared parents empty out as the
            # last owner leaves) or files Mokka never wrote: leave it.  DEBUG,
            # because during a teardown this is the common case, not news.
            logger.debug("leaving directory %s in place: it is not empty", norm)
        elif exc.errno == errno.ENOTDIR:
            # Replaced by a symlink or file since: not ours any more.
            logger.info("leaving %s in place: it is no longer a directory", norm)
        else:
            raise
    return False


def _add_prefixes(into: set[str], path: str) -> None:
    """Add ``path`` and every directory above it (``_prefixes(path, inclusive=True)``) to ``into``.

    From the end, stopping at the first one already there: its own
    prefixes were added with it, so shared parents cost one lookup.
    """
    end = len(path)
    while end > 0:
        prefix = path[:end]
        if prefix in into:
            return
        into.add(prefix)
        end = path.rfind("/", 0, end)


def _prefixes(path: str, *, inclusive: bool = False) -> set[str]:
    """The directories above a node path: ``/a/b/c`` → ``/a``, ``/a/b`` (and itself, inclusive)."""
    parts = path.strip("/").split("/")
    end = len(parts) + 1 if inclusive else len(parts)
    return {"/" + "/".join(parts[:i]) for i in range(1, end)}
