"""One ``Host.converge`` call's work: create, compare, back up, remove.

``mokka.host`` decides *where* (paths resolved beneath the root, the
manifest directory, locking); this module does the filesystem work of one
call, for one owner, with that owner's manifest: it places each wanted
artifact (untouched when it already matches, backed up when it replaces
something foreign), records every creation before it happens, and removes
what the owner created earlier but no longer wants.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from mokka.artifacts import (
    Artifact,
    CharDevice,
    ConvergeReport,
    CopyOf,
    Directory,
    File,
    Symlink,
)
from mokka.errors import HostPathError, MokkaError
from mokka.layout import MOKKA_STATE_DIR as STATE_DIR
from mokka.manifest import Manifest

if TYPE_CHECKING:
    from mokka.host import Host

logger = logging.getLogger(__name__)


def _digest(path: Path) -> str:
    """sha256 of a file, read in 1 MiB chunks (libraries and binaries are megabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


@attrs.define(eq=False)
class Convergence:
    """One converge call's bookkeeping (kept out of ``Host`` to keep it stateless)."""

    host: Host
    manifest: Manifest
    created: list[str] = attrs.field(factory=list)
    updated: list[str] = attrs.field(factory=list)
    removed: list[str] = attrs.field(factory=list)
    degraded: list[str] = attrs.field(factory=list)
    #: Directories already looked up in other owners' manifests by this call.
    _shared_checked: set[str] = attrs.field(factory=set)

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
        for attempt in range(1, _PLACE_ATTEMPTS + 1):
            try:
                self.ensure_parents(norm)
                self.place(art, norm)
                return
            except _ParentVanished as exc:
                if attempt == _PLACE_ATTEMPTS:
                    raise HostPathError(str(exc)) from None
            except FileNotFoundError as exc:
                source = str(art.source) if isinstance(art, CopyOf) else None
                if attempt == _PLACE_ATTEMPTS or exc.filename == source:
                    raise
            logger.debug("%s: a parent directory went away while placing it; again", norm)

    def ensure_parents(self, norm: str) -> None:
        """Create (and record) every missing parent directory of ``norm``, top down."""
        parts = norm.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self._ensure_dir("/" + "/".join(parts[:i]), 0o755, explicit=False)

    def _ensure_dir(self, norm: str, mode: int, *, explicit: bool) -> None:
        """Make ``norm`` a directory, recording it if created (or shared with its creator).

        ``explicit``: asked for as a ``Directory`` artifact, so its mode is
        managed too; implicit parents keep whatever mode they have.  Another
        owner's converge may create or remove directories on the same path
        at the same time: each check is made once (no ``lexists`` then
        ``isdir`` with a window between them), and a parent that went away
        raises ``_ParentVanished`` for ``put`` to try again.
        """
        real = self.host.resolve(norm, follow_last=True)
        existing = _stat(real)
        if existing is not None and not stat.S_ISDIR(existing.st_mode):
            raise HostPathError(f"{norm}: exists and is not a directory")
        if existing is None:
            if not os.path.isdir(real.parent):
                if os.path.islink(self.host.resolve(norm)):
                    # ``norm`` is a symlink whose (re-rooted) target's parent is
                    # missing: refuse before noting, so the manifest never lists
                    # a path that is really a symlink.
                    raise HostPathError(
                        f"{norm}: a symlink to {real.relative_to(self.host.root)} "
                        "under the node root, whose parent directory does not exist"
                    )
                raise _ParentVanished(f"{norm}: its parent directory was removed meanwhile")
            self.manifest.note("add", norm, "dir")
            try:
                os.mkdir(real, mode)
                # mkdir honours the umask; the mode we asked for is what we mean
                os.chmod(real, mode)
            except FileExistsError:
                # Created concurrently by another owner: noted above, so shared.
                if not os.path.isdir(real):
                    raise HostPathError(f"{norm}: exists and is not a directory") from None
                return
            except FileNotFoundError:
                raise _ParentVanished(
                    f"{norm}: it or its parent directory was removed meanwhile"
                ) from None
            self.created.append(norm)
            return
        if norm not in self.manifest.entries and self._listed_by_other_owner(norm):
            # Another owner created it (a sibling batch, another simulator):
            # share it, so whichever owner leaves last removes it.  Without
            # this, discarding the creator first leaves it behind.
            self.manifest.note("add", norm, "dir")
        if (
            explicit
            and norm in self.manifest.entries
            and stat.S_IMODE(os.stat(real).st_mode) != mode
        ):
            os.chmod(real, mode)
            self.updated.append(norm)

    def _listed_by_other_owner(self, norm: str) -> bool:
        """Whether another owner's manifest records ``norm`` as a directory it created.

        Reads each other manifest's journal before its snapshot: a concurrent
        compaction writes the snapshot before deleting the journal, so an entry
        noted before we looked is in one or the other.
        """
        if norm in self._shared_checked:
            return False
        self._shared_checked.add(norm)
        directory = self.host._manifest_dir()
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return False
        owners = {n.rsplit(".", 1)[0] for n in names if n.endswith((".json", ".journal"))}
        owners.discard(self.manifest.owner)
        for owner in sorted(owners):
            last: str | None = None
            try:
                with open(directory / f"{owner}.journal", encoding="utf-8") as journal:
                    for line in journal:
                        try:
                            record = json.loads(line)
                        except json.JSONDecodeError:
                            continue  # a torn line being written right now
                        if record.get("path") == norm:
                            last = record.get("op") if record.get("kind", "dir") == "dir" else None
            except FileNotFoundError:
                pass
            if last == "add":
                return True
            if last is None:
                try:
                    snapshot = json.loads((directory / f"{owner}.json").read_text())
                except (FileNotFoundError, json.JSONDecodeError):
                    continue
                if snapshot.get("entries", {}).get(norm) == "dir":
                    return True
        return False

    def place(self, art: Artifact, norm: str) -> None:
        """Create or update one artifact; untouched when it already matches.

        The manifest entry is written *before* the filesystem changes, so a
        process killed in between leaves a record rather than an orphan.  A
        pre-existing entry that is not ours is backed up first.
        """
        if isinstance(art, Directory):
            self._ensure_dir(norm, art.mode, explicit=True)
            return
        real = self.host.resolve(norm)
        existing = _lstat(real)
        if existing is not None and self._matches(art, real, existing):
            if norm not in self.manifest.entries:
                # Identical content placed by someone else: adopt nothing, touch nothing.
                pass
            return
        kind = _kind(art)
        if existing is not None and norm not in self.manifest.entries:
            backup = self._backup(norm, real, existing)
            self.manifest.note("add", norm, kind, backup=backup)
        elif norm not in self.manifest.entries:
            self.manifest.note("add", norm, kind)
        elif self.manifest.entries[norm] != kind:
            self.manifest.note("add", norm, kind, backup=self.manifest.backups.get(norm, ""))
        (self.updated if existing is not None else self.created).append(norm)
        self._write(art, real)

    def _backup(self, norm: str, real: Path, existing: os.stat_result) -> str:
        """Keep a copy of a foreign file we are about to replace."""
        if stat.S_ISDIR(existing.st_mode):
            raise HostPathError(f"{norm}: a directory is in the way")
        name = hashlib.sha256(norm.encode()).hexdigest()[:32]
        backups = self.host.resolve(STATE_DIR + "/backups/" + self.manifest.owner, follow_last=True)
        backups.mkdir(parents=True, exist_ok=True)
        target = backups / name
        if stat.S_ISLNK(existing.st_mode):
            target.write_text(json.dumps({"symlink": os.readlink(real)}))
        elif stat.S_ISREG(existing.st_mode):
            shutil.copy2(real, target, follow_symlinks=False)
            (backups / (name + ".mode")).write_text(oct(stat.S_IMODE(existing.st_mode)))
        elif stat.S_ISFIFO(existing.st_mode):
            target.write_text(json.dumps({"fifo": True, "mode": stat.S_IMODE(existing.st_mode)}))
        elif stat.S_ISSOCK(existing.st_mode):
            # A socket cannot be made again (its listener owns it): refuse, as
            # for a directory, rather than leave the node without it.
            raise HostPathError(f"{norm}: a socket is in the way")
        else:
            target.write_text(json.dumps({
                "device": [os.major(existing.st_rdev), os.minor(existing.st_rdev)],
                "mode": stat.S_IMODE(existing.st_mode),
                "char": stat.S_ISCHR(existing.st_mode),
            }))
        return name

    def _matches(self, art: Artifact, real: Path, st: os.stat_result) -> bool:
        """Whether the entry on disk already is ``art`` (content, target, device, mode)."""
        if isinstance(art, Symlink):
            return stat.S_ISLNK(st.st_mode) and os.readlink(real) == art.target
        if isinstance(art, CharDevice):
            if stat.S_ISCHR(st.st_mode):
                return (os.major(st.st_rdev), os.minor(st.st_rdev)) == (art.major, art.minor) and (
                    stat.S_IMODE(st.st_mode) == art.mode
                )
            if stat.S_ISREG(st.st_mode) and real.read_bytes() == _placeholder(art):
                self.degraded.append(_placeholder_reason(art))
                return not _can_mknod(self.host.state_dir)
            return False
        if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != art.mode:
            return False
        if isinstance(art, File):
            return st.st_size == len(art.content) and real.read_bytes() == art.content
        return st.st_size == art.source.stat().st_size and _digest(real) == _digest(art.source)

    def _write(self, art: Artifact, real: Path) -> None:
        """Write ``art`` beside ``real`` and rename it over: readers see old or new, never half.

        Files are fsynced before the rename so a crash cannot leave an empty
        file under the final name.  Device nodes fall back to a placeholder
        file without CAP_MKNOD (recorded as degraded).
        """
        # A directory standing where a file should go cannot be renamed over;
        # checked before the temp file exists, so a refusal leaves none behind.
        if real.is_dir() and not real.is_symlink():
            raise HostPathError(f"{real}: a directory is in the way")
        tmp = real.with_name(f".{real.name}.mokka-tmp")
        _unlink(tmp)
        if isinstance(art, Symlink):
            os.symlink(art.target, tmp)
        elif isinstance(art, CharDevice):
            try:
                os.mknod(tmp, stat.S_IFCHR | art.mode, os.makedev(art.major, art.minor))
                os.chmod(tmp, art.mode)
            except PermissionError:
                tmp.write_bytes(_placeholder(art))
                os.chmod(tmp, 0o644)
                self.degraded.append(_placeholder_reason(art))
        else:
            if isinstance(art, File):
                data_writer = lambda f: f.write(art.content)  # noqa: E731
            else:
                def data_writer(f, src=art.source):
                    with open(src, "rb") as s:
                        shutil.copyfileobj(s, f, 1 << 20)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, art.mode)
            with os.fdopen(fd, "wb") as f:
                data_writer(f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, art.mode)
        os.replace(tmp, real)

    # -- removal -------------------------------------------------------

    def remove_unwanted(self, wanted: set[str]) -> None:
        """Remove what this owner created before but ``wanted`` no longer lists.

        Deepest paths first, so directories are empty by the time they are
        reached; parents of wanted paths stay.

        Best effort, path by path: one path that cannot go (a busy mount, a
        permission) must not keep every later path of the owner in place, in
        every later discard too.  A failed path stays in the manifest, and so
        do its parent directories (forgotten, they would outlive it once the
        next try removes it); the failures are raised together at the end.
        """
        # Deepest first, so directories empty out before we look at them.
        stale = [p for p in self.manifest.entries if p not in wanted]
        wanted_dirs = {p for p in wanted} | {
            "/" + "/".join(w.strip("/").split("/")[:i])
            for w in wanted
            for i in range(1, w.count("/"))
        }
        failures: list[str] = []
        kept_parents: set[str] = set()
        for norm in sorted(stale, key=lambda p: (-p.count("/"), p)):
            if norm in wanted_dirs or norm in kept_parents:
                continue
            try:
                self._remove(norm)
            except (OSError, MokkaError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                failures.append(f"{norm} ({reason})")
                logger.warning("could not remove %s: %s", norm, reason)
                parts = norm.strip("/").split("/")
                kept_parents.update("/" + "/".join(parts[:i]) for i in range(1, len(parts)))
        if failures:
            raise HostPathError(
                f"could not remove {', '.join(failures)}; kept in the manifest for the next try"
            )

    def _remove(self, norm: str) -> None:
        """Remove one recorded entry, restore what it replaced, and forget it."""
        kind = self.manifest.entries[norm]
        try:
            real = self.host.resolve(norm)
        except HostPathError:
            logger.warning(
                "manifest path %s no longer resolves inside the root; forgetting it", norm
            )
            self.manifest.note("remove", norm)
            return
        if kind == "dir":
            if os.path.ismount(real):
                # A bind mount we published (the driver tree at /run/nvidia/driver)
                # outliving a killed process: detach it, or rmdir fails with EBUSY.
                # Lazy, because a consumer may still hold files open in it.
                result = self.host.run(["umount", "--lazy", str(real)])
                if result.returncode != 0:
                    logger.warning("could not unmount %s: %s", norm, result.stderr.strip())
            try:
                os.rmdir(real)
            except FileNotFoundError:
                pass
            except OSError as exc:
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
            self.manifest.note("remove", norm)
            self.removed.append(norm)
            return
        # A process killed between writing the temp file and renaming it
        # leaves the temp file beside the path (``_write``); it is ours too.
        _unlink(real.with_name(f".{real.name}.mokka-tmp"))
        try:
            _unlink(real)
        except IsADirectoryError:
            # Replaced by a directory since (someone made one in its place):
            # not ours any more, and what it replaced cannot go back there.
            backup = self.manifest.backups.get(norm)
            logger.warning(
                "leaving %s in place: it is a directory now%s", norm,
                f" (the file it replaced is kept in {STATE_DIR}/backups)" if backup else "",
            )
            self.manifest.note("remove", norm)
            return
        backup = self.manifest.backups.get(norm)
        if backup:
            self._restore(norm, real, backup)
        self.manifest.note("remove", norm)
        self.removed.append(norm)

    def _restore(self, norm: str, real: Path, name: str) -> None:
        """Put a backed-up foreign file, link or device back where it was."""
        backups = self.host.resolve(STATE_DIR + "/backups/" + self.manifest.owner, follow_last=True)
        saved = backups / name
        mode_file = backups / (name + ".mode")
        if mode_file.exists():
            shutil.copy2(saved, real, follow_symlinks=False)
            os.chmod(real, int(mode_file.read_text(), 8))
            mode_file.unlink()
        else:
            meta = json.loads(saved.read_text())
            if "symlink" in meta:
                os.symlink(meta["symlink"], real)
            elif meta.get("fifo"):
                os.mkfifo(real, meta["mode"])
                os.chmod(real, meta["mode"])  # mkfifo honours the umask
            else:
                kind = stat.S_IFCHR if meta["char"] else stat.S_IFBLK
                os.mknod(real, kind | meta["mode"], os.makedev(*meta["device"]))
        saved.unlink()
        rmdir_empty_tree(backups)


#: Tries of one placement whose parent another owner removed meanwhile; each
#: retry re-creates the parents, so a second try nearly always succeeds.
_PLACE_ATTEMPTS = 5


class _ParentVanished(Exception):
    """A directory this converge relies on was removed by another owner's converge."""


def _stat(path: Path) -> os.stat_result | None:
    """``stat`` (links followed) or ``None`` when nothing is there."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _kind(art: Artifact) -> str:
    """The manifest's word for what an artifact creates (directories are noted apart)."""
    return {File: "file", CopyOf: "file", Symlink: "symlink", CharDevice: "device"}[type(art)]


def _lstat(path: Path) -> os.stat_result | None:
    """``lstat`` or ``None`` when nothing is there (the entry itself, links not followed)."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _unlink(path: Path) -> None:
    """Remove a non-directory entry; already gone is fine (discard is idempotent)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _placeholder(art: CharDevice) -> bytes:
    """Content of the regular file standing in for a device node without CAP_MKNOD.

    Recognisable, so a later converge with the capability replaces it and a
    later one without it leaves it (and reports it degraded again).
    """
    return f"mokka placeholder for character device {art.major}:{art.minor}\n".encode()


def _placeholder_reason(art: CharDevice) -> str:
    """The readiness reason a placeholder device produces: what, why, and the fix."""
    return (
        f"{art.path}: no CAP_MKNOD, wrote a placeholder file instead of char device "
        f"{art.major}:{art.minor}; consumers cannot open it (run as root to get real nodes)"
    )


_MKNOD_PROBE: bool | None = None


def _can_mknod(scratch: Path) -> bool:
    """Whether this process may create device nodes (probed once per process).

    The probe node goes in ``scratch`` (Mokka's state directory under the
    node root, which exists during every converge): nothing is written
    outside the root, and a read-only ``/tmp`` does not break the probe.
    """
    global _MKNOD_PROBE
    if _MKNOD_PROBE is None:
        import tempfile

        with tempfile.TemporaryDirectory(dir=scratch, prefix=".mknod-probe-") as d:
            try:
                os.mknod(os.path.join(d, "probe"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
                _MKNOD_PROBE = True
            except PermissionError:
                _MKNOD_PROBE = False
    return _MKNOD_PROBE
