"""Supervision of the simulators that outlive a pass (``Daemon``s).

The supervisor owns one long-lived nursery (``Supervisor.run``), so a
daemon's lifetime belongs to the node daemon, not to the pass that started
it.  A pass starts a daemon with ``await supervisor.start(sim, state)``,
which runs ``await self._nursery.start(...)``: start-up errors surface in the
pass (which then fails and is retried), while the running daemon stays here.

After a successful start:

* later states arrive through ``reload(state)``;
* a ``run`` that crashes (or returns: a daemon is meant to run until
  cancelled) is restarted with capped exponential backoff, on the newest
  state; meanwhile the simulator is reported not ready, whatever it says
  itself ("daemon crashed: <error>, restarting in Ns");
* a run that stayed up for ``stable_after`` seconds counts as recovered: the
  next crash starts the backoff from the beginning again.

Cancelling the nursery (``stop()``, or the daemon's inner scope on SIGTERM)
stops every daemon; that is step one of teardown.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
import trio

from mokka.daemon.backoff import Backoff
from mokka.daemon.status import DaemonStatus, SupervisorStatus
from mokka.noderoot import Host
from mokka.simulators.base import Readiness

if TYPE_CHECKING:
    from mokka.simulators.base import Daemon, Simulator
    from mokka.state.model import State

logger = logging.getLogger(__name__)


class DaemonExited(Exception):
    """A daemon's ``run`` returned on its own; it is restarted like a crash."""


@attrs.define(eq=False)
class _StartedOnce:
    """The ``task_status`` a daemon's ``run`` sees, across restarts.

    Forwards the first ``started()`` to the pass waiting in ``start`` and, on
    every call, tells the supervisor that this incarnation is live.
    """

    #: the ``task_status`` of ``Supervisor.start``'s ``nursery.start`` call
    outer: trio.TaskStatus[None]
    #: called on every ``started()``: marks the daemon running in the status
    on_started: Any
    #: the first ``started()`` happened; later runs are restarts
    forwarded: bool = False

    def started(self, value: object = None) -> None:
        self.on_started()
        if not self.forwarded:
            self.forwarded = True
            self.outer.started()


@attrs.define(eq=False)
class Supervisor:
    """Start-once, reload and restart-with-backoff for ``Daemon`` simulators."""

    host: Host
    #: Restart schedule after a crash: 1, 2, 4, ... seconds, at most 30 s, so a
    #: crash-looping daemon neither spins nor stays down for long once fixed.
    backoff: Backoff = attrs.field(factory=lambda: Backoff(initial=1.0, factor=2.0, cap=30.0))
    #: Seconds a restarted ``run`` must stay up before its next crash starts
    #: the backoff over (a daemon that ran for a minute is not crash-looping).
    stable_after: float = 60.0
    #: the daemons' nursery while ``run`` runs
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    #: newest state per daemon: a restart runs on it
    _states: dict[str, State] = attrs.field(factory=dict, init=False)
    #: daemons whose first start succeeded (or is under way): start-once guard
    _started: set[str] = attrs.field(factory=set, init=False)
    #: private per-daemon status; ``status`` publishes a frozen copy
    _daemons: dict[str, DaemonStatus] = attrs.field(factory=dict, init=False)
    _status: SupervisorStatus = attrs.field(factory=SupervisorStatus, init=False)
    _done: trio.Event = attrs.field(factory=trio.Event, init=False)

    # ---- lifetime -----------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the daemons' nursery until cancelled; ``started()`` once it accepts daemons."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            for name, status in self._daemons.items():
                self._daemons[name] = attrs.evolve(status, phase="stopped", restart_at=None)
            self._publish()
            self._done.set()

    def stop(self) -> None:
        """Cancel every daemon (teardown step one); ``wait_stopped`` waits for it."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel(reason="supervisor stopping")

    async def wait_stopped(self) -> None:
        await self._done.wait()

    @property
    def running(self) -> bool:
        return self._nursery is not None

    # ---- what passes call --------------------------------------------

    def is_started(self, name: str) -> bool:
        return name in self._started

    async def start(self, sim: Simulator, state: State) -> None:
        """Start ``sim.run`` in the supervisor's nursery; returns once it reports started.

        Raises what ``run`` raised before ``started()``; the daemon then does
        not count as started and the next pass tries again.
        """
        if self._nursery is None:
            raise RuntimeError("the supervisor is not running")
        if sim.name in self._started:
            raise RuntimeError(f"daemon {sim.name} is already started")
        self._states[sim.name] = state
        self._started.add(sim.name)
        try:
            await self._nursery.start(self._keep_running, sim)
        except BaseException:
            self._started.discard(sim.name)
            self._states.pop(sim.name, None)
            raise

    async def reload(self, sim: Simulator, state: State) -> None:
        """Deliver ``state`` to a started daemon.

        A daemon waiting to be restarted only records it: the restart runs
        on the newest state anyway, and its ``reload`` would find nothing live.
        """
        self._states[sim.name] = state
        status = self._daemons.get(sim.name)
        if status is not None and status.phase == "running":
            daemon: Daemon = sim  # type: ignore[assignment]
            await daemon.reload(state)

    # ---- what health reads -------------------------------------------

    @property
    def status(self) -> SupervisorStatus:
        return self._status

    def readiness(self, sim: Simulator, own: Readiness | None = None) -> Readiness:
        """The simulator's own readiness (``own``, else asked now) unless its daemon is down."""
        status = self._status.daemons.get(sim.name)
        override = status.readiness_override() if status is not None else None
        if override is not None:
            return override
        return own if own is not None else sim.readiness

    # ---- internals ----------------------------------------------------

    def _publish(self) -> None:
        self._status = SupervisorStatus(daemons=dict(self._daemons))

    def _set(self, name: str, **changes: Any) -> None:
        current = self._daemons.get(name) or DaemonStatus(name=name, phase="running")
        self._daemons[name] = attrs.evolve(current, **changes)
        self._publish()

    async def _keep_running(self, sim: Simulator, *, task_status: trio.TaskStatus[None]) -> None:
        """One daemon's life: run, and after a crash wait the backoff and run again.

        Lives in the supervisor's nursery; only cancellation ends it.  The
        first incarnation's errors before ``started()`` propagate to
        ``start`` instead (the pass reports them).
        """
        name = sim.name
        daemon: Daemon = sim  # type: ignore[assignment]
        crashes = 0
        restarts = 0

        def live() -> None:
            self._set(name, phase="running", restarts=restarts, restart_at=None)

        status = _StartedOnce(outer=task_status, on_started=live)
        while True:
            began = trio.current_time()
            try:
                await daemon.run(self.host, self._states[name], task_status=status)
                raise DaemonExited(f"{name}: run returned")
            except Exception as exc:
                if not status.forwarded:
                    # Never started: the pass that asked sees the error, not us.
                    raise
                if trio.current_time() - began >= self.stable_after:
                    crashes = 0
                crashes += 1
                delay = self.backoff.delay(crashes)
                error = f"{type(exc).__name__}: {exc}"
                self._set(
                    name,
                    phase="crashed",
                    error=error,
                    restart_delay=delay,
                    restart_at=trio.current_time() + delay,
                )
                logger.exception(
                    "daemon %s crashed; restarting in %gs",
                    name,
                    delay,
                    extra={"simulator": name, "restart_in_s": delay},
                )
            await trio.sleep(delay)
            restarts += 1
            self._set(name, phase="restarting", restarts=restarts, restart_at=None)
            logger.info(
                "restarting daemon %s", name, extra={"simulator": name, "restarts": restarts}
            )
