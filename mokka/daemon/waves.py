"""The three waves of one reconcile pass (ARCHITECTURE §3), as functions.

Each wave runs one kind of call over the simulators that take it and returns
one ``SimulatorOutcome`` per simulator it ran: ``stage`` (every simulator,
after the retractors; collects every failure), ``supervise`` (start each
daemon once, later reload it; collects), ``apply`` (the appliers in one
plain nursery: fail fast).  The reconcile loop (``mokka.daemon.reconciler``)
sequences them around the barrier and keeps the bookkeeping; the waves keep
no state, so they read one way: simulators in, outcomes out.

The one thing carried from pass to pass is handed in by the loop:
``Replays``, the last good call of each simulator in each wave, recorded
(``Host.recording``).  A call over the same input (``content_hash``) whose
recorded ``Activity`` the host still finds unchanged is not made again: it
could only render the same artifacts and converge them onto a node that
already holds them.  That is the drift check of a repair pass: one
``lstat`` per path the call placed or looked at, no rendering; a call whose
part of the node drifted (a device node deleted, a file rewritten or
chmod'ed, a spec overwritten, a link swapped in) is made in full, and its
converge puts the drift right.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from mokka.daemon.status import SimulatorOutcome
from mokka.daemon.supervisor import Supervisor
from mokka.errors import MokkaError, PassSuperseded, SpecError
from mokka.noderoot import Activity, Host
from mokka.simulators.base import Applier, Daemon, Retractor, Simulator, implements

if TYPE_CHECKING:
    from mokka.state.model import State

# Under the reconciler's name: a wave's failure is a line about its pass, and
# log readers (and the documented examples) find it there.
logger = logging.getLogger("mokka.daemon.reconciler")

#: A recorded call: (simulator name, what it was: ``retract``, ``stage``, ``apply``).
CallKey = tuple[str, str]


@attrs.define(eq=False)
class Replays:
    """Each simulator's last good call per wave: the input it had and what it did.

    Kept by the reconcile loop across passes (see the module docstring).
    A call that fails, or is cancelled, is forgotten before it runs, so
    only a call that finished is ever replayed.
    """

    #: Runs the blocking check (``holding``): a worker thread.  Tests under
    #: ``autojump_clock`` run it inline, so virtual time cannot skip past it.
    offload: Callable[[Callable[[], object]], Awaitable[object]] = attrs.field(
        default=trio.to_thread.run_sync
    )
    _calls: dict[CallKey, tuple[str, Activity]] = attrs.field(factory=dict, init=False)
    #: The state each daemon was last delivered (``content_hash``).
    delivered: dict[str, str] = attrs.field(factory=dict, init=False)
    #: Calls not made because their record held, and calls made in full
    #: (counters for tests and benchmarks: the drift check is observable).
    replayed: int = attrs.field(default=0, init=False)
    made: int = attrs.field(default=0, init=False)
    #: ``made``, per call.
    made_per_call: dict[CallKey, int] = attrs.field(factory=dict, init=False)

    def candidates(self, keys: Sequence[CallKey], content_hash: str) -> bool:
        """Whether any of ``keys`` has a record of a call over ``content_hash``."""
        return any(self._calls.get(key, ("",))[0] == content_hash for key in keys)

    def holding(self, host: Host, keys: Sequence[CallKey], content_hash: str) -> set[CallKey]:
        """The ``keys`` whose last good call had ``content_hash`` and whose node is unchanged."""
        held: set[CallKey] = set()
        directories: dict = {}  # resolved once for the whole sweep
        for key in keys:
            recorded = self._calls.get(key)
            if (
                recorded is not None
                and recorded[0] == content_hash
                and host.unchanged(recorded[1], directories)
            ):
                held.add(key)
        return held

    def recorded(
        self, host: Host, key: CallKey, content_hash: str, fn: Callable[..., Awaitable[object]]
    ) -> Callable[..., Awaitable[None]]:
        """``fn``, recording what it asks of ``host`` and remembering it once it returns."""

        async def run(*args: object) -> None:
            self._calls.pop(key, None)
            self.made += 1
            self.made_per_call[key] = self.made_per_call.get(key, 0) + 1
            with host.recording() as activity:
                await fn(*args)
            if activity.looked_at and any(activity.converged.values()):
                await self.offload(functools.partial(host.absorb_own_writes, activity))
            self._calls[key] = (content_hash, activity)

        return run


async def _held(
    replays: Replays | None, host: Host, keys: Sequence[CallKey], state: State
) -> set[CallKey]:
    """``Replays.holding`` in a worker thread (it is filesystem work: one ``lstat`` per
    path); no hop at all when no key has a record of this very input."""
    if replays is None or not replays.candidates(keys, state.content_hash):
        return set()
    held = await replays.offload(
        functools.partial(replays.holding, host, keys, state.content_hash)
    )
    return held  # type: ignore[return-value]  # what ``holding`` returns


def _replayed(wave: str, sim: Simulator, replays: Replays) -> SimulatorOutcome:
    """The outcome of a call not made again: ok, as its recorded original was."""
    replays.replayed += 1
    now = trio.current_time()
    return SimulatorOutcome(name=sim.name, wave=wave, ok=True, started_at=now, wall=time.time())


async def stage(
    host: Host,
    simulators: Sequence[Simulator],
    state: State,
    replays: Replays | None = None,
    *,
    replay: bool = True,
) -> tuple[SimulatorOutcome, ...]:
    """Every simulator's ``stage`` in parallel; collects all outcomes, raises none.

    ``call`` swallows each ``Exception`` after recording it, so the
    nursery only ever raises for cancellation.  With ``replays``, every
    call is recorded, and (unless ``replay`` is off: a requested repair
    makes every call) calls whose record still holds are not made (see the
    module docstring).
    """
    outcomes: dict[str, SimulatorOutcome] = {}
    retractors = [sim for sim in simulators if implements(sim, Retractor)]
    keys = [(sim.name, "retract") for sim in retractors]
    held = await _held(replays if replay else None, host,
                 [*keys, *((sim.name, "stage") for sim in simulators)], state)
    for sim in retractors:
        if (sim.name, "retract") in held:
            replays.replayed += 1  # type: ignore[union-attr]  # held only with replays
    retractors = [sim for sim in retractors if (sim.name, "retract") not in held]
    if retractors:
        # Before any stage removes a path, what is published stops naming
        # it (the CDI specs: "before them on the way down").  A failed
        # retract is that simulator's stage failure: its stage does not run.
        async with trio.open_nursery() as nursery:
            for sim in retractors:
                retract = sim.retract  # type: ignore[attr-defined]
                fn = _maybe_recorded(replays, host, (sim.name, "retract"), state, retract)
                nursery.start_soon(call, "stage", sim, fn, (host, state), outcomes)
        outcomes = {name: o for name, o in outcomes.items() if o.failed}
    async with trio.open_nursery() as nursery:
        for sim in simulators:
            if sim.name in outcomes:
                continue
            if (sim.name, "stage") in held:
                outcomes[sim.name] = _replayed("stage", sim, replays)  # type: ignore[arg-type]
                continue
            fn = _maybe_recorded(replays, host, (sim.name, "stage"), state, sim.stage)
            nursery.start_soon(call, "stage", sim, fn, (host, state), outcomes)
    return tuple(outcomes[sim.name] for sim in simulators)


def _maybe_recorded(
    replays: Replays | None,
    host: Host,
    key: CallKey,
    state: State,
    fn: Callable[..., Awaitable[object]],
) -> Callable[..., Awaitable[object]]:
    return fn if replays is None else replays.recorded(host, key, state.content_hash, fn)


async def supervise(
    supervisor: Supervisor | None,
    simulators: Sequence[Simulator],
    state: State,
    replays: Replays | None = None,
    *,
    replay: bool = True,
) -> tuple[SimulatorOutcome, ...]:
    """Start each daemon once (in the supervisor's nursery), later reload it.

    Concurrent like the Stage wave and collecting like it: one daemon
    slow to start (a fabric manager's init delay) does not hold up the
    others, and every start failure is reported.  A started daemon already
    delivered this very state (``replays``) is not reloaded: a reload only
    hands over the state, and the same state again would change nothing it
    serves (it would only wake its loops).
    """
    if supervisor is None:
        return ()
    daemons = [sim for sim in simulators if implements(sim, Daemon)]
    outcomes: dict[str, SimulatorOutcome] = {}
    async with trio.open_nursery() as nursery:
        for sim in daemons:
            started = supervisor.is_started(sim.name)
            if replays is not None and replay and started and (
                replays.delivered.get(sim.name) == state.content_hash
            ):
                outcomes[sim.name] = _replayed("supervise", sim, replays)
                continue
            deliver = supervisor.reload if started else supervisor.start
            if replays is not None:
                deliver = _delivering(replays, sim.name, state.content_hash, deliver)
            nursery.start_soon(call, "supervise", sim, deliver, (sim, state), outcomes)
    return tuple(outcomes[sim.name] for sim in daemons)


def _delivering(
    replays: Replays, name: str, content_hash: str, deliver: Callable[..., Awaitable[None]]
) -> Callable[..., Awaitable[None]]:
    """``deliver``, noting the state it delivered once it did."""

    async def run(*args: object) -> None:
        replays.delivered.pop(name, None)
        await deliver(*args)
        replays.delivered[name] = content_hash

    return run


async def apply(
    host: Host,
    simulators: Sequence[Simulator],
    state: State,
    replays: Replays | None = None,
    *,
    replay: bool = True,
) -> tuple[SimulatorOutcome, ...]:
    """The appliers in one plain nursery: the first failure cancels the rest.

    Outcomes of cancelled siblings are recorded as ``cancelled`` (not
    failures: they did nothing wrong); appliers that never got to run
    have no outcome.  ``replays`` and ``replay`` as for ``stage``.
    """
    appliers = [sim for sim in simulators if implements(sim, Applier)]
    held = await _held(replays if replay else None, host,
                 [(sim.name, "apply") for sim in appliers], state)
    outcomes: dict[str, SimulatorOutcome] = {}
    try:
        async with trio.open_nursery() as nursery:
            for sim in appliers:
                if (sim.name, "apply") in held:
                    outcomes[sim.name] = _replayed("apply", sim, replays)  # type: ignore[arg-type]
                    continue
                applier: Applier = sim  # type: ignore[assignment]
                fn = _maybe_recorded(replays, host, (sim.name, "apply"), state, applier.apply)
                nursery.start_soon(call, "apply", sim, fn, (host, state), outcomes, True)
    except* Exception:
        # Fail fast did its job; every failure is already in ``outcomes``.
        pass
    return tuple(outcomes[sim.name] for sim in appliers if sim.name in outcomes)


async def call(
    wave: str,
    sim: Simulator,
    fn: Callable[..., Awaitable[object]],
    args: tuple,
    outcomes: dict[str, SimulatorOutcome],
    reraise: bool = False,
) -> None:
    """Run one simulator's part of a wave and record how it went.

    ``reraise`` is the Apply wave's fail fast: the error is recorded
    *and* raised, so the nursery cancels the siblings.  The note added to
    the exception names the simulator and wave wherever the traceback
    ends up (a log line, an exception group).  ``MokkaError``s are the
    failures simulators raise on purpose and get one warning line;
    anything else is a bug and gets its traceback.
    """
    began = trio.current_time()

    def outcome(**kw: object) -> SimulatorOutcome:
        return SimulatorOutcome(
            name=sim.name,
            wave=wave,
            started_at=began,
            duration=trio.current_time() - began,
            wall=time.time(),
            **kw,  # type: ignore[arg-type]
        )

    try:
        await fn(*args)
    except trio.Cancelled:
        # A sibling applier failed first (or the daemon is stopping).
        outcomes[sim.name] = outcome(ok=False, cancelled=True, error="cancelled")
        raise
    except PassSuperseded:
        # Its converge gave way to a newer input (``Host.GIVE_WAY``): the pass
        # is dropped, and this is no failure of the simulator's.
        outcomes[sim.name] = outcome(ok=False, cancelled=True, error="superseded")
        return
    except Exception as exc:
        exc.add_note(f"in the {wave} wave of simulator {sim.name!r}")
        error = f"{type(exc).__name__}: {exc}"
        outcomes[sim.name] = outcome(ok=False, error=error, terminal=isinstance(exc, SpecError))
        extra = {"simulator": sim.name, "wave": wave}
        if isinstance(exc, MokkaError):
            # Expected kinds of failure: one line is enough.
            logger.warning("%s of %s failed: %s", wave, sim.name, error, extra=extra)
        else:
            logger.exception("%s of %s failed unexpectedly", wave, sim.name, extra=extra)
        if reraise:
            raise
    else:
        outcomes[sim.name] = outcome(ok=True)
