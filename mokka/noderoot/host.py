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
  (``mokka.noderoot.manifest``),
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

The artifact types live in ``mokka.noderoot.artifacts``, the manifest in
``mokka.noderoot.manifest``, path mapping in ``mokka.noderoot.paths``, one converge
call's work in ``mokka.noderoot.convergence`` (which imports none of this module),
the state directory's lifecycle in ``mokka.noderoot.statedir`` and the recording
of a call in ``mokka.noderoot.recording``; the artifact types are re-exported
here, the one module simulators import.
All methods are blocking; simulators call them through
``trio.to_thread.run_sync`` once per batch (one thread hop per surface, not
per file).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from mokka.errors import (
    HostFaultError,
    HostPathError,
    MokkaError,
    PassSuperseded,
)
from mokka.layout import JOURNAL_SUFFIX, MOKKA_MANIFESTS, SNAPSHOT_SUFFIX
from mokka.layout import MOKKA_STATE_DIR as STATE_DIR
from mokka.lazylogger import LazyLogger
from mokka.noderoot.artifacts import (
    Artifact,
    CharDevice,
    ConvergeReport,
    CopyOf,
    Directory,
    File,
    Symlink,
)
from mokka.noderoot.commands import CommandRunner, SubprocessRunner
from mokka.noderoot.faults import EXPECTED_FAULTS, as_fault, node_path_of, owner_line
from mokka.noderoot.filememo import FileMemo
from mokka.noderoot.manifest import Manifest
from mokka.noderoot.paths import NodeRoot, ResolveCache
from mokka.noderoot.paths import norm as node_norm
from mokka.noderoot.recording import absorb_own_writes, note_looked_at, note_outside, record
from mokka.noderoot.recording import current as current_activity
from mokka.noderoot.recording import unchanged as still_unchanged
from mokka.noderoot.settled import RECORDING, Activity, Settled
from mokka.noderoot.shared_dirs import OwnerListings
from mokka.noderoot.statedir import StateDir, bookkeeping_owner

if TYPE_CHECKING:
    import subprocess

    from mokka.noderoot.driftwatch import DriftWatch

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

