"""The three waves of one reconcile pass (ARCHITECTURE §3), as functions.

Each wave runs one kind of call over the simulators that take it and returns
one ``SimulatorOutcome`` per simulator it ran: ``stage`` (every simulator,
after the retractors; collects every failure), ``supervise`` (start each
daemon once, later reload it; collects), ``apply`` (the appliers in one
plain nursery: fail fast).  The reconcile loop (``mokka.daemon.reconciler``)
sequences them around the barrier and keeps the bookkeeping; the waves keep
no state, so they read one way: simulators in, outcomes out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import trio

from mokka.daemon.status import SimulatorOutcome
from mokka.daemon.supervisor import Supervisor
from mokka.errors import MokkaError, SpecError
from mokka.host import Host
from mokka.simulators.base import Applier, Daemon, Retractor, Simulator

if TYPE_CHECKING:
    from mokka.state.model import State

# Under the reconciler's name: a wave's failure is a line about its pass, and
# log readers (and the documented examples) find it there.
logger = logging.getLogger("mokka.daemon.reconciler")


async def stage(
    host: Host, simulators: Sequence[Simulator], state: State
) -> tuple[SimulatorOutcome, ...]:
    """Every simulator's ``stage`` in parallel; collects all outcomes, raises none.

    ``call`` swallows each ``Exception`` after recording it, so the
    nursery only ever raises for cancellation.
    """
    outcomes: dict[str, SimulatorOutcome] = {}
    retractors = [sim for sim in simulators if isinstance(sim, Retractor)]
    if retractors:
        # Before any stage removes a path, what is published stops naming
        # it (the CDI specs: "before them on the way down").  A failed
        # retract is that simulator's stage failure: its stage does not run.
        async with trio.open_nursery() as nursery:
            for sim in retractors:
                retract = sim.retract  # type: ignore[attr-defined]
                nursery.start_soon(call, "stage", sim, retract, (host, state), outcomes)
        outcomes = {name: o for name, o in outcomes.items() if o.failed}
    async with trio.open_nursery() as nursery:
        for sim in simulators:
            if sim.name in outcomes:
                continue
            nursery.start_soon(call, "stage", sim, sim.stage, (host, state), outcomes)
    return tuple(outcomes[sim.name] for sim in simulators)


async def supervise(
    supervisor: Supervisor | None, simulators: Sequence[Simulator], state: State
) -> tuple[SimulatorOutcome, ...]:
    """Start each daemon once (in the supervisor's nursery), later reload it.

    Concurrent like the Stage wave and collecting like it: one daemon
    slow to start (a fabric manager's init delay) does not hold up the
    others, and every start failure is reported.
    """
    if supervisor is None:
        return ()
    daemons = [sim for sim in simulators if isinstance(sim, Daemon)]
    outcomes: dict[str, SimulatorOutcome] = {}
    async with trio.open_nursery() as nursery:
        for sim in daemons:
            deliver = supervisor.reload if supervisor.is_started(sim.name) else supervisor.start
            nursery.start_soon(call, "supervise", sim, deliver, (sim, state), outcomes)
    return tuple(outcomes[sim.name] for sim in daemons)


async def apply(
    host: Host, simulators: Sequence[Simulator], state: State
) -> tuple[SimulatorOutcome, ...]:
    """The appliers in one plain nursery: the first failure cancels the rest.

    Outcomes of cancelled siblings are recorded as ``cancelled`` (not
    failures: they did nothing wrong); appliers that never got to run
    have no outcome.
    """
    appliers = [sim for sim in simulators if isinstance(sim, Applier)]
    outcomes: dict[str, SimulatorOutcome] = {}
    try:
        async with trio.open_nursery() as nursery:
            for sim in appliers:
                applier: Applier = sim  # type: ignore[assignment]
                nursery.start_soon(
                    call, "apply", sim, applier.apply, (host, state), outcomes, True
                )
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
