"""The node root: the only way any simulator touches the filesystem.

Everything Mokka writes lives under one directory, the *node root*: ``/host``
inside the DaemonSet pod, ``./mokka-node`` for a local run, a temporary
directory in tests.  Simulators never build paths themselves; they describe
what they want (``File``, ``Symlink``, ``CharDevice``, ``Directory``,
``CopyOf``) and call ``Host.converge(owner, artifacts)``, which

* resolves every path *beneath* the root (see ``Host.resolve``),
* creates or updates only what differs (unchanged files are not rewritten, so
  their mtimes stay, and a second stage is a no-op),
* records every path it created in the owner's **manifest**, persisted under
  the root's state directory before the path is created, so a fresh process
  can ``discard`` what a killed one left behind,
* removes what the owner created earlier but the new set no longer lists
  (convergence downward: 8 → 4 GPUs removes ``nvidia4..7``),
* records a directory another owner created as shared (sibling batches and
  simulators write into the same parents, concurrently), so whichever owner
  is discarded last removes it,
* backs up a pre-existing file it is asked to overwrite and restores it on
  discard, so teardown leaves the node byte for byte as it was found,
* keeps that bookkeeping private (0700/0600 whatever the umask) and refuses
  to act on any of it that someone else could have written
  (``mokka.manifest``),
* turns the faults a node root can be expected to have (full, read-only, not
  ours to write, gone) into one ``HostFaultError`` line naming the path,
  instead of a traceback,
* remembers what each owner's last converge left (``settled.Settled``),
  so a converge that asks for the same again costs one ``lstat`` per path
  when nothing drifted, and one that changes a few paths does not look at
  the others again,
* records what one simulator call asks of it (``recording``: the owners it
  converges, the node paths it looks at, any command it runs) and tells
  whether the node is still what that call found and left (``unchanged``),
  so the reconcile waves skip a repeated call over the same input
  without rendering anything (``mokka.daemon.waves.Replays``).

The artifact types live in ``mokka.artifacts``, the manifest in
``mokka.manifest``, path mapping in ``mokka.noderoot`` and one converge
call's work in ``mokka.convergence`` (which imports none of this module);
the artifact types are re-exported here, the one module simulators import.
All methods are blocking; simulators call them through
``trio.to_thread.run_sync`` once per batch (one thread hop per surface, not
per file).
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

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
from mokka.errors import (
    CommandError,
    HostFaultError,
    HostPathError,
    MokkaError,
    PassSuperseded,
    UntrustedBookkeepingError,
)
from mokka.fsops import rmdir_empty_tree
from mokka.layout import MOKKA_STATE_DIR as STATE_DIR
from mokka.manifest import (
    TMP_SUFFIX,
    Manifest,
    check_private_dir,
    is_node_path,
    make_private_dir,
    read_private,
    write_private,
    write_private_replacing,
)
from mokka.noderoot import NodeRoot, ResolveCache
from mokka.noderoot import norm as node_norm
from mokka.settled import (
    RECORDING,
    UNCOMPARABLE,
    Activity,
    Seen,
    Settled,
    content_signature,
    signature,
)

if TYPE_CHECKING:
    import subprocess

#: While a Stage wave may still give way to a newer input, the reconcile
#: loop puts an event here; once it is set, a converge running in a worker
#: thread (which cancellation cannot stop) stops between two paths with
#: ``PassSuperseded`` instead of finishing a batch nobody wants any more.
#: What it leaves is what a kill there would: recorded paths, temp files
#: removed, the rest for the next converge.  Trio copies the context into
#: the wave's tasks and their worker threads.
GIVE_WAY: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "mokka_give_way", default=None
)

__all__ = [
    "STATE_DIR",
    "Artifact",
    "CharDevice",
    "CommandRunner",
    "ConvergeReport",
    "CopyOf",
    "Directory",
    "File",
    "Host",
    "SubprocessRunner",
    "Symlink",
]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------
# Host commands
# --------------------------------------------------------------------------


class CommandRunner(Protocol):
    """Runs a host command (systemctl, nvidia-ctk); injectable so tests record calls."""

    def run(
        self, argv: Sequence[str], *, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]: ...


@attrs.frozen
class SubprocessRunner:
    """The real runner: a subprocess with captured text output."""

    def run(
        self, argv: Sequence[str], *, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv``; a non-zero exit is returned (callers decide), a failure to run raises.

        ``CommandError`` only when the command could not run at all (missing
        binary, timeout): the caller's readiness reason then says which.
        """
        # imported here: a ``Host`` that runs no command (``mokka ctl``) need not load it
        import subprocess

        try:
            return subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CommandError(f"{argv[0]}: {exc}") from exc


