"""One ``Host.converge`` call's work: create, compare, back up, remove.

``mokka.noderoot.host`` decides *where* (paths resolved beneath the root, the
manifest directory, locking); this module does the filesystem work of one
call, for one owner, with that owner's manifest: it places each wanted
artifact (untouched when it already matches, backed up when it replaces
something foreign), records every creation before it happens, and removes
what the owner created earlier but no longer wants.

Regular files are written to temp names and renamed over their paths only
after one filesystem sync for the whole batch (``WriteBatch.commit``: the durability
argument is there).  What a successful call leaves is returned as a
``Settled`` record, the next call's starting point for the same owner.

What this module leans on lives beside it, one concern each: the
filesystem primitives (``mokka.noderoot.fsops``), the backups of what a placement
replaces and their restore (``mokka.noderoot.backups``), the removal of what the
owner no longer wants (``mokka.noderoot.removal``), and the record of a settled
owner (``mokka.noderoot.settled``).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import attrs

from mokka.errors import HostPathError
from mokka.layout import MOKKA_STATE_DIR as STATE_DIR
from mokka.lazylogger import LazyLogger
from mokka.noderoot import backups, fsops, removal
from mokka.noderoot.artifacts import (
    Artifact,
    CharDevice,
    ConvergeReport,
    CopyOf,
    Directory,
    File,
    Symlink,
)
from mokka.noderoot.manifest import Manifest
from mokka.noderoot.paths import NodeRoot, ResolveCache
from mokka.noderoot.settled import Settled, signature
from mokka.noderoot.shared_dirs import OwnerListings
from mokka.noderoot.writebatch import WriteBatch

logger = LazyLogger(__name__)


@attrs.define(eq=False)
class Convergence:
    """One converge call's bookkeeping (kept out of ``Host`` to keep it stateless).

    Given what it needs from the host rather than the host itself (the
    path mapping, the directory lock, where the bookkeeping lives, the
    command runner), so this module never imports ``mokka.noderoot.host``.
    """

    paths: NodeRoot
    manifest: Manifest
    #: The host's directory lock (see ``_ensure_dir``).
    dirs_lock: threading.Lock
    #: The host's disk turn, held for this call (``Host.disk_turn``): let go
    #: while ``WriteBatch.commit`` waits for the disk, so another converge works meanwhile.
    disk_turn: threading.RLock
    #: What other owners' bookkeeping says of directories (``mokka.noderoot.shared_dirs``;
    #: the host's, asked under ``dirs_lock``).
    listings: OwnerListings
    #: Where every owner's manifest lives (read for shared directories).
    manifest_dir: Path
    #: Mokka's private state directory (scratch for the device-node probe).
    state_dir: Path
    #: Runs a host command (``umount`` of a bind mount a killed process left).
    run: Callable[..., object]
    created: list[str] = attrs.field(factory=list)
    updated: list[str] = attrs.field(factory=list)
    removed: list[str] = attrs.field(factory=list)
    degraded: list[str] = attrs.field(factory=list)
    #: Directories already looked up in other owners' manifests by this call.
    _shared_checked: set[str] = attrs.field(factory=set)
    #: ``listed_by_other_owner``'s reading: (other converges' directory notes
    #: when it was taken, every directory the other owners record).
    _others: tuple[int, frozenset[str]] | None = attrs.field(default=None)
    #: Directory records this call noted (``note_dir``).
    _own_dir_notes: int = attrs.field(default=0)
    #: Directories this call resolved (``NodeRoot.resolve``'s cache) and
    #: made sure of (``ensure_parents``): each is looked at once per call.
    resolved: ResolveCache = attrs.field(factory=dict)
    _ensured: set[str] = attrs.field(factory=set)
    #: Real directories this call made (``mkdir``): what lies in one is only what
    #: this call put there, so ``place`` need not look before writing (see there).
    _made: set[str] = attrs.field(factory=set)
    #: Its writes: temp files renamed over their paths (``mokka.noderoot.writebatch``).
    batch: WriteBatch = attrs.field(init=False)
    #: What the owner's last converge left (``Settled``): entries it finds
    #: unchanged are kept without being looked at again.
    previous: Settled | None = None
    #: What this call placed (node path -> artifact, real path) and the real
    #: directories it made sure of: what the next call's ``previous`` records,
    #: and what ``mokka.noderoot.removal`` keeps.
    placed: dict[str, tuple[Artifact, str]] = attrs.field(factory=dict)
    dirs: dict[str, None] = attrs.field(factory=dict)
    #: Directories of ``previous`` found to be the same ones again (node path -> bool).
    _same_dirs: dict[str, bool] = attrs.field(factory=dict)
    #: Entries found exactly as ``previous`` left them, with the signature just
    #: checked: the record this call leaves takes it instead of an ``lstat`` more.
    _kept: dict[str, tuple] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        self.batch = WriteBatch(
            self.paths.root, self.disk_turn, self.degraded, before_create=self.manifest.flush
        )

    def resolve(self, path: str, *, follow_last: bool = False) -> Path:
        """A node path beneath the root, through this call's cache (``resolved``)."""
        return self.paths.resolve(path, follow_last=follow_last, cache=self.resolved)

    def forget_directory(self, norm: str, parts: list[str]) -> None:
        """Drop what this call knows of one directory it removed (``norm``, real ``parts``)
        and of anything beneath it, however it was reached (a link on the way included)."""
        gone, count = tuple(parts), len(parts)
        if not count:
            self.forget_directories()
            return
        last = gone[-1]
        for key in [k for k, real in self.resolved.items()
                    if len(real) >= count and real[count - 1] == last and real[:count] == gone]:
            del self.resolved[key]
        beneath = norm + "/"
        self._ensured = {k for k in self._ensured if k != norm and not k.startswith(beneath)}
        real = self.paths.real_text(parts)
        self._made = {k for k in self._made if k != real and not k.startswith(real + "/")}
        for key in [k for k in self._same_dirs if k == norm or k.startswith(beneath)]:
            del self._same_dirs[key]

    def forget_directories(self) -> None:
        """Drop what this call knows of directories: one was removed, or went away."""
        self.resolved.clear()
        self._ensured.clear()
        self._made.clear()
        self._same_dirs.clear()

    def settled(self, wanted: list[Artifact]) -> Settled:
        """The record of this (successful) call that the owner's next one starts from."""
        kept = self._kept
        files = {norm: (art, real, kept[norm] if norm in kept else signature(real, os.lstat))
                 for norm, (art, real) in self.placed.items()}
        dirs = {real: signature(real, os.lstat) for real in self.dirs}
        sources = {str(art.source): None for art in wanted if isinstance(art, CopyOf)}
        books = (str(self.manifest.snapshot_path), str(self.manifest.journal_path))
        return Settled(
            wanted=wanted,
            files=files,
            dirs=dirs,
            sources={p: signature(p, os.stat) for p in sources},
            bookkeeping={p: signature(p, os.lstat) for p in books},
            degraded=tuple(self.degraded),
        )

    def _still_placed(self, art: Artifact, norm: str) -> bool:
        """Whether ``norm`` is exactly as the previous call left it, the same ``art`` asked.

        Only for paths without a link on the way (real path = node path under
        the root): then every directory above is checked to be the same
        directory (device, inode, type; ``lstat``), and the entry to have the
        same signature (``Settled``), so resolving, reading and comparing it
        again could only find what ``place`` would leave alone.
        """
        previous = self.previous
        assert previous is not None
        before = previous.files.get(norm)
        if before is None or before[0] != art:
            return False
        real = str(self.paths.root) + norm
        if before[1] != real or before[2] is None:
            return False
        if isinstance(art, CharDevice) and not stat.S_ISCHR(before[2][2]):
            return False  # a placeholder: its converge reports it degraded
        if isinstance(art, CopyOf) and previous.sources.get(str(art.source)) != signature(
            str(art.source), os.stat
        ):
            return False
        parent = norm.rpartition("/")[0]
        if parent and not self._same_dir(parent, previous):
            return False
        if signature(real, os.lstat) != before[2]:
            return False
        self.placed[norm] = (art, real)
        self._kept[norm] = before[2]
        return True

    def _same_dir(self, directory: str, previous: Settled) -> bool:
        """Whether ``directory`` and every one above it are the ones ``previous`` recorded
        (device, inode, type); each is looked at once per call."""
        same = self._same_dirs.get(directory)
        if same is None:
            parent = directory.rpartition("/")[0]
            real_dir = str(self.paths.root) + directory
            was = previous.dirs.get(real_dir)
            same = was is not None and (not parent or self._same_dir(parent, previous))
            if same:
                now = signature(real_dir, os.lstat)
                same = now is not None and now[:3] == was[:3]
            self._same_dirs[directory] = same
            if same:
                self.dirs[real_dir] = None
        return same

    def report(self) -> ConvergeReport:
        """The frozen summary of this converge for the caller's logs and readiness."""
        return ConvergeReport(
            created=tuple(self.created),
            updated=tuple(self.updated),
            removed=tuple(self.removed),
            degraded=tuple(self.degraded),
        )

    # -- creation ------------------------------------------------------

    def put(self, art: Artifact, norm: str) -> None:
        """``ensure_parents`` and ``place``, again if another owner removed a parent meanwhile.

        Owners converge concurrently (sibling batches, simulators of one
        Stage wave) and share parent directories.  An owner that no longer
        wants a directory removes it once it is empty, which it may be for
        a moment while this converge is about to fill it: the parent is
        then gone under the next ``mkdir`` or temp file.  Nothing is wrong
        with either converge, so the placement is simply done again (the
        parents are re-created, and recorded as this owner's); only a
        missing parent is retried, any other error is raised at once.
        """
        if self.previous is not None and self._still_placed(art, norm):
            return
        for attempt in range(1, _PLACE_ATTEMPTS + 1):
            try:
                self.ensure_parents(norm)
                self.place(art, norm)
                return
            except OSError as exc:
                if exc.filename is None:
                    # A failed ``write`` (ENOSPC) names no file: this one it was.
                    exc.filename = str(self.paths.root / norm.lstrip("/"))
                if not isinstance(exc, FileNotFoundError):
                    raise
                source = str(art.source) if isinstance(art, CopyOf) else None
                if attempt == _PLACE_ATTEMPTS or exc.filename == source:
                    raise
            except _ParentVanished as exc:
                if attempt == _PLACE_ATTEMPTS:
                    raise HostPathError(str(exc)) from None
            self.forget_directories()
            logger.debug("%s: a parent directory went away while placing it; again", norm)

    def ensure_parents(self, norm: str) -> None:
        """Create (and record) every missing parent directory of ``norm``, top down."""
        if norm.rpartition("/")[0] in self._ensured:
            return  # ensured top down: every directory above it was, too
        parts = norm.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[:i])
            if parent not in self._ensured:
                self._ensure_dir(parent, 0o755, explicit=False)
                self._ensured.add(parent)

    def _ensure_dir(self, norm: str, mode: int, *, explicit: bool) -> None:
        """Make ``norm`` a directory, recording it if created (or shared with its creator).

        ``explicit``: asked for as a ``Directory`` artifact, so its mode is
        managed too; implicit parents keep whatever mode they have.

        The directory is recorded under its *real* path beneath the root
        (``/run`` for ``/var/run`` when ``var/run`` links to ``/run``), the
        one ``rmdir`` must name on discard: recorded as ``/var/run``, the
        link would be met instead and the directory left behind.

        Held under the host's directory lock, like the removal of a
        recorded directory: "exists, so is it another owner's to share?"
        and "empty, so remove it and forget it" must not interleave, or both
        owners can forget a directory that is still there.  A parent that
        went away (removed before this call took the lock) raises
        ``_ParentVanished`` for ``put`` to try again.
        """
        parts = self.paths.resolve_parts(norm, follow_last=True, cache=self.resolved)
        if not parts:
            return  # a link to the root itself: the root is never an owner's
        real = self.paths.real_text(parts)
        key = self.paths.node_path(real)
        self.dirs[real] = None
        with self.dirs_lock:
            existing = fsops.stat_or_none(real)
            if existing is not None and not stat.S_ISDIR(existing.st_mode):
                raise HostPathError(f"{norm}: exists and is not a directory")
            if existing is None:
                if not os.path.isdir(os.path.dirname(real)):
                    if os.path.islink(self.resolve(norm)):
                        # ``norm`` is a symlink whose (re-rooted) target's parent is
                        # missing: refuse before noting, so the manifest never lists
                        # a path that is really a symlink.
                        raise HostPathError(
                            f"{norm}: a symlink to {key.lstrip('/')} "
                            "under the node root, whose parent directory does not exist"
                        )
                    raise _ParentVanished(f"{norm}: its parent directory was removed meanwhile")
                self.note_dir("add", key)
                try:
                    os.mkdir(real, mode)
                    # mkdir honours the umask; the mode we asked for is what we mean
                    os.chmod(real, mode)
                except FileExistsError:
                    # Made by someone outside this host meanwhile: noted, so shared.
                    if not os.path.isdir(real):
                        if not os.path.lexists(real):
                            raise _ParentVanished(f"{norm}: removed meanwhile") from None
                        raise HostPathError(f"{norm}: exists and is not a directory") from None
                    return
                except FileNotFoundError:
                    raise _ParentVanished(
                        f"{norm}: it or its parent directory was removed meanwhile"
                    ) from None
                self.created.append(key)
                self._made.add(real)
                # Made by this call: what lies beneath resolves from here, as
                # from a directory the walk found (``NodeRoot.resolve``).
                self.resolved[norm[1:]] = tuple(parts)
                return
            if key not in self.manifest.entries and self._listed_by_other_owner(key):
                # Another owner created it (a sibling batch, another simulator):
                # share it, so whichever owner leaves last removes it.  Without
                # this, discarding the creator first leaves it behind.
                self.note_dir("add", key)
        if (
            explicit
            and key in self.manifest.entries
            and stat.S_IMODE(os.stat(real).st_mode) != mode
        ):
            os.chmod(real, mode)
            self.updated.append(key)

    def _listed_by_other_owner(self, key: str) -> bool:
        """Whether another owner records ``key`` as a directory, read now (sharing asks
        this once per call: a directory found again later in the call is the same answer)."""
        if key in self._shared_checked:
            return False
        self._shared_checked.add(key)
        return self.listings.listed_by_any(self.manifest_dir, self.manifest.owner, key)

    def note_dir(self, op: str, key: str) -> None:
        """Journal ``op`` (``add``, ``remove``) on directory ``key``, and count it for the
        other converges' readings (``listed_by_other_owner``).  Under ``dirs_lock``."""
        if op == "add":
            self.manifest.note("add", key, "dir")
        else:
            self.manifest.note(op, key)
        self.listings.notes += 1
        self._own_dir_notes += 1

    def listed_by_other_owner(self, key: str) -> bool:
        """Whether another owner still records directory ``key`` (asked before removing it).

        One reading of every other owner's bookkeeping (``OwnerListings.listed``)
        answers every directory of this call's removals, until a converge of
        another owner in this process notes a directory: reading it again per
        directory made an 8 -> 4 GPU change 15 % slower.  Under ``dirs_lock``,
        where every such note is made.
        """
        others = self.listings.notes - self._own_dir_notes
        if self._others is None or self._others[0] != others:
            self._others = (others, self.listings.listed(self.manifest_dir, self.manifest.owner))
        return key in self._others[1]

    def place(self, art: Artifact, norm: str) -> None:
        """Create or update one artifact; untouched when it already matches.

        The manifest entry is written *before* the filesystem changes, so a
        process killed in between leaves a record rather than an orphan.  A
        pre-existing entry that is not ours is backed up first.
        """
        if isinstance(art, Directory):
            self._ensure_dir(norm, art.mode, explicit=True)
            return
        real = self.paths.real_text(self.paths.resolve_parts(norm, cache=self.resolved))
        self.placed[norm] = (art, real)
        self._kept.pop(norm, None)
        # In a directory this call made, nothing is there to compare or back up:
        # the call holds the host's disk turn from the ``mkdir`` until ``commit``,
        # so no other converge of this process has written there meanwhile (a
        # cold pass looks up a thousand paths fewer).
        fresh = real.rpartition("/")[0] in self._made
        existing = None if fresh else fsops.lstat_or_none(real)
        if existing is not None and self._matches(art, real, existing):
            if norm not in self.manifest.entries:
                # Identical content placed by someone else: adopt nothing, touch nothing.
                pass
            return
        kind = _kind(art)
        # A regular file's temp file is made at the batch's commit, which writes
        # the records held till then first (one ``write`` for the batch's files).
        # Not a record naming a backup made now: that file exists already.
        held = kind == "file"
        if existing is not None and (
            norm not in self.manifest.entries or self._backup_lost(norm)
        ):
            backup = backups.save(
                norm, Path(real), existing, self.backups_dir(), self.manifest.owner
            )
            self.manifest.note("add", norm, kind, backup=backup)
        elif norm not in self.manifest.entries:
            self.manifest.note("add", norm, kind, held=held)
        elif self.manifest.entries[norm] != kind:
            self.manifest.note("add", norm, kind, held=held,
                               backup=self.manifest.backups.get(norm, ""))
        (self.updated if existing is not None else self.created).append(norm)
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            # It cannot be renamed over; refused before a temp file exists.
            raise HostPathError(f"{real}: a directory is in the way")
        self.batch.write(art, real)

    def _backup_lost(self, norm: str) -> bool:
        """Whether ``norm`` is recorded with a backup that is gone (``backups.present``).

        Then what stands there is the file that backup held, put back by
        a process killed before it forgot the path: it is backed up again
        before it is replaced, never overwritten without a copy.
        """
        name = self.manifest.backups.get(norm)
        return bool(name) and not backups.present(name, self.backups_dir(), self.manifest.owner)

    def backups_dir(self) -> Path:
        """Where backups live beneath the root (``backups`` keeps one directory per owner).

        Not followed if it is a link: bookkeeping is a private directory of
        Mokka's, and a link there is refused where it is met (``check_private``)
        rather than written or read through.
        """
        return self.resolve(STATE_DIR + "/backups")

    def _matches(self, art: Artifact, real: str, st: os.stat_result) -> bool:
        """Whether the entry on disk already is ``art`` (content, target, device, mode)."""
        if isinstance(art, Symlink):
            return stat.S_ISLNK(st.st_mode) and os.readlink(real) == art.target
        if isinstance(art, CharDevice):
            if stat.S_ISCHR(st.st_mode):
                return (os.major(st.st_rdev), os.minor(st.st_rdev)) == (art.major, art.minor) and (
                    stat.S_IMODE(st.st_mode) == art.mode
                )
            if stat.S_ISREG(st.st_mode) and fsops.read_bytes(real) == fsops.placeholder(art):
                self.degraded.append(fsops.placeholder_reason(art))
                return not fsops.can_mknod(self.state_dir)
            return False
        if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != art.mode:
            return False
        if isinstance(art, File):
            return st.st_size == len(art.content) and fsops.read_bytes(real) == art.content
        return st.st_size == art.source.stat().st_size and (
            fsops.file_digest(real) == fsops.file_digest(art.source)
        )

    # -- removal -------------------------------------------------------

    def remove_unwanted(self, wanted: set[str]) -> None:
        """Remove what the owner created before but ``wanted`` lacks (``removal``)."""
        removal.remove_unwanted(self, wanted)


#: Tries of one placement whose parent another owner removed meanwhile; each
#: retry re-creates the parents, so a second try nearly always succeeds.
_PLACE_ATTEMPTS = 5


class _ParentVanished(Exception):
    """A directory this converge relies on was removed by another owner's converge."""


def _kind(art: Artifact) -> str:
    """The manifest's word for what an artifact creates (directories are noted apart)."""
    return {File: "file", CopyOf: "file", Symlink: "symlink", CharDevice: "device"}[type(art)]
