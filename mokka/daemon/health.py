"""Probes and metrics over HTTP: a bare ASGI app served by hypercorn in our nursery.

* ``/healthz`` (liveness): 200 while the last Stage wave completed without
  error, else 503 naming each failing simulator, its error and when; it
  recovers with the next good Stage wave.  Before any pass it is 200: a node
  waiting for a valid input is alive, and restarting it would not help.
* ``/readyz`` (readiness): 200 when at least one pass succeeded and every
  simulator reports itself ready (a crashed daemon is overridden to not
  ready), else 503 naming each one that is not, and why.  It reports the
  node as it is served: while a pass runs, each simulator's readiness is
  the one the last pass left (the node keeps serving that state; a
  simulator's live answer then describes a node half-way between two
  states).  Before the node root is this daemon's (a second daemon waiting
  for the first one's lock) it is 503 saying whose lock it waits for.
* ``/metrics``: Prometheus text (``mokka.daemon.metrics``).

Neither probe consults the state source: an unreachable or broken source
leaves the node serving what it already staged; the bodies only *report*
the newest source error.  Everything is read from the frozen snapshots the
reconciler and supervisor publish, so a probe never blocks a pass.

Every text that may come from input (errors, reasons) is cut to
``status.MAX_TEXT`` characters: enough to name the file and the field,
never a file's content.  The daemon logs where the probes are itself (one
line), and hypercorn only speaks HTTP on each connection: accepting them,
and bounding what a client can do to the server, is
``mokka.daemon.probeserver``'s.

Why a bare ASGI app rather than quart-trio (the stack the design names):
three GET routes that return a frozen snapshot as JSON need no routing,
templating or request objects, and the framework is paid for on every node
of the fleet. Measured on the 2-core reference machine: importing
``quart_trio`` takes about 470 ms and 42 MiB (``hypercorn.trio`` alone:
about 155 ms and 29 MiB), and under the probe benchmark
(``bench/probe_latency.py``) the bare app served about 620 requests/s where
quart served about 390. hypercorn still serves it, inside our nursery, as
the design asks.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from mokka.daemon.reconciler import Reconciler
from mokka.daemon.status import SupervisorStatus, excerpt, iso, summarize_reason
from mokka.daemon.supervisor import Supervisor
from mokka.errors import SpecError
from mokka.simulators.base import Readiness, Simulator

logger = logging.getLogger(__name__)

#: Seconds hypercorn lets in-flight requests finish after the shutdown
#: trigger fires; probes are tiny, one second is plenty.
GRACEFUL_TIMEOUT = 1.0


class ListenError(SpecError):
    """The probes cannot listen on ``--health-addr`` (in use, not an address of this host).

    A ``SpecError``: the flag must change, waiting does not help.
    """


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
    #: Why the daemon has not started converging (waiting for the node
    #: root's lock); ``None`` once it has.
    holdup: str | None = None

    def set_holdup(self, message: str | None) -> None:
        self.holdup = message

    def readiness(self) -> dict[str, Readiness]:
        """Each simulator's readiness as served; a crashing ``readiness`` counts as not ready.

        While a pass runs, the readiness the last pass left stands in for
        the simulators' own (see the module docstring); a daemon's crash
        overrides either, at once.
        """
        status = self.reconciler.status
        settled = status.settled_readiness if status.phase == "reconciling" else None
        result: dict[str, Readiness] = {}
        for sim in self.simulators:
            own = None if settled is None else settled.get(sim.name)
            try:
                if self.supervisor is not None:
                    readiness = self.supervisor.readiness(sim, own)
                else:
                    readiness = own if own is not None else sim.readiness
            except Exception as exc:
                logger.exception("readiness of %s failed", sim.name, extra={"simulator": sim.name})
                readiness = Readiness.not_ready(f"readiness check failed: {exc}")
            result[sim.name] = attrs.evolve(
                readiness, reason=excerpt(summarize_reason(readiness.reason))
            )
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
            "phase": "waiting for the node root" if self.holdup else status.phase,
            "last_pass": None if status.last_pass is None else status.last_pass.as_json(),
            "seconds_since_last_success": since,
            "source_error": None
            if status.source_error is None
            else {"error": excerpt(status.source_error), "at": iso(status.source_error_wall)},
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
            "failed": {o.name: {"error": excerpt(o.error), "at": iso(o.wall)} for o in failures},
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
        if self.holdup is not None:
            reasons.insert(0, self.holdup)
        elif status.last_success is None:
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
                name: {"phase": d.phase, "restarts": d.restarts, "error": excerpt(d.error)}
                for name, d in self.supervisor_status().daemons.items()
            },
            **self.common(),
        }
        return body, 200 if ready else 503

    def metrics(self) -> str:
        """The Prometheus text body (``mokka.daemon.metrics``)."""
        # imported at the first scrape: prometheus_client (with the http.server,
        # urllib and email it brings) is among a daemon's largest imports, and
        # a node nobody scrapes never needs it
        from mokka.daemon import metrics

        return metrics.render(
            self.reconciler.status,
            self.supervisor_status(),
            self.readiness(),
        )


#: An ASGI application: ``await app(scope, receive, send)``.
ProbeApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]],
                    Awaitable[None]]

_JSON = b"application/json"
#: Imported at the first scrape only (``DaemonView.metrics``).
_METRICS_MODULE = "mokka.daemon.metrics"
#: ``metrics.CONTENT_TYPE``, spelt here so that serving the probes does not
#: import the metrics module (``tests/test_metrics.py`` keeps the two equal).
METRICS_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def _json(body: dict, status: int) -> tuple[int, bytes, bytes]:
    return status, _JSON, json.dumps(body, separators=(",", ":")).encode()


def create_app(view: DaemonView) -> ProbeApp:
    """The probe app, a bare ASGI callable; routes only read ``view``.

    Bare rather than a web framework: a probe is three fixed routes, and a
    framework's per-request machinery (request contexts, routing tables,
    response wrappers) cost several times what building the answer does,
    which under 50 concurrent probes during a pass was most of the latency.
    ``HEAD`` is answered like ``GET`` without the body; any other method is
    405, any other path 404.
    """
    routes: dict[str, Callable[[], tuple[int, bytes, bytes]]] = {
        "/healthz": lambda: _json(*view.healthz()),
        "/readyz": lambda: _json(*view.readyz()),
        "/metrics": lambda: (200, METRICS_CONTENT_TYPE, view.metrics().encode()),
    }

    async def app(scope: dict, receive, send) -> None:
        if scope["type"] == "lifespan":
            # Nothing to start or stop: acknowledge both phases.
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        route = routes.get(scope["path"])
        if route is None:
            status, kind, body = _json({"error": "not found", "paths": sorted(routes)}, 404)
        elif scope["method"] not in ("GET", "HEAD"):
            status, kind, body = _json({"error": "method not allowed, expected GET"}, 405)
        else:
            if scope["path"] == "/metrics" and _METRICS_MODULE not in sys.modules:
                # The first scrape loads the metrics library (``DaemonView.metrics``):
                # in a worker thread, so reading its modules never holds up the loop.
                await trio.to_thread.run_sync(importlib.import_module, _METRICS_MODULE)
            status, kind, body = route()
        await send({
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())],
        })
        await send({
            "type": "http.response.body",
            "body": b"" if scope["method"] == "HEAD" else body,
        })

    return app


def _bind(host: str, port: int) -> str:
    """hypercorn's bind spelling: IPv6 literals in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve_health(
    app: ProbeApp,
    addr: tuple[str, int],
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``addr`` until ``shutdown_trigger`` returns; ``started(port)``.

    The bound port is reported (port 0 binds any free one), so tests and the
    log know where the probes are.  The socket is bound here, before
    serving starts, so a busy address is one ``ListenError`` naming the
    flag instead of a nest of exception groups.  hypercorn speaks HTTP on
    each connection; ``mokka.daemon.probeserver`` accepts them and bounds
    what a client can do to the server (errors, floods, clients that never
    read).
    """
    # imported here: hypercorn (with its HTTP/1, HTTP/2 and WebSocket stacks)
    # is among a daemon's largest imports, and ``--once`` never serves probes
    from hypercorn.config import Config
    from hypercorn.utils import wrap_app

    from mokka.daemon.probeserver import ProbeServer

    # A fresh Config per server: hypercorn's Config is mutable, and sharing
    # one would make two daemons in one process (tests) step on each other.
    config = Config()
    config.bind = [_bind(*addr)]
    config.accesslog = None  # probes every few seconds would drown the log
    config.errorlog = logging.getLogger("mokka.daemon.health.server")
    config.graceful_timeout = GRACEFUL_TIMEOUT

    try:
        sockets = config.create_sockets()
    except OSError as exc:
        raise ListenError(
            f"--health-addr: cannot listen on {_bind(*addr)}: {(exc.strerror or str(exc)).lower()}"
        ) from None
    (sock,) = sockets.insecure_sockets
    sock.listen(config.backlog)
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    server = ProbeServer(wrap_app(app, config.wsgi_max_body_size, "asgi"), config)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            functools.partial(server.serve, listener, shutdown_trigger=shutdown_trigger)
        )
        port = sock.getsockname()[1]
        logger.info(
            "health probes on http://%s/healthz /readyz /metrics",
            _bind(addr[0], port),
            extra={"port": port},
        )
        task_status.started(port)