logger = LazyLogger(__name__)


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
    #: The private state directory beneath the root (created and removed as converges need it).
    state: StateDir = attrs.field(init=False)
    #: Serialises every owner's "share or create" and "remove and forget" of
    #: directories (``mokka.noderoot.convergence``).
    dirs_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    #: One converge works the filesystem at a time, whatever its owner; it
    #: lets go only while it waits for the disk (``WriteBatch.commit``).
    #: Converges are hundreds of short syscalls, each dropping the GIL: two
    #: at once hand it back and forth on every one (docs/daemon.md, "One
    #: converge at a time").  Re-entrant: a converge that discards another
    #: owner on its way (a test's race) keeps its turn.
    disk_turn: threading.RLock = attrs.field(factory=threading.RLock, init=False)
    #: Other owners' bookkeeping as parsed, while unchanged (``mokka.noderoot.shared_dirs``).
    listings: OwnerListings = attrs.field(factory=OwnerListings, init=False)
    #: Each owner's folded manifest snapshot while its file is unchanged (``Manifest.load``).
    snapshots: FileMemo = attrs.field(factory=FileMemo, init=False)
    #: Path mapping beneath the root (shared with ``Convergence``).
    paths: NodeRoot = attrs.field(init=False)
    #: What each owner's last successful converge left (see ``Settled``).
    _settled: dict[str, Settled] = attrs.field(factory=dict, init=False)
    #: Spares the drift check its ``lstat``s while no inotify event says
    #: anything changed (``watch_for_drift``); ``None``: every check stats.
    drift_watch: DriftWatch | None = attrs.field(default=None, init=False)
    _drift_watch_wanted: bool = attrs.field(default=False, init=False)
    _drift_watch_guard: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def __attrs_post_init__(self) -> None:
        self.paths = NodeRoot(self.root)
        self.state = StateDir(self.root, self.paths)

    # ---- paths ---------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        """Mokka's bookkeeping directory, really, beneath the root (``StateDir.path``)."""
        return self.state.path

    def resolve(self, path: str | os.PathLike[str], *, follow_last: bool = False) -> Path:
        """Map a node path beneath the root, links followed inside it (``NodeRoot.resolve``).

        Nothing a profile or a planted link says can make the daemon write
        outside its root: a request with ``..``, or a link that would climb
        above the root, raises ``HostPathError``.  The last component is not
        followed unless ``follow_last`` (we create, replace or remove *that*
        entry).
        """
        return self.paths.real(self._looked_at(path, follow_last))

    def exists(self, path: str) -> bool:
        """Whether a node path exists (a dangling link counts); an escaping path does not."""
        try:
            return os.path.lexists(self.paths.real(self._looked_at(path, False)))
        except HostPathError:
            return False

    def read_bytes(self, path: str) -> bytes:
        """A node file's content, symlinks followed inside the root."""
        return self.paths.real(self._looked_at(path, True)).read_bytes()

    def _looked_at(self, path: str | os.PathLike[str], follow_last: bool) -> list[str]:
        """``path`` resolved (``NodeRoot.resolve_parts``), and noted for a recorded call
        with what is there now: one resolution serves both."""
        try:
            parts = self.paths.resolve_parts(path, follow_last=follow_last)
        except HostPathError:
            note_looked_at(self.paths, path, follow_last)  # noted as outside the root
            raise
        note_looked_at(self.paths, path, follow_last, parts)
        return parts

    def read_text(self, path: str) -> str:
        """A node file's content as UTF-8 text."""
        return self.read_bytes(path).decode()

    # ---- host commands -----------------------------------------------

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
        """Run a host command through the injected runner (tests record, the daemon executes)."""
        activity = current_activity()
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
        note_outside(path)

    # ---- the drift check of a replayed call --------------------------

    @contextlib.contextmanager
    def recording(self) -> Iterator[Activity]:
        """Record what the calls made in this context ask of the host (``Activity``).

        Once the call returned, ``absorb_own_writes`` its activity.
        """
        with record() as activity:
            yield activity

    def absorb_own_writes(self, activity: Activity) -> None:
        """Record the paths a finished call looked at and then placed itself as it left
        them (``recording.absorb_own_writes``).  Blocking: an ``lstat`` per such path."""
        absorb_own_writes(activity, self.paths)

    def rewrote_in_place(self, owner: str, path: str) -> None:
        """Note that ``owner``'s call rewrote a file of its converge in place, after it.

        The change notice's counter is bumped in place right after the
        batch it announces is converged (``gpudriver.notice``); without this,
        that owner's ``Settled`` record would find its own counter changed
        and the next repair pass would converge the batch again, once.
        """
        with self._lock(owner):
            settled = self._settled.get(owner)
            if settled is not None:
                settled.rewritten(node_norm(path))

    def unchanged(self, activity: Activity, cache: ResolveCache | None = None) -> bool:
        """Whether the node is still exactly what ``activity`` found and left.

        Every owner it converged still has the very ``Settled`` record that
        call left (no converge since) and that record ``holds``; every
        owner it discarded still has no bookkeeping; every path it looked
        at has the signature it had (resolved again, links on the way
        included; ``cache`` shares the directories met between the calls
        of one sweep).  Blocking: one ``lstat`` per path.
        """
        watch = self._opened_drift_watch()
        return still_unchanged(
            activity,
            paths=self.paths,
            settled=self._settled,
            has_bookkeeping=self.state.has_bookkeeping,
            cache=cache,
            **({} if watch is None else {"holds": watch.holds}),
        )

    def watch_for_drift(self) -> None:
        """Let inotify vouch for converged records between repair passes (``driftwatch``).

        For a long-lived daemon: a view of the process's inotify descriptor
        (``shared_inotify``) with a watch per directory it placed into, taken
        at the first drift check (a daemon stopped before its first resync
        never watches).  ``stop_watching_for_drift`` releases it.
        """
        self._drift_watch_wanted = True

    def _opened_drift_watch(self) -> DriftWatch | None:
        if not self._drift_watch_wanted:
            return None
        with self._drift_watch_guard:
            if self.drift_watch is None:
                # imported here: a one-shot command (``mokka ctl``, ``--once``) has no use for it
                from mokka.noderoot.driftwatch import DriftWatch

                self.drift_watch = DriftWatch.open()
                if self.drift_watch is None:
                    self._drift_watch_wanted = False  # no inotify: lstat, and no more tries
            return self.drift_watch

    def stop_watching_for_drift(self) -> None:
        """Release the drift watch's descriptor and watches; every check stats again."""
        with self._drift_watch_guard:
            self._drift_watch_wanted = False
            watch, self.drift_watch = self.drift_watch, None
        if watch is not None:
            watch.close()

    # ---- convergence ---------------------------------------------------

    def _lock(self, owner: str) -> threading.Lock:
        """The lock serialising one owner's converges (simulators batch in worker threads)."""
        with self._locks_guard:
            return self._locks.setdefault(owner, threading.Lock())

    def _manifest_dir(self) -> Path:
        """Where every owner's manifest and journal live (``StateDir.manifest_dir``)."""
        return self.state.manifest_dir()

    def leftovers(self) -> list[str]:
        """Node paths of bookkeeping still waiting: manifests, journals, temp files, backups."""
        return self.state.leftovers()

    def owned(self, owner: str) -> dict[str, str]:
        """The paths ``owner`` currently owns (path → kind), as persisted."""
        for suffix in (SNAPSHOT_SUFFIX, JOURNAL_SUFFIX):
            note_looked_at(self.paths, f"{MOKKA_MANIFESTS}/{owner}{suffix}", False)
        with self._lock(owner):
            return dict(Manifest.load(owner, self._manifest_dir(), self.snapshots).entries)

    def converge(self, owner: str, artifacts: Iterable[Artifact]) -> ConvergeReport:
        """Make ``owner``'s part of the node exactly ``artifacts``; see the module docstring.

        Discarding an owner that has no bookkeeping writes nothing at all:
        a teardown on a root the daemon never wrote to (read-only, not
        enterable) succeeds without touching it.

        A recorded call (``recording``) notes the owner with the ``Settled``
        record this converge leaves; the host's own lookups meanwhile are
        not the caller's and are not noted.
        """
        activity = current_activity()
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
        # The owner's lock first: a converge that lets go of the turn while it
        # syncs still holds its owner's, so whoever takes the turn meanwhile
        # must never be waiting for an owner's lock.
        with self._lock(owner), self.disk_turn:
            settled = self._settled.pop(owner, None)
            if wanted and settled is not None and settled.holds(wanted):
                # The drift check of a pass that changes nothing (``Settled``).
                self._settled[owner] = settled
                return ConvergeReport(degraded=settled.degraded)
            if not wanted and not self.state.has_bookkeeping(owner):
                if os.path.lexists(self.state.parents_marker):
                    self.state.cleanup_if_idle()  # what a killed process left
                return ConvergeReport()
            try:
                return self._converge(owner, wanted, settled)
            except BaseException as exc:
                # Interrupted (superseded by a newer input, or failed): the last
                # good record stays the next converge's start.  Sound because
                # it is only ever trusted entry by entry, on signatures: what
                # this converge changed no longer matches, and its journal
                # lines change the bookkeeping signature ``holds`` compares.
                if settled is not None:
                    self._settled.setdefault(owner, settled)
                fault = self._fault(owner, exc) if isinstance(exc, OSError) else None
                if fault is None:
                    raise
                raise fault from exc

    def _converge(
        self, owner: str, wanted: list[Artifact], settled: Settled | None
    ) -> ConvergeReport:
        if not os.path.isdir(self.root):
            raise HostFaultError(f"{owner}: the node root {self.root} is gone")
        # imported here: reading a node root (``mokka ctl status``) converges nothing
        from mokka.noderoot.convergence import Convergence

        with self.state.in_use():
            manifest_dir = self._manifest_dir()
            manifest = Manifest.load(owner, manifest_dir, self.snapshots)
            work = Convergence(
                paths=self.paths,
                manifest=manifest,
                dirs_lock=self.dirs_lock,
                disk_turn=self.disk_turn,
                listings=self.listings,
                manifest_dir=manifest_dir,
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
                    work.batch.commit()
                except BaseException:
                    work.batch.abandon()
                    raise
                work.remove_unwanted(wanted_paths)
            finally:
                # The journal already records what happened; an error leaves
                # it for the next converge (or a fresh process) to fold in.
                manifest.close()
            try:
                manifest.compact()
            except OSError as exc:
                if exc.errno not in EXPECTED_FAULTS:
                    raise
                # The work is done and the journal records it all.
                logger.warning(
                    "%s: could not fold the journal into %s: %s; the journal keeps the record",
                    owner, node_path_of(self.root, manifest.snapshot_path), exc.strerror,
                )
            if wanted:
                self._settled[owner] = work.settled(wanted)
            return work.report()

    def _fault(self, owner: str, exc: OSError) -> HostFaultError | None:
        """An expected fault as one line (``faults.as_fault``); ``None``: a bug."""
        return as_fault(self.root, owner, exc)

    def discard(self, owner: str) -> ConvergeReport:
        """Remove everything ``owner`` created (also by an earlier process); restore backups."""
        return self.converge(owner, ())

    def owners(self) -> list[str]:
        """Every owner with bookkeeping under the root (what ``discard_all`` goes through)."""
        return self.state.owners()

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
        owners = self.state.owners_in(directory)
        removed: list[str] = []
        failures: list[str] = []
        failed: set[str] = set()
        for owner in owners:
            try:
                removed.extend(self.discard(owner).removed)
            except (OSError, MokkaError) as exc:
                logger.warning("could not discard everything of %s: %s", owner, exc)
                failures.append(owner_line(owner, exc))
                failed.add(owner)
        # Finish what a process killed while removing the state directory
        # left: no owner is left to do it in its discard.
        self.state.cleanup_if_idle()
        # What a failed owner keeps is said above; anything else is news.
        left = [p for p in self.leftovers() if bookkeeping_owner(p) not in failed]
        if left:
            failures.append(f"left under the root: {', '.join(left)}")
        if failures:
            raise HostPathError("; ".join(failures))
        return ConvergeReport(removed=tuple(removed))



def _check_owner(owner: str) -> None:
    """Owner names become manifest file names: no separators, no hidden files."""
    if not owner or "/" in owner or owner.startswith("."):
        raise ValueError(f"invalid owner name {owner!r}")
