"""Teardown: the inverse of a reconcile (ARCHITECTURE §4).

1. cancel the daemons (the supervisor's nursery) and wait for them to stop,
2. ``revoke`` on every applier, concurrently,
3. release runtime state that lives inside staged directories (the
   ``mokka ctl`` overrides file in the engine config directory: it belongs
   to this pod's lifetime, and left in place it would keep that directory,
   and so the node, from being restored),
4. ``discard`` on every simulator, concurrently.

Best effort: every call has its own ``try/except Exception``, so one
failure stops neither its siblings nor the next step.  An expected fault (a
``MokkaError``: a full or read-only root, refused bookkeeping) is one warning
line; anything else is a bug and is logged with its traceback.  A discard
removes its owner's half-written manifest snapshot too, or fails saying
which file is left, so the exit code says whether the node was left clean.

The whole sequence runs under ``trio.move_on_after(timeout, shield=True)``:
it completes although the scope around it was cancelled (that is how it
gets called, on SIGTERM), and it gives up at the deadline
(``--shutdown-timeout``, kept under the pod's termination grace period) so
the kubelet's SIGKILL never lands mid-write.  Nothing is raised past
teardown; the returned ``TeardownReport`` says how it went.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import attrs
import trio

from mokka.daemon.supervisor import Supervisor
from mokka.errors import MokkaError
from mokka.noderoot import Host
from mokka.simulators.base import Applier, Simulator, implements

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class TeardownReport:
    """What teardown managed; ``clean`` means every call finished without error in time."""

    #: ``(step, simulator, "Type: message")`` per failed call
    failures: tuple[tuple[str, str, str], ...] = ()
    #: the deadline cut teardown short (some calls may not have finished)
    timed_out: bool = False
    #: seconds teardown took (trio clock)
    duration: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.failures and not self.timed_out


async def teardown(
    host: Host,
    simulators: Sequence[Simulator],
    *,
    # Teardown owns its deadline: it must be shielded *and* bounded, which a
    # caller's ``fail_after`` cannot give (the shield would hide it).
    timeout: float,  # noqa: ASYNC109
    supervisor: Supervisor | None = None,
    release_runtime_state: Callable[[], object] | None = None,
) -> TeardownReport:
    """Stop daemons, revoke, discard; shielded, bounded, never raises for a simulator."""
    began = trio.current_time()
    failures: list[tuple[str, str, str]] = []

    async def best_effort(step: str, sim: Simulator, call) -> None:
        """One call; its ``Exception`` is logged and recorded, never raised.

        ``Cancelled`` (the deadline) is a ``BaseException`` and passes: that
        is how the deadline ends the calls still running.
        """
        try:
            await call(host)
        except Exception as exc:
            failures.append((step, sim.name, f"{type(exc).__name__}: {exc}"))
            extra = {"simulator": sim.name, "step": step}
            if isinstance(exc, MokkaError):
                logger.warning("teardown: %s of %s failed: %s", step, sim.name, exc, extra=extra)
            else:
                logger.exception("teardown: %s of %s failed", step, sim.name, extra=extra)

    logger.info("teardown: stopping daemons, revoking, discarding", extra={"timeout_s": timeout})
    with trio.move_on_after(timeout, shield=True) as scope:
        if supervisor is not None and supervisor.running:
            # In the daemon the inner scope's cancellation already stopped them;
            # called on its own (tests, embedding), this is step one.
            supervisor.stop()
            await supervisor.wait_stopped()
        async with trio.open_nursery() as nursery:
            for sim in simulators:
                if implements(sim, Applier):
                    nursery.start_soon(best_effort, "revoke", sim, sim.revoke)
        if release_runtime_state is not None:
            try:
                await trio.to_thread.run_sync(release_runtime_state)
            except Exception as exc:
                failures.append(("release", "runtime-state", f"{type(exc).__name__}: {exc}"))
                logger.exception("teardown: releasing runtime state failed")
        async with trio.open_nursery() as nursery:
            for sim in simulators:
                nursery.start_soon(best_effort, "discard", sim, sim.discard)
    report = TeardownReport(
        failures=tuple(failures),
        timed_out=scope.cancelled_caught,
        duration=trio.current_time() - began,
    )
    if report.timed_out:
        logger.error(
            "teardown: deadline of %gs hit; the node may keep artifacts (run `mokka cleanup`)",
            timeout,
            extra={"failures": len(failures)},
        )
    else:
        logger.info(
            "teardown finished",
            extra={"duration_s": round(report.duration, 6), "failures": len(failures)},
        )
    return report
