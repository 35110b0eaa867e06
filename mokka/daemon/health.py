"""Probes and metrics over HTTP: a quart-trio app served by hypercorn in our nursery.

* ``/healthz`` (liveness): 200 while the last Stage wave completed without
  error, else 503 naming each failing simulator, its error and when; it
  recovers with the next good Stage wave.  Before any pass it is 200: a node
  waiting for a valid input is alive, and restarting it would not help.
* ``/readyz`` (readiness): 200 when at least one pass succeeded and every
  simulator reports itself ready (a crashed daemon is overridden to not
  ready), else 503 naming each one that is not, and why.
* ``/metrics``: Prometheus text (``mokka.daemon.metrics``).

Neither probe consults the state source: an unreachable or broken source
leaves the node serving what it already staged; the bodies only *report*
the newest source error.  Everything is read from the frozen snapshots the
reconciler and supervisor publish, so a probe never blocks a pass.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart import Response
from quart_trio import QuartTrio

from mokka.daemon import metrics
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.status import SupervisorStatus, iso
from mokka.daemon.supervisor import Supervisor
from mokka.simulators.base import Readiness, Simulator

logger = logging.getLogger(__name__)

#: Seconds hypercorn lets in-flight requests finish after the shutdown
#: trigger fires; probes are tiny, one second is plenty.
GRACEFUL_TIMEOUT = 1.0


@attrs.define(eq=False)
class DaemonView:
    """Read-only access to what the probes report.

    Each method builds one probe's answer from the published snapshots at
    the moment of the request; none awaits, so a probe cannot be held up by
    a pass in progress (and the kubelet's probe timeout never fires because
    a stage is slow).
    """

    reconciler: Reconciler
    simulators: Sequence[Simulator]
    supervisor: Supervisor | None = None

    def readiness(self) -> dict[str, Readiness]:
        """Each simulator's readiness; a crashing ``readiness`` counts as not ready."""
        result: dict[str, Readiness] = {}
        for sim in self.simulators:
            try:
                result[sim.name] = (
                    self.supervisor.readiness(sim) if self.supervisor else sim.readiness
                )
            except Exception as exc:
                logger.exception("readiness of %s failed", sim.name, extra={"simulator": sim.name})
                result[sim.name] = Readiness.not_ready(f"readiness check failed: {exc}")
        return result

    def supervisor_status(self) -> SupervisorStatus:
        """The supervisor's snapshot; an empty one for a view without daemons (``--once``)."""
        return self.supervisor.status if self.supervisor else SupervisorStatus()

    def common(self) -> dict:
        """Fields both probes report."""
        status = self.reconciler.status
        since = (
            None
            if status.last_success_at is None
            else round(trio.current_time() - status.last_success_at, 6)
        )
        return {
            "observed_generation": status.observed_generation,
            "seen_generation": status.seen_generation,
            "phase": status.phase,
            "last_pass": None if status.last_pass is None else status.last_pass.as_json(),
            "seconds_since_last_success": since,
            "source_error": None
            if status.source_error is None
            else {"error": status.source_error, "at": iso(status.source_error_wall)},
        }

    def healthz(self) -> tuple[dict, int]:
        """Liveness: fails only on a failed Stage wave, which a restart may cure.

        Apply failures and unready simulators do not fail it: restarting the
        pod would tear down what works without fixing what does not.
        """
        status = self.reconciler.status
        stage = {} if status.last_pass is None else {o.name: o for o in status.last_pass.stage}
        failures = status.stage_failures
        body = {
            "status": "failing" if failures else "ok",
            "failed": {o.name: {"error": o.error, "at": iso(o.wall)} for o in failures},
            "simulators": {
                sim.name: {"stage": stage[sim.name].as_json() if sim.name in stage else None}
                for sim in self.simulators
            },
            **self.common(),
        }
        return body, 503 if failures else 200

    def readyz(self) -> tuple[dict, int]:
        """Readiness: one successful pass, and every simulator ready.

        ``reasons`` is the human list (what ``kubectl describe`` shows);
        ``not_ready`` the same keyed by simulator for tools.
        """
        status = self.reconciler.status
        readiness = self.readiness()
        not_ready = {name: r.reason for name, r in readiness.items() if not r.ready}
        reasons = [f"{name}: {reason}" for name, reason in not_ready.items()]
        if status.last_success is None:
            reasons.insert(0, "no reconcile pass has succeeded yet")
        ready = not reasons
        body = {
            "status": "ready" if ready else "not ready",
            "reasons": reasons,
            "not_ready": not_ready,
            "simulators": {
                name: {"ready": r.ready, "reason": r.reason} for name, r in readiness.items()
            },
            "daemons": {
                name: {"phase": d.phase, "restarts": d.restarts, "error": d.error}
                for name, d in self.supervisor_status().daemons.items()
            },
            **self.common(),
        }
        return body, 200 if ready else 503

    def metrics(self) -> str:
        """The Prometheus text body (``mokka.daemon.metrics``)."""
        return metrics.render(
            self.reconciler.status,
            self.supervisor_status(),
            self.readiness(),
            now=trio.current_time(),
        )


def create_app(view: DaemonView) -> QuartTrio:
    """The probe app; routes only read ``view``.

    quart-trio rather than a bare ASGI callable: it runs on trio in our
    nursery, and gives JSON responses for ``(dict, status)`` returns.
    """
    app = QuartTrio("mokka")

    @app.get("/healthz")
    async def healthz():
        return view.healthz()

    @app.get("/readyz")
    async def readyz():
        return view.readyz()

    @app.get("/metrics")
    async def metrics_route():
        return Response(view.metrics(), status=200, content_type=metrics.CONTENT_TYPE)

    return app


def _bind(host: str, port: int) -> str:
    """hypercorn's bind spelling: IPv6 literals in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve_health(
    app: QuartTrio,
    addr: tuple[str, int],
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``addr`` until ``shutdown_trigger`` returns; ``started(port)``.

    The bound port is reported (port 0 binds any free one), so tests and the
    log know where the probes are.
    """
    # A fresh Config per server: hypercorn's Config is mutable, and sharing
    # one would make two daemons in one process (tests) step on each other.
    config = Config()
    config.bind = [_bind(*addr)]
    config.accesslog = None  # probes every few seconds would drown the log
    config.errorlog = logging.getLogger("mokka.daemon.health.server")
    config.graceful_timeout = GRACEFUL_TIMEOUT

    async with trio.open_nursery() as nursery:
        # hypercorn reports its binds (``http://127.0.0.1:40123``) once listening.
        binds: list[str] = await nursery.start(
            functools.partial(serve, app, config, shutdown_trigger=shutdown_trigger)
        )
        port = int(binds[0].rsplit(":", 1)[1])
        logger.info(
            "health probes on http://%s/healthz /readyz /metrics",
            _bind(addr[0], port),
            extra={"port": port},
        )
        task_status.started(port)
