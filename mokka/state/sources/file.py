"""``FileSource``: the desired state from files, followed with inotify.

Inputs: the profile (a built-in name, which never changes, or a file), the
optional topology document and the optional overrides file.  The source
watches the *directories* on the way to each file, follows every symlink on
the way and watches both ends, and re-reads everything when a relevant name
in one of them changes:

* ConfigMap volume: ``/etc/mokka/config.yaml`` → ``..data/config.yaml``,
  ``..data`` → ``..2026_…``; the kubelet writes a new ``..2026_…`` directory,
  renames a ``..data_tmp`` link over ``..data`` and removes the old directory.
  The rename of ``..data`` in ``/etc/mokka`` is the event that matters.
* An editor's save: a temp file renamed over the file (``IN_MOVED_TO``).
* ``mokka ctl``: the same rename, in the driver's config directory.

Bursts are debounced (``debounce`` seconds of quiet, via ``trio.sleep`` so
tests under ``autojump_clock`` cover it), except that a rename onto a
watched name ends the wait at once: a rename lands a whole file, and every
writer above publishes that way, so waiting for quiet after one only adds
the debounce to every change.  The debounce is for in-place writes
(``IN_CLOSE_WRITE``), which a writer may make in several steps (a
truncate, then an append).  Then everything is re-read in one
worker thread, the watch set is recomputed (a swapped ``..data`` points
somewhere new) and the inputs are compiled.  A new generation is published
only when the content hash changed; a parse or validation error publishes
an error update that carries the last good state, which stays in force.

``resync_interval`` re-reads everything regardless of events: the safety
net for filesystems without inotify (NFS, some FUSE), an exhausted
``max_user_watches``, or a watch that failed to install.  If inotify cannot
be opened at all, the source logs it and relies on the resync alone.

Every input is re-read on every change, not just the one that changed:
the three files are small, compiling them takes milliseconds, and a full
re-read cannot miss a change that happened while the last read ran.

A resync whose inputs all have the signature they had at the last good
read (device, inode, size, modification and change times of each file,
links followed; a built-in profile never changes) republishes the same
``State`` object without parsing or compiling anything: every way a file
gets new content (a write, a rename over it, a ConfigMap's ``..data``
swap, which lands on a new inode) changes its change time or its inode,
and the change time cannot be set back.  A signature taken while a file
was still being written (its change time within ``RACY_NS`` of the read)
is not trusted: a second write within the same clock tick could leave
the times as they were, so the next resync reads that file in full again.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio
import trio_util

from mokka.errors import SpecError
from mokka.settings import RELOAD_DEBOUNCE
from mokka.state.compile import NodeMeta, compile_state, load_inputs
from mokka.state.model import State
from mokka.state.profile import is_builtin
from mokka.state.reader import excerpt
from mokka.state.sources.base import SourceUpdate
from mokka.state.sources.inotify import Inotify
from mokka.state.sources.shared_inotify import View, open_shared
from mokka.state.sources.watch import WatchSet, watch_plan

__all__ = ["FileSource", "FileSourceStatistics", "watch_plan"]

logger = logging.getLogger(__name__)

#: An input changed this recently (nanoseconds before the read) may change
#: again within the same timestamp tick: its signature is not trusted.
#: Generous: some filesystems keep times to the second (or two).
RACY_NS = 3_000_000_000

#: What identifies an input file's version (``None``: missing, or unreadable).
InputSignature = tuple[int, int, int, int, int] | None


@attrs.frozen
class FileSourceStatistics:
    """A snapshot for logs, health and tests."""

    generation: int
    #: input re-reads (after events, resyncs, or the first read)
    reloads: int
    #: inotify events read, relevant or not
    events: int
    #: directories currently watched
    watched: tuple[str, ...]
    #: False when inotify could not be opened: the resync is all there is
    inotify: bool
    #: re-reads that found every input's signature unchanged (nothing compiled)
    unchanged_reads: int = 0


async def _to_thread(fn: Callable[[], Any]) -> Any:
    """The default ``offload``: the blocking re-read runs in a trio worker thread.

    Abandoned on cancellation, never waited for: whatever an input does to
    the read (a hung network filesystem), SIGTERM must reach the teardown.
    The inputs are bounded (``mokka.state.reader``), so an abandoned read
    ends by itself; its result is dropped.
    """
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


@attrs.define(eq=False, kw_only=True)
class FileSource:
    """See the module docstring; ``run`` is the ``StateSource`` entry point."""

    #: built-in profile name or a profile file path
    profile: str | Path
    #: this node's name: seeds identities and picks the topology clique
    node_name: str
    #: ComputeDomain document; ``None``: not configured (a missing file is fine)
    topology: Path | None = None
    #: ``mokka ctl``'s file; ``None``: not configured (a missing file is fine)
    overrides: Path | None = None
    #: the node root the overrides path lies beneath (the root's own file):
    #: no symlink on the way is followed (it could lead to any file on the host)
    overrides_root: Path | None = None
    feature_gates: Mapping[str, bool] = attrs.field(factory=dict)
    #: seconds between full re-reads regardless of events; 0 disables
    resync_interval: float = 60.0
    #: seconds of quiet that end a burst of events (``--reload-debounce``;
    #: see ``mokka.settings.Settings.reload_debounce`` for the default)
    debounce: float = RELOAD_DEBOUNCE
    #: a burst never delays a reload by more than this many seconds: a writer
    #: that rewrites a file in a loop cannot postpone the reload forever
    max_delay: float = 2.0
    #: nanoseconds within which an input's change time is too fresh to trust
    #: its signature (``RACY_NS``; tests of the unchanged re-read set 0)
    racy_ns: int = RACY_NS
    #: opens the inotify descriptor (tests substitute one that fails)
    open_inotify: Callable[[], Inotify | View] = open_shared
    #: runs the blocking re-read; a worker thread by default (tests under
    #: ``autojump_clock`` run it inline so virtual time cannot skip past it)
    offload: Callable[[Callable[[], Any]], Awaitable[Any]] = _to_thread

    _watch: WatchSet | None = attrs.field(default=None, init=False)
    _generation: int = attrs.field(default=0, init=False)
    _last_state: State | None = attrs.field(default=None, init=False)
    # problems of the last read, ``None`` when it compiled: the same broken
    # input re-read by a resync is not published (or logged) again
    _last_problems: tuple[str, ...] | None = attrs.field(default=None, init=False)
    _reloads: int = attrs.field(default=0, init=False)
    _events: int = attrs.field(default=0, init=False)
    #: input re-reads that found every signature unchanged and compiled nothing
    _unchanged_reads: int = attrs.field(default=0, init=False)
    # the inputs' signatures at the read that compiled ``_last_state``
    # (``None``: not trusted, see the module docstring)
    _last_inputs: tuple[InputSignature, ...] | None = attrs.field(default=None, init=False)
    # the signatures the last ``_read`` took (``_reload`` keeps them if it compiled)
    _compiled_from: tuple[InputSignature, ...] | None = attrs.field(default=None, init=False)
    # ``request_resync`` was called; the wait it cuts short, while one runs
    _resync_requested: bool = attrs.field(default=False, init=False)
    _waiting: trio.CancelScope | None = attrs.field(default=None, init=False)

    def request_resync(self) -> None:
        """Re-read every input now, as if the resync interval had passed (SIGHUP)."""
        self._resync_requested = True
        if self._waiting is not None:
            self._waiting.cancel()

    def statistics(self) -> FileSourceStatistics:
        """A frozen snapshot of the counters and the watched directories."""
        return FileSourceStatistics(
            generation=self._generation, reloads=self._reloads, events=self._events,
            watched=tuple(sorted(d for d, _ in self._watch.watches.values()))
            if self._watch is not None else (),
            inotify=self._watch is not None, unchanged_reads=self._unchanged_reads,
        )

    def paths(self) -> list[Path]:
        """The files that feed the state (a built-in profile is not a file)."""
        paths = [] if is_builtin(self.profile) else [Path(self.profile)]
        paths += [p for p in (self.topology, self.overrides) if p is not None]
        return paths

    async def run(
        self,
        out: trio_util.AsyncValue[SourceUpdate | None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Publish into ``out`` until cancelled; ``started()`` once the first read is published.

        Started means "the daemon has something to act on": a state, or an
        error update saying why there is none.  inotify is opened before
        the first read, whose re-plan installs the watches before reading, so
        an edit made during start-up triggers another read instead of
        being missed.
        """
        try:
            self._watch = WatchSet(self.open_inotify())
        except OSError as exc:
            logger.warning("inotify unavailable (%s); following the inputs by resync every %ss",
                           exc, self.resync_interval)
        try:
            await self._reload(out)
            task_status.started()
            while True:
                resync = await self._wait_for_change()
                await self._reload(out, resync=resync)
        finally:
            if self._watch is not None:
                self._watch.close()
                self._watch = None

    # ---- waiting -------------------------------------------------------

    async def _wait_for_change(self) -> bool:
        """After a debounced burst of relevant events (False), or a due resync (True).

        The resync timer runs from the end of the last read.  After the
        first relevant event, each further one restarts the ``debounce``
        quiet period, all of it bounded by ``max_delay``; a rename onto a
        watched name ends it at once (the module docstring).  A resync that
        falls due during a burst ends the wait as a resync.
        """
        interval = self.resync_interval if self.resync_interval > 0 else math.inf
        with trio.CancelScope() as self._waiting:
            if self._resync_requested:
                self._waiting.cancel()
            with trio.move_on_after(interval) as timer:
                whole = await self._next_relevant()
                with trio.move_on_after(self.max_delay):
                    while not whole:
                        with trio.move_on_after(self.debounce) as quiet:
                            whole = await self._next_relevant()
                        if quiet.cancelled_caught:
                            break
        self._waiting = None
        requested, self._resync_requested = self._resync_requested, False
        return timer.cancelled_caught or requested

    async def _next_relevant(self) -> bool:
        """Until a read of the descriptor holds at least one relevant event;
        whether it held a rename onto a watched name (``WatchSet.changed``)."""
        if self._watch is None:
            await trio.sleep_forever()
        assert self._watch is not None
        try:
            return await self._watch.changed()
        finally:
            self._events = self._watch.events

    # ---- reading -------------------------------------------------------

    async def _reload(
        self, out: trio_util.AsyncValue[SourceUpdate | None], *, resync: bool = False
    ) -> None:
        """Re-read everything and publish what the daemon needs to hear.

        A new content hash is a new generation.  An error is published once
        per distinct set of problems, carrying the last good state.  An
        unchanged state is republished only after a recovery (to clear the
        error) or on a resync; otherwise nothing is published at all.
        """
        self._reloads += 1
        result = await self.offload(self._read)
        now = trio.current_time()
        if isinstance(result, SpecError):
            self._last_inputs = None
            if result.problems != self._last_problems:
                logger.warning("desired state inputs are invalid, keeping generation %d: %s",
                               self._generation, result)
                out.value = SourceUpdate(state=self._last_state, error=result, at=now)
            self._last_problems = result.problems
            return
        recovered = self._last_problems is not None
        self._last_problems = None
        self._last_inputs = self._compiled_from
        if self._last_state is not None and result.content_hash == self._last_state.content_hash:
            if recovered or resync:
                # A resync republishes the unchanged state as a new update: the
                # reconciler skips it, unless its last good pass is old enough
                # to be worth a repair pass (drift on the node).
                out.value = SourceUpdate(state=self._last_state, error=None, at=now)
            return
        self._generation = result.generation
        self._last_state = result
        logger.info("desired state generation %d (profile %s, %d GPUs, hash %s)",
                    result.generation, result.profile_name, len(result.gpus),
                    result.content_hash[:12])
        out.value = SourceUpdate(state=result, error=None, at=now)

    def _read(self) -> State | SpecError:
        """Blocking: re-plan the watches, then read and compile every input.

        Runs while ``run`` awaits it, never beside ``_relevant``, so the
        watch table needs no lock (a read abandoned on cancellation may
        still finish after ``run`` has ended; nothing reads its result).
        Errors are returned as values for ``_reload`` to publish; an
        ``OSError`` a loader did not turn into a ``SpecError`` becomes one
        naming the file, and so does any other exception (a bug met by
        some input: see below).
        """
        self._rewatch()
        inputs = self._input_signatures()
        if inputs is not None and inputs == self._last_inputs and self._last_problems is None:
            self._unchanged_reads += 1
            self._compiled_from = inputs
            return self._last_state  # type: ignore[return-value]  # set with ``_last_inputs``
        self._compiled_from = None
        try:
            profile, topology, overrides = load_inputs(
                self.profile, self.topology, self.overrides,
                overrides_root=self.overrides_root)
            state = compile_state(
                profile,
                node=NodeMeta(node_name=self.node_name, feature_gates=dict(self.feature_gates)),
                topology=topology, overrides=overrides, generation=self._generation + 1,
            )
            self._compiled_from = inputs
            return state
        except SpecError as exc:
            return exc
        except OSError as exc:
            return SpecError(f"{exc.filename or 'input'}: cannot read: {exc.strerror or exc}")
        except Exception as exc:
            # A parser or compiler bug met by some input.  Raised, it would end
            # the source task and with it the daemon, whose teardown removes
            # every GPU from the node because of one edit.  Reported like any
            # bad input instead: the last good state stays in force, and the
            # traceback is logged (once per distinct error, as ``_reload`` dedupes).
            inputs = ", ".join(
                str(p) for p in (self.profile, self.topology, self.overrides) if p is not None
            )
            error = SpecError(
                f"{inputs}: cannot be compiled ({type(exc).__name__}: {excerpt(str(exc))})")
            if error.problems != self._last_problems:
                logger.exception("compiling the desired state failed unexpectedly")
            return error

    def _input_signatures(self) -> tuple[InputSignature, ...] | None:
        """Every input file's signature now; ``None`` when one is too fresh to trust.

        Taken before the files are read: a change after this point shows
        in the next signature, so the pair (signature, state compiled
        after it) never hides one.
        """
        now = time.time_ns()
        signatures: list[InputSignature] = []
        for path in self.paths():
            try:
                st = os.stat(path)
            except OSError:
                signatures.append(None)
                continue
            if now - max(st.st_mtime_ns, st.st_ctime_ns) < self.racy_ns:
                return None
            signatures.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        return tuple(signatures)

    def _rewatch(self) -> None:
        """Watch exactly the directories the inputs resolve through now (``WatchSet.plan``).

        A watch that fails is logged and left to the resync.
        """
        if self._watch is not None:
            self._watch.plan(self.paths(),
                             why=f"; relying on the resync every {self.resync_interval}s")