# --------------------------------------------------------------------------
# The host
# --------------------------------------------------------------------------


@attrs.define(eq=False)
class Host:
    """The node root plus the command runner; see the module docstring."""

    root: Path = attrs.field(converter=lambda p: Path(p).absolute())
    runner: CommandRunner = attrs.field(factory=SubprocessRunner)
    #: Per-owner locks: converge/discard of one owner never interleave.
    _locks: dict[str, threading.Lock] = attrs.field(factory=dict, init=False)
    _locks_guard: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    #: Guards the shared state directory: created by the first converge in
    #: flight, removed by the last one out when no manifest remains.
    _state_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _state_users: int = attrs.field(default=0, init=False)
    #: Serialises every owner's "share or create" and "remove and forget" of
    #: directories (``mokka.convergence``); file writes stay concurrent.
    dirs_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    #: Path mapping beneath the root (shared with ``Convergence``).
    paths: NodeRoot = attrs.field(init=False)
    #: What each owner's last successful converge left (see ``Settled``).
    _settled: dict[str, Settled] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self.paths = NodeRoot(self.root)

    @contextlib.contextmanager
    def _state_in_use(self) -> Iterator[None]:
        with self._state_lock:
            self._ensure_state_dir()
            self._state_users += 1
        try:
            yield
        finally:
            with self._state_lock:
                self._state_users -= 1
                if self._state_users == 0:
                    self._cleanup_state_dir()

    # ---- paths ---------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        """Mokka's bookkeeping directory (manifests, backups), really, beneath the root.

        Followed to the end: ``var/lib/mokka`` may be a symlink (to
        ``/data/mokka``, re-rooted), and what is created and removed is the
        directory it names.
        """
        return self.paths.resolve(STATE_DIR, follow_last=True)

    def resolve(self, path: str | os.PathLike[str], *, follow_last: bool = False) -> Path:
        """Map a node path beneath the root, links followed inside it (``NodeRoot.resolve``).

        Nothing a profile or a planted link says can make the daemon write
        outside its root: a request with ``..``, or a link that would climb
        above the root, raises ``HostPathError``.  The last component is not
        followed unless ``follow_last`` (we create, replace or remove *that*
        entry).
        """
        self._looked_at(path, follow_last)
        return self.paths.resolve(path, follow_last=follow_last)

    def exists(self, path: str) -> bool:
        """Whether a node path exists (a dangling link counts); an escaping path does not."""
        self._looked_at(path, False)
        try:
            return os.path.lexists(self.paths.resolve(path))
        except HostPathError:
            return False

    def read_bytes(self, path: str) -> bytes:
        """A node file's content, symlinks followed inside the root."""
        self._looked_at(path, True)
        return self.paths.resolve(path, follow_last=True).read_bytes()

    def read_text(self, path: str) -> str:
        """A node file's content as UTF-8 text."""
        return self.read_bytes(path).decode()

    # ---- host commands -----------------------------------------------

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
        """Run a host command through the injected runner (tests record, the daemon executes)."""
        activity = _recording()
        if activity is not None:
            activity.opaque = f"runs {argv[0] if argv else 'a command'}"
        return self.runner.run(argv, **kwargs)

    def depends_on(self, path: str | os.PathLike[str]) -> None:
        """Note that the calling simulator's outcome depends on ``path`` of the machine itself.

        For what a simulator reads outside the node root and so outside
        ``resolve``/``read_bytes`` (the mount table, whether the machine has
        an ``nvidia-smi`` to stage, an archive directory): a recorded call is
        made again once that path's signature changes (its content, for
        ``/proc`` files), not only when the node or the input does.
        """
        activity = _recording()
        if activity is not None:
            path = os.fspath(path)
            seen = activity.outside[path] = _outside_seen(path)
            if seen == UNCOMPARABLE:
                activity.opaque = f"depends on {path}"

    # ---- the drift check of a replayed call --------------------------

    @contextlib.contextmanager
    def recording(self) -> Iterator[Activity]:
        """Record what the calls made in this context ask of the host (``Activity``)."""
        activity = Activity()
        token = RECORDING.set(activity)
        try:
            yield activity
        finally:
            RECORDING.reset(token)
            activity.closed = True

    def unchanged(self, activity: Activity, cache: ResolveCache | None = None) -> bool:
        """Whether the node is still exactly what ``activity`` found and left.

        Every owner it converged still has the very ``Settled`` record that
        call left (no converge since) and that record ``holds``; every
        owner it discarded still has no bookkeeping; every path it looked
        at has the signature it had (resolved again, links on the way
        included; ``cache`` shares the directories met between the calls
        of one sweep).  Blocking: one ``lstat`` per path.
        """
        if activity.opaque is not None:
            return False
        for owner, settled in activity.converged.items():
            if settled is None:
                if owner in self._settled or self._has_bookkeeping(owner):
                    return False
            elif self._settled.get(owner) is not settled or not settled.holds(settled.wanted):
                return False
        if any(_outside_seen(path) != seen for path, seen in activity.outside.items()):
            return False
        if cache is None:
            cache = {}
        return all(
            self._seen(path, follow, cache) == seen
            for (path, follow), seen in activity.looked_at.items()
        )

    def _looked_at(self, path: str | os.PathLike[str], follow_last: bool) -> None:
        """Note a node path a recorded call looks at, with what it finds there now."""
        activity = _recording()
        if activity is None:
            return
        path = os.fspath(path)
        seen = self._seen(path, follow_last)
        if seen == UNCOMPARABLE:
            activity.opaque = f"looks at {path}"
        activity.looked_at[(path, follow_last)] = seen

    def _seen(self, path: str, follow_last: bool, cache: ResolveCache | None = None) -> Seen:
        """What identifies a looked-at node path's current version (``settled.signature``).

        Beneath ``/proc`` or ``/sys`` a file's content changes (a module
        registers a device major) with no change of signature: a file
        there is identified by its content too (``content_signature``).
        """
        try:
            parts = self.paths.resolve_parts(path, follow_last=follow_last, cache=cache)
        except HostPathError:
            return "outside the root"
        real = str(self.paths.real(parts))
        stat_fn = os.stat if follow_last else os.lstat
        if parts and parts[0] in _PSEUDO_FILESYSTEMS:
            return content_signature(real, stat_fn)
        return signature(real, stat_fn)

    # ---- convergence ---------------------------------------------------

    def _lock(self, owner: str) -> threading.Lock:
        """The lock serialising one owner's converges (simulators batch in worker threads)."""
        with self._locks_guard:
            return self._locks.setdefault(owner, threading.Lock())

    def _manifest_dir(self) -> Path:
        """Where every owner's manifest and journal live."""
        return self.paths.resolve(STATE_DIR + "/manifests", follow_last=True)

    @property
    def _parents_marker(self) -> Path:
        """The record of the state directory's ancestors a converge created.

        At the top of the root, not in the state directory: the ancestors
        are removed *after* the state directory, and a record inside it would
        be gone by then, so a kill between the two would leave ``/var/lib``
        behind with nothing saying it was ours.  It exists only while such
        ancestors do (an empty root: tests, a local run; never on a real host).
        """
        return self.root / ".mokka-created-parents.json"

    def _ensure_state_dir(self) -> None:
        """Create the private state directory, recording first which ancestors will be ours.

        On an empty root (tests, a local run) ``/var`` and ``/var/lib`` do not
        exist; recording them (before they are made, like every manifest
        entry) lets the last discard remove them again, so the root ends
        exactly as it started.  The ancestors are node directories (0755);
        the state directory itself is 0700, whatever the umask.  One that
        exists is checked instead: refused unless private and ours.
        """
        state = self.state_dir
        if check_private_dir(state):
            return
        parts = state.relative_to(self.root).parts
        missing = [
            "/" + "/".join(parts[:i])
            for i in range(1, len(parts))
            if not os.path.isdir(self.root.joinpath(*parts[:i]))
        ]
        if missing:
            recorded = self._created_parents()
            data = json.dumps(recorded + missing).encode()
            if recorded:  # left by a process killed while removing them
                write_private_replacing(self._parents_marker, data)
            else:
                write_private(self._parents_marker, data)
        for rel in missing:
            real = self.root / rel.lstrip("/")
            with contextlib.suppress(FileExistsError):
                os.mkdir(real, 0o755)
                os.chmod(real, 0o755)
        make_private_dir(state)

    def _cleanup_state_dir(self) -> None:
        """Remove the state directory, then the ancestors it created, once it records nothing.

        Also finishes the job of a process killed half way through it: the
        state directory gone, the ancestors (and their record) not yet.
        """
        state = self.state_dir
        if check_private_dir(state):
            if self.leftovers():
                return  # a manifest or a backup still waits for its owner's discard
            for probe in state.glob(".mknod-probe-*"):
                # The device-node probe's scratch directory, left by a kill mid-probe.
                shutil.rmtree(probe, ignore_errors=True)
            legacy = self._created_parents(state / _LEGACY_PARENTS_MARKER)
            if legacy:
                # An earlier release kept the record inside: move it out first.
                merged = self._created_parents() + legacy
                write_private_replacing(self._parents_marker, json.dumps(merged).encode())
            with contextlib.suppress(FileNotFoundError):
                os.unlink(state / _LEGACY_PARENTS_MARKER)
            rmdir_empty_tree(state)
            if os.path.lexists(state):
                return
        if not os.path.lexists(self._parents_marker):
            return  # (checked first: on a read-only root, unlink says EROFS, not ENOENT)
        created = self._created_parents()
        for rel in sorted(created, key=lambda r: -r.count("/")):
            # OSError: something else now lives there, so it stays.
            with contextlib.suppress(OSError):
                os.rmdir(self.root / rel.lstrip("/"))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._parents_marker)

    def _created_parents(self, marker: Path | None = None) -> list[str]:
        """The recorded ancestors of the state directory (checked: ancestors, nothing else)."""
        marker = marker or self._parents_marker
        raw = read_private(marker)
        if raw is None:
            return []
        try:
            created = json.loads(raw)
        except json.JSONDecodeError:
            created = None
        state_rel = "/" + self.state_dir.relative_to(self.root).as_posix()
        if not isinstance(created, list) or not all(
            is_node_path(p) and state_rel.startswith(p + "/") for p in created
        ):
            raise UntrustedBookkeepingError(
                f"{marker}: expected a list of the directories above {state_rel}; "
                "nothing in this file is acted on"
            )
        return created

    def leftovers(self) -> list[str]:
        """Node paths of bookkeeping still waiting: manifests, journals, temp files, backups."""
        try:
            state = self.state_dir
            if not check_private_dir(state):
                return []
        except (HostPathError, OSError):
            return []
        left: list[str] = []
        for sub in ("manifests", "backups"):
            for dirpath, _dirnames, filenames in os.walk(state / sub):
                for name in sorted(filenames):
                    rel = (Path(dirpath) / name).relative_to(self.root).as_posix()
                    left.append("/" + rel)
        return sorted(left)

    def _has_bookkeeping(self, owner: str) -> bool:
        """Whether ``owner`` has a manifest, journal or temp snapshot under the root."""
        try:
            directory = self._manifest_dir()
        except HostPathError:
            return False
        return any(
            os.path.lexists(directory / f"{owner}{suffix}")
            for suffix in (".json", ".journal", TMP_SUFFIX)
        )

    def owned(self, owner: str) -> dict[str, str]:
        """The paths ``owner`` currently owns (path → kind), as persisted."""
        for suffix in (".json", ".journal"):
            self._looked_at(f"{STATE_DIR}/manifests/{owner}{suffix}", False)
        with self._lock(owner):
            return dict(Manifest.load(owner, self._manifest_dir()).entries)

    def converge(self, owner: str, artifacts: Iterable[Artifact]) -> ConvergeReport:
        """Make ``owner``'s part of the node exactly ``artifacts``; see the module docstring.

        Discarding an owner that has no bookkeeping writes nothing at all:
        a teardown on a root the daemon never wrote to (read-only, not
        enterable) succeeds without touching it.

        A recorded call (``recording``) notes the owner with the ``Settled``
        record this converge leaves; the host's own lookups meanwhile are
        not the caller's and are not noted.
        """
        activity = _recording()
        if activity is None:
            return self._converge_owner(owner, artifacts)
        token = RECORDING.set(None)
        try:
            report = self._converge_owner(owner, artifacts)
        finally:
            RECORDING.reset(token)
        activity.converged[owner] = self._settled.get(owner)
        return report

    def _converge_owner(self, owner: str, artifacts: Iterable[Artifact]) -> ConvergeReport:
        _check_owner(owner)
        wanted = list(artifacts)
        with self._lock(owner):
            settled = self._settled.pop(owner, None)
            if wanted and settled is not None and settled.holds(wanted):
                # The drift check of a pass that changes nothing (``Settled``).
                self._settled[owner] = settled
                return ConvergeReport(degraded=settled.degraded)
            if not wanted and not self._has_bookkeeping(owner):
                if os.path.lexists(self._parents_marker):
                    with self._state_lock:
                        if self._state_users == 0:
                            self._cleanup_state_dir()  # what a killed process left
                return ConvergeReport()
            try:
                return self._converge(owner, wanted, settled)
            except OSError as exc:
                fault = self._fault(owner, exc)
                if fault is None:
                    raise
                raise fault from exc

    def _converge(
        self, owner: str, wanted: list[Artifact], settled: Settled | None
    ) -> ConvergeReport:
        if not os.path.isdir(self.root):
            raise HostFaultError(f"{owner}: the node root {self.root} is gone")
        # imported here: reading a node root (``mokka ctl status``) converges nothing
        from mokka.convergence import Convergence

        with self._state_in_use():
            manifest = Manifest.load(owner, self._manifest_dir())
            work = Convergence(
                paths=self.paths,
                manifest=manifest,
                dirs_lock=self.dirs_lock,
                manifest_dir=self._manifest_dir(),
                state_dir=self.state_dir,
                run=self.run,
                previous=settled,
            )
            wanted_paths: set[str] = set()
            give_way = GIVE_WAY.get()
            try:
                try:
                    for art in wanted:
                        if give_way is not None and give_way.is_set():
                            raise PassSuperseded(f"{owner}: a newer input arrived")
                        norm = node_norm(art.path)
                        wanted_paths.add(norm)
                        work.put(art, norm)
                    work.commit()
                except BaseException:
                    work.abandon()
                    raise
                work.remove_unwanted(wanted_paths)
            finally:
                # The journal already records what happened; an error leaves
                # it for the next converge (or a fresh process) to fold in.
                manifest.close()
            try:
                manifest.compact()
            except OSError as exc:
                if exc.errno not in _EXPECTED_FAULTS:
                    raise
                # The work is done and the journal records it all.
                logger.warning(
                    "%s: could not fold the journal into %s: %s; the journal keeps the record",
                    owner, self._node_path(manifest.snapshot_path), exc.strerror,
                )
            if wanted:
                self._settled[owner] = work.settled(wanted)
            return work.report()

    def _node_path(self, real: str | os.PathLike[str] | None) -> str:
        """A real path beneath the root as the node path it is (others as they are)."""
        if real is None:
            return "?"
        path = Path(os.fsdecode(real))
        try:
            return "/" + path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def _fault(self, owner: str, exc: OSError) -> HostFaultError | None:
        """An expected fault as one line (which path, what, what it means); ``None``: a bug."""
        gone = exc.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.isdir(self.root)
        if exc.errno not in _EXPECTED_FAULTS and not gone:
            return None
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        if gone:
            meaning = f"the node root {self.root} is gone"
        else:
            meaning = _EXPECTED_FAULTS[exc.errno].format(uid=os.geteuid())
        return HostFaultError(
            f"{owner}: {self._node_path(exc.filename)}: {exc.strerror} ({code}): {meaning}"
        )

    def discard(self, owner: str) -> ConvergeReport:
        """Remove everything ``owner`` created (also by an earlier process); restore backups."""
        return self.converge(owner, ())

    def owners(self) -> list[str]:
        """Every owner with bookkeeping under the root (what ``discard_all`` goes through)."""
        try:
            return self._owners_in(self._manifest_dir())
        except HostPathError:
            return []

    @staticmethod
    def _owners_in(directory: Path) -> list[str]:
        if not check_private_dir(directory):
            return []
        return sorted({
            name.removesuffix(suffix)
            for name in os.listdir(directory)
            for suffix in (".json", ".journal", TMP_SUFFIX)
            if name.endswith(suffix) and name != suffix
        })

    def discard_all(self) -> ConvergeReport:
        """Discard every owner with a manifest (``mokka cleanup``).

        Every owner is tried even when one fails (the manual recovery must
        not stop at the first stuck path); the failures are raised together
        afterwards, as one ``HostPathError`` naming each owner and every
        bookkeeping file still left (a half-written snapshot included).
        """
        try:
            directory = self._manifest_dir()
        except HostPathError as exc:
            # A link on the way leads out of the root: no bookkeeping of ours
            # can be there (nothing was ever written through it).
            logger.warning("no Mokka bookkeeping under %s to discard: %s", self.root, exc)
            return ConvergeReport()
        owners = self._owners_in(directory)
        removed: list[str] = []
        failures: list[str] = []
        failed: set[str] = set()
        for owner in owners:
            try:
                removed.extend(self.discard(owner).removed)
            except (OSError, MokkaError) as exc:
                logger.warning("could not discard everything of %s: %s", owner, exc)
                failures.append(f"{owner}: {exc}")
                failed.add(owner)
        with self._state_lock:
            if self._state_users == 0:
                # Finish what a process killed while removing the state
                # directory left: no owner is left to do it in its discard.
                self._cleanup_state_dir()
        # What a failed owner keeps is said above; anything else is news.
        left = [p for p in self.leftovers() if _bookkeeping_owner(p) not in failed]
        if left:
            failures.append(f"left under the root: {', '.join(left)}")
        if failures:
            raise HostPathError("; ".join(failures))
        return ConvergeReport(removed=tuple(removed))


