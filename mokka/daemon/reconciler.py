"""The reconcile loop around its three waves (ARCHITECTURE §3).

The waves themselves are functions in ``mokka.daemon.waves``; this module
sequences them around the barrier and keeps the bookkeeping.

One pass over a ``State``:

1. **Stage wave**: first, appliers that are also ``Retractor``s stop
   publishing what the new state will remove (the CDI specs narrow to what
   both states keep), all of them before any stage starts; then a nursery
   of its own where every simulator's ``stage`` runs in its own task, which
   catches ``Exception`` (never ``BaseException``: cancellation must pass)
   and records it, so one pass reports *every* failing simulator, not the
   first.
2. **Barrier**: plain sequencing.  If any stage failed the pass ends here: no
   daemon starts, nothing is applied, the node is never half-visible.
3. **Supervise**: daemons start exactly once, on the first pass that passes
   the barrier, through the supervisor (whose nursery owns them); later
   passes deliver the state with ``reload``.
4. **Apply wave**: a nursery of its own over the appliers; the first failure
   cancels the others (appliers depend on each other: publishing the rest
   past a failure would be incoherent).

The loop is level-triggered: it waits for *something changed* and then reads
the newest ``SourceUpdate`` whole, so a burst of updates coalesces into one
pass over the last of them.  A newer input cuts a pass short in its Stage
wave (the node then converges one stage after the change, not after the
stale pass and its own), but not for ever: once the loop has given way
before and has gone ``supersede_window`` seconds without finishing a pass,
the pass in flight finishes and the newest input is taken after it.  An
input that changes faster than a pass completes would otherwise supersede
every pass, and the node would never converge at all.  A failed pass is retried with capped
exponential backoff without waiting for new input (a new input cuts the
wait short); a ``SpecError`` is terminal until the input changes; an
unchanged state (same ``content_hash``) after a pass causes no new pass,
except a *repair* pass: when an unchanged update (the source's periodic
resync) was read at least ``repair_interval`` after the input of the last
good pass, the pass runs anyway, so drift (a device node someone deleted,
a spec another tool overwrote) is put right within one resync interval.
Stages are idempotent and do not rewrite what is unchanged, so a repair
pass costs reads, not writes; and a simulator whose last good call had
the same input and whose part of the node the host finds unchanged is not
called at all (``waves.Replays``), so a repair pass with nothing drifted
costs one ``lstat`` per path, with no rendering.  ``request_repair``
(SIGHUP) makes the next unchanged update a full repair pass whatever its
age: every simulator is called, whatever the records say.

An update skipped because its content equals what the last pass ran over
(the input went A → B → A during a pass) still counts as observed: the node
already is that state, and ``observed_generation`` says so instead of
lagging behind ``seen_generation`` for good.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import attrs
import trio
import trio_util

from mokka.daemon import waves
from mokka.daemon.backoff import Backoff
from mokka.daemon.status import DurationSummary, PassResult, ReconcilerStatus, SimulatorOutcome
from mokka.daemon.supervisor import Supervisor
from mokka.noderoot import GIVE_WAY, Host
from mokka.simulators.base import Readiness, Simulator

if TYPE_CHECKING:
    from mokka.state.model import State
    from mokka.state.sources.base import SourceUpdate

logger = logging.getLogger(__name__)

#: Marks "no update consumed yet" / "the retry deadline passed" in the loop.
_NOTHING = object()


@attrs.define(eq=False)
class Reconciler:
    """Runs passes over the newest state; publishes a frozen ``ReconcilerStatus``.

    Two ways in: ``run(updates)`` is the daemon's long-lived loop;
    ``reconcile_once(state)`` is one pass (``--once``, tests, benchmarks).
    Both record every pass the same way, so ``status`` and ``/metrics``
    cover both.
    """

    host: Host
    simulators: Sequence[Simulator] = attrs.field(converter=tuple)
    #: ``None`` skips the Supervise wave (``--once``: nothing outlives the run).
    supervisor: Supervisor | None = None
    #: Retry schedule of a failed pass: 1, 2, 4, ... seconds, at most 60 s.
    backoff: Backoff = attrs.field(factory=Backoff)
    #: Seconds between the update a good pass ran over and an unchanged
    #: update that triggers a repair pass (the daemon passes
    #: ``--resync-interval``); 0: never.  Measured between the updates'
    #: ``at`` (when the source read its inputs), the clock the source's resync
    #: timer runs on: measured from the end of the pass instead, a pass
    #: taking any time at all would push every repair to the resync after next.
    repair_interval: float = 0.0
    #: Seconds a run of superseded passes may last before the pass in flight
    #: is let finish (see the module's docstring).  The first newer input
    #: always cuts a pass short, however long it has run: one change in the
    #: middle of a slow stage is the case superseding is for.  Half a second
    #: keeps a pass completing at least once a second under changes every
    #: 200 ms when a pass takes up to half a second.
    supersede_window: float = 0.5

    # Private, mutable bookkeeping; ``status`` is the published snapshot.
    _phase: str = attrs.field(default="waiting", init=False)
    _passes_by_outcome: Counter[str] = attrs.field(factory=Counter, init=False)
    _last_pass: PassResult | None = attrs.field(default=None, init=False)
    _last_success: PassResult | None = attrs.field(default=None, init=False)
    _last_success_at: float | None = attrs.field(default=None, init=False)
    _pass_duration: DurationSummary = attrs.field(factory=DurationSummary, init=False)
    _wave_durations: dict[tuple[str, str], DurationSummary] = attrs.field(factory=dict, init=False)
    _failures: Counter[tuple[str, str]] = attrs.field(factory=Counter, init=False)
    _seen_generation: int | None = attrs.field(default=None, init=False)
    _source_error: str | None = attrs.field(default=None, init=False)
    _source_error_wall: float | None = attrs.field(default=None, init=False)
    _source_errors_total: int = attrs.field(default=0, init=False)
    _observed_generation: int | None = attrs.field(default=None, init=False)
    _settled_readiness: dict[str, Readiness] | None = attrs.field(default=None, init=False)
    #: ``request_repair`` was called: the next unchanged update runs a pass.
    _repair_requested: bool = attrs.field(default=False, init=False)
    #: Each simulator's last good call per wave (``waves.Replays``): what
    #: makes a repair pass over an unchanged state a drift check.
    #: (Tests under ``autojump_clock`` pass one whose check runs inline.)
    replays: waves.Replays = attrs.field(factory=waves.Replays)
    _status: ReconcilerStatus = attrs.field(factory=ReconcilerStatus, init=False)
    #: Count of finished passes; tests and ``--once`` wait on it.
    passes: trio_util.AsyncValue[int] = attrs.field(
        factory=lambda: trio_util.AsyncValue(0), init=False
    )

    def __attrs_post_init__(self) -> None:
        # Names key outcomes, metrics labels, health bodies and manifests:
        # two simulators with one name would overwrite each other everywhere.
        names = [sim.name for sim in self.simulators]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"simulator names must be unique, repeated: {', '.join(duplicates)}")

    @property
    def status(self) -> ReconcilerStatus:
        return self._status

    def request_repair(self) -> None:
        """Run a pass over the next update even if its state is unchanged (SIGHUP)."""
        self._repair_requested = True

    # ---- the loop -----------------------------------------------------

    async def run(
        self,
        updates: trio_util.AsyncValue[SourceUpdate | None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Reconcile the newest state in ``updates`` until cancelled.

        Waits for *any* new ``SourceUpdate`` object (identity, not equality:
        a resync that re-reads the same inputs is a new object with the same
        hash, and is then skipped by the hash check), or for the retry
        deadline of a failed pass.  What it reconciles is always
        ``updates.value`` at that moment, never a queued payload.
        """
        task_status.started()
        seen: object = _NOTHING
        last_hash: str | None = None  # the state the last pass ran over
        attempt = 0  # consecutive failed passes over ``last_hash``
        retry_at = math.inf
        last_good_at: float | None = None  # ``at`` of the update the last good pass ran over
        # Since when passes have been superseded without one finishing (None:
        # the last one finished), and whether one gave way yet.
        unfinished_since: float | None = None
        gave_way = False
        while True:
            got: object = _NOTHING
            with trio.move_on_at(retry_at):
                got = await updates.wait_value(lambda u, seen=seen: u is not seen)
            due = got is _NOTHING  # the retry deadline passed with no new update
            if not due:
                seen = got
                self._note_update(got)  # type: ignore[arg-type]
            update = updates.value if due else got
            state = getattr(update, "state", None)
            if state is None:
                self._set_phase("waiting")
                continue
            repair = self._repair_requested or self._repair_due(last_good_at, update.at)
            if not due and state.content_hash == last_hash and not repair:
                # Same input: converged, terminal, or its retry is already scheduled.
                self._observe(state.generation)
                continue
            requested, self._repair_requested = self._repair_requested, False
            if state.content_hash != last_hash:
                # New input: the backoff starts over (the user may have fixed it).
                attempt = 0
            attempt += 1
            if unfinished_since is None:
                unfinished_since, gave_way = trio.current_time(), False
            result = await self._pass(
                state, attempt, superseded=_superseded_by(updates, update, state.content_hash),
                replay=not requested,
                give_way_until=unfinished_since + self.supersede_window if gave_way else math.inf,
            )
            if result is None:
                # A newer input arrived while this one was being staged: the
                # node is part old, part older, so nothing counts as converged
                # (``last_hash`` forgets it) and the newest input runs at once.
                last_hash, attempt, retry_at = None, 0, math.inf
                gave_way = True
                continue
            unfinished_since = None
            last_hash = state.content_hash
            if result.ok:
                attempt, retry_at = 0, math.inf
                last_good_at = update.at
                self._set_phase("idle")
            elif result.retry_delay is None:
                retry_at, last_good_at = math.inf, None
                self._set_phase("terminal")
            else:
                retry_at, last_good_at = trio.current_time() + result.retry_delay, None
                self._set_phase("backoff")

    def _repair_due(self, last_good_at: float | None, at: float) -> bool:
        """An unchanged update ``at`` that time is passed again once the last good one is old."""
        return (
            self.repair_interval > 0
            and last_good_at is not None
            and at - last_good_at >= self.repair_interval
        )

    # ---- one pass -----------------------------------------------------

    async def reconcile_once(self, state: State, *, attempt: int = 1) -> PassResult:
        """Stage → barrier → supervise → apply over ``state``; never raises for a simulator.

        ``attempt`` (1-based count of consecutive tries of this state) sets
        the retry delay a failed, non-terminal result carries.
        """
        result = await self._pass(state, attempt)
        assert result is not None  # nothing can supersede it
        return result

    async def _pass(
        self,
        state: State,
        attempt: int,
        *,
        superseded: Callable[[], Awaitable[object]] | None = None,
        replay: bool = True,
        give_way_until: float = math.inf,
    ) -> PassResult | None:
        """``reconcile_once``; ``None`` when ``superseded`` returned during the Stage wave.

        Only the Stage wave gives way to a newer input: stages are
        idempotent and nothing is visible before the barrier, so stopping
        one half way leaves nothing a consumer sees (the next pass stages
        over it).  A converge in flight in a worker thread, which
        cancellation cannot reach, stops at its next path (``GIVE_WAY``):
        the newer input does not wait for a stale batch.  Once past the
        barrier the pass finishes: daemons and published specs are not
        left half done.  Nor does it give way once ``give_way_until`` (trio
        time) has passed: the pass then finishes over its state.

        ``replay`` off makes every simulator's call (a requested repair:
        the operator asks for the full pass, whatever the records say).
        """
        self._set_phase("reconciling")
        started = trio.current_time()
        stage: tuple[SimulatorOutcome, ...] = ()
        stop = threading.Event()
        token = GIVE_WAY.set(stop if superseded is not None else None)
        try:
            with trio.CancelScope() as stage_scope:
                async with trio.open_nursery() as nursery:
                    if superseded is not None:

                        async def give_way() -> None:
                            with trio.move_on_at(give_way_until):
                                await superseded()
                                stop.set()  # converges in worker threads stop too
                                stage_scope.cancel()

                        nursery.start_soon(give_way)
                    stage = await waves.stage(
                        self.host, self.simulators, state, self.replays, replay=replay
                    )
                    nursery.cancel_scope.cancel()  # the stage is done: stop watching
        finally:
            GIVE_WAY.reset(token)
        if stage_scope.cancel_called:
            # Also when every stage had finished its last converge by the
            # time the cancellation could land: the newer input is the one
            # to supervise and apply, not this one.
            logger.info(
                "reconcile pass superseded generation=%s: newer input arrived during the "
                "stage wave; starting over with it", state.generation,
                extra={"generation": state.generation},
            )
            return None
        supervise: tuple[SimulatorOutcome, ...] = ()
        apply: tuple[SimulatorOutcome, ...] = ()
        if not any(o.failed for o in stage):
            supervise = await waves.supervise(
                self.supervisor, self.simulators, state, self.replays, replay=replay
            )
            if not any(o.failed for o in supervise):
                apply = await waves.apply(
                    self.host, self.simulators, state, self.replays, replay=replay
                )
        result = PassResult(
            generation=state.generation,
            content_hash=state.content_hash,
            started_at=started,
            duration=trio.current_time() - started,
            wall=time.time(),
            stage=stage,
            supervise=supervise,
            apply=apply,
        )
        if not result.ok and not result.terminal:
            result = attrs.evolve(result, retry_delay=self.backoff.delay(attempt))
        self._record(result)
        return result

    # ---- bookkeeping --------------------------------------------------

    def _note_update(self, update: SourceUpdate | None) -> None:
        """Track what the source said: its newest generation and whether it is an error.

        ``source_errors_total`` counts error updates this loop observed;
        an error repeated within a coalesced burst counts once.
        """
        if update is None:
            return
        if update.state is not None:
            self._seen_generation = update.state.generation
        if update.error is not None:
            self._source_errors_total += 1
            self._source_error = str(update.error)
            self._source_error_wall = time.time()
            logger.warning(
                "state source error (the last good state stays in force): %s",
                update.error,
                extra={"generation": self._seen_generation},
            )
        else:
            self._source_error = None
            self._source_error_wall = None
        self._publish()

    def _observe(self, generation: int) -> None:
        """The loop has acted on ``generation`` (ran it, or found the node already there)."""
        if generation != self._observed_generation:
            self._observed_generation = generation
            self._publish()

    def _settle_readiness(self) -> dict[str, Readiness]:
        """Every simulator's own readiness now; a crashing ``readiness`` counts as not ready."""
        result: dict[str, Readiness] = {}
        for sim in self.simulators:
            try:
                result[sim.name] = sim.readiness
            except Exception as exc:
                logger.exception("readiness of %s failed", sim.name, extra={"simulator": sim.name})
                result[sim.name] = Readiness.not_ready(f"readiness check failed: {exc}")
        return result

    def _set_phase(self, phase: str) -> None:
        """Publish only on a change: the loop sets phases far more often than they change."""
        if phase != self._phase:
            self._phase = phase
            self._publish()

    def _record(self, result: PassResult) -> None:
        """Fold a finished pass into the counters, publish, and log the canonical line."""
        self._last_pass = result
        self._observed_generation = result.generation
        self._settled_readiness = self._settle_readiness()
        self._passes_by_outcome[result.outcome] += 1
        self._pass_duration = self._pass_duration.add(result.duration)
        for o in result.outcomes:
            key = (o.name, o.wave)
            self._wave_durations[key] = self._wave_durations.get(key, DurationSummary()).add(
                o.duration
            )
            if o.failed:
                self._failures[key] += 1
        if result.ok:
            self._last_success = result
            self._last_success_at = result.started_at + result.duration
        self._publish()
        self.passes.value += 1
        # The canonical line: one per pass, everything a reader needs to triage.
        logger.info(
            "reconcile pass %s",
            result.outcome,
            extra={
                "generation": result.generation,
                "duration_s": round(result.duration, 6),
                "staged": sum(o.ok for o in result.stage),
                "stage_failed": sum(o.failed for o in result.stage),
                "supervised": sum(o.ok for o in result.supervise),
                "supervise_failed": sum(o.failed for o in result.supervise),
                "applied": sum(o.ok for o in result.apply),
                "apply_failed": sum(o.failed for o in result.apply),
                "retry_in_s": result.retry_delay,
            },
        )

    def _publish(self) -> None:
        """Swap in a new frozen snapshot; the converters copy the mutable containers."""
        self._status = ReconcilerStatus(
            phase=self._phase,
            passes_total=sum(self._passes_by_outcome.values()),
            passes_by_outcome=self._passes_by_outcome,
            last_pass=self._last_pass,
            last_success=self._last_success,
            last_success_at=self._last_success_at,
            pass_duration=self._pass_duration,
            wave_durations=self._wave_durations,
            failures_total=self._failures,
            seen_generation=self._seen_generation,
            source_error=self._source_error,
            source_error_wall=self._source_error_wall,
            source_errors_total=self._source_errors_total,
            settled_readiness=self._settled_readiness,
            observed_generation=self._observed_generation,
        )


def _superseded_by(
    updates: trio_util.AsyncValue[SourceUpdate | None], running: object, content_hash: str
) -> Callable[[], Awaitable[None]]:
    """Returns once ``updates`` holds a state other than ``content_hash`` (the pass's own).

    The newest value is checked, not each one set: A → B → A while A is
    staged leaves A, and a pass over A is not worth abandoning for it.
    Error updates carry the last good state (or none) and never supersede.
    """

    async def wait() -> None:
        seen = running
        while True:
            await updates.wait_value(lambda u, seen=seen: u is not seen)
            seen = updates.value
            state = getattr(seen, "state", None)
            if state is not None and state.content_hash != content_hash:
                return

    return wait