#: Top directories whose files change content with no change of signature
#: (procfs, sysfs): a looked-at file there is compared by content (``Host._seen``).
_PSEUDO_FILESYSTEMS = frozenset({"proc", "sys"})

def _recording() -> Activity | None:
    """The ``Activity`` being recorded in this context, if any and still open."""
    activity = RECORDING.get()
    return None if activity is None or activity.closed else activity


def _outside_seen(path: str) -> Seen:
    """What identifies a machine path's current version (``Host.depends_on``): its
    ``stat`` signature; for a ``/proc`` or ``/sys`` file, its content too."""
    top = path.lstrip("/").split("/", 1)[0]
    if path.startswith("/") and top in _PSEUDO_FILESYSTEMS:
        return content_signature(path, os.stat)
    return signature(path, os.stat)


#: Where releases before the record moved to the top of the root kept it (in the state directory).
_LEGACY_PARENTS_MARKER = "created-parents.json"

#: Faults a node root can be expected to have, and what each means for the operator.
_EXPECTED_FAULTS: dict[int, str] = {
    errno.ENOSPC: "the filesystem holding the node root is full",
    errno.EDQUOT: "the disk quota of the node root is used up",
    errno.EROFS: "the node root is on a read-only filesystem",
    errno.EACCES: "the daemon (uid {uid}) may not write there",
    errno.EPERM: "the daemon (uid {uid}) may not change that",
}


def _bookkeeping_owner(path: str) -> str:
    """The owner a bookkeeping file belongs to (``manifests/<owner>.*``, ``backups/<owner>/*``)."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[-3] == "backups":
        return parts[-2]
    name = parts[-1]
    for suffix in (TMP_SUFFIX, ".json", ".journal"):
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def _check_owner(owner: str) -> None:
    """Owner names become manifest file names: no separators, no hidden files."""
    if not owner or "/" in owner or owner.startswith("."):
        raise ValueError(f"invalid owner name {owner!r}")
