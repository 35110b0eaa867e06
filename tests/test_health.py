"""/healthz, /readyz and /metrics over real HTTP: hypercorn on port 0, httpx as the client."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import trio
import trio.testing

from mokka.daemon.backoff import Backoff
from mokka.daemon.health import DaemonView, create_app, serve_health
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.supervisor import Supervisor
from mokka.daemon.teardown import teardown
from mokka.errors import SpecError, StageError
from mokka.noderoot.host import Host
from mokka.simulators.base import Readiness
from mokka.state.sources.base import SourceUpdate
from tests.fakes import FakeApplier, FakeDaemon, FakeSimulator, make_state
from tests.support import snapshot


@attrs.define
class Probe:
    client: httpx.AsyncClient
    reconciler: Reconciler
    supervisor: Supervisor
    view: DaemonView

    async def get(self, path: str) -> tuple[int, dict]:
        response = await self.client.get(path)
        assert response.headers["content-type"] == "application/json"
        return response.status_code, response.json()


@asynccontextmanager
async def served(host: Host, sims) -> AsyncIterator[Probe]:
    """The probe app on 127.0.0.1:<free port>, over a reconciler and a running supervisor."""
    supervisor = Supervisor(host, backoff=Backoff(initial=1, cap=30))
    reconciler = Reconciler(host, sims, supervisor=supervisor)
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        view = DaemonView(reconciler, sims, supervisor)
        app = create_app(view)
        port = await nursery.start(
            lambda task_status: serve_health(
                app, ("127.0.0.1", 0), shutdown_trigger=shutdown.wait, task_status=task_status
            )
        )
        assert port > 0
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            yield Probe(client, reconciler, supervisor, view)
        shutdown.set()
        supervisor.stop()
    assert (await teardown(host, sims, timeout=10)).clean


async def test_before_any_pass_alive_but_not_ready(autojump_clock, host: Host):
    async with served(host, [FakeSimulator("a")]) as probe:
        code, body = await probe.get("/healthz")
        assert code == 200
        assert body["status"] == "ok"
        assert body["observed_generation"] is None
        assert body["last_pass"] is None
        assert body["simulators"] == {"a": {"stage": None}}
        code, body = await probe.get("/readyz")
        assert code == 503
        assert body["reasons"] == ["no reconcile pass has succeeded yet"]
        assert body["simulators"] == {"a": {"ready": True, "reason": ""}}


async def test_stage_failures_fail_healthz_until_the_next_good_stage(
    autojump_clock, host: Host, node_root: Path
):
    before = snapshot(node_root)
    sims = [
        FakeSimulator("gpudriver"),
        FakeSimulator("pcibus", stage_errors=[StageError("sysfs tree: disk full")]),
        FakeSimulator("imex", stage_errors=[RuntimeError("archive corrupt")]),
    ]
    async with served(host, sims) as probe:
        await trio.sleep(10)
        await probe.reconciler.reconcile_once(make_state(3))
        code, body = await probe.get("/healthz")
        assert code == 503
        assert body["status"] == "failing"
        assert {n: f["error"] for n, f in body["failed"].items()} == {
            "pcibus": "StageError: sysfs tree: disk full",
            "imex": "RuntimeError: archive corrupt",
        }
        assert all(
            re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", f["at"]) for f in body["failed"].values()
        )
        assert body["simulators"]["gpudriver"]["stage"]["ok"] is True
        assert body["simulators"]["pcibus"]["stage"]["ok"] is False
        assert body["observed_generation"] == 3
        assert body["last_pass"]["outcome"] == "stage-failed"
        assert body["last_pass"]["retry_in_seconds"] == 1.0
        code, body = await probe.get("/readyz")
        assert code == 503
        assert body["reasons"] == ["no reconcile pass has succeeded yet"]

        await trio.sleep(5)
        await probe.reconciler.reconcile_once(make_state(3), attempt=2)
        code, body = await probe.get("/healthz")
        assert (code, body["status"], body["failed"]) == (200, "ok", {})
        code, body = await probe.get("/readyz")
        assert (code, body["status"], body["reasons"]) == (200, "ready", [])
        await trio.sleep(42)
        code, body = await probe.get("/readyz")
        assert body["seconds_since_last_success"] == 42
    assert snapshot(node_root) == before


async def test_readyz_names_each_simulator_that_is_not_ready(
    autojump_clock, host: Host, node_root: Path
):
    before = snapshot(node_root)
    sims = [
        FakeSimulator(
            "gpudriver", ready=Readiness.not_ready("placeholder device nodes (no CAP_MKNOD)")
        ),
        FakeApplier("cri", ready=Readiness.not_ready("containerd restart pending")),
        FakeSimulator("nvlink"),
    ]
    async with served(host, sims) as probe:
        assert (await probe.reconciler.reconcile_once(make_state(1))).ok
        code, body = await probe.get("/readyz")
        assert code == 503
        assert body["not_ready"] == {
            "gpudriver": "placeholder device nodes (no CAP_MKNOD)",
            "cri": "containerd restart pending",
        }
        assert body["reasons"] == [
            "gpudriver: placeholder device nodes (no CAP_MKNOD)",
            "cri: containerd restart pending",
        ]
        assert body["simulators"]["nvlink"] == {"ready": True, "reason": ""}
        code, _ = await probe.get("/healthz")
        assert code == 200
    assert snapshot(node_root) == before


async def test_a_crashed_daemon_is_not_ready_until_restarted(
    autojump_clock, host: Host, node_root: Path
):
    before = snapshot(node_root)
    daemon = FakeDaemon("fabricmanager", crash_after=[5], crash_error=RuntimeError("fm died"))
    async with served(host, [daemon, FakeSimulator("gpudriver")]) as probe:
        assert (await probe.reconciler.reconcile_once(make_state(1))).ok
        code, body = await probe.get("/readyz")
        assert code == 200
        assert body["daemons"]["fabricmanager"]["phase"] == "running"
        await trio.sleep(5.5)  # crashed at 5, restart due at 6
        code, body = await probe.get("/readyz")
        assert code == 503
        assert body["not_ready"] == {
            "fabricmanager": "daemon crashed: RuntimeError: fm died, restarting in 1s"
        }
        assert body["daemons"]["fabricmanager"] == {
            "phase": "crashed",
            "restarts": 0,
            "error": "RuntimeError: fm died",
        }
        # Liveness does not care: the Stage wave was fine.
        assert (await probe.get("/healthz"))[0] == 200
        await trio.sleep(1)
        code, body = await probe.get("/readyz")
        assert code == 200
        assert body["daemons"]["fabricmanager"]["restarts"] == 1
    assert snapshot(node_root) == before


async def test_bodies_report_the_source_error_without_failing_probes(autojump_clock, host: Host):
    sim = FakeSimulator("a")
    async with served(host, [sim]) as probe:
        state = make_state(1)
        assert (await probe.reconciler.reconcile_once(state)).ok
        probe.reconciler._note_update(
            SourceUpdate(
                state=state, error=SpecError("profile.yaml: devices[0].uuid: 7, expected a string")
            )
        )
        for path in ("/healthz", "/readyz"):
            code, body = await probe.get(path)
            assert code == 200
            assert (
                body["source_error"]["error"]
                == "profile.yaml: devices[0].uuid: 7, expected a string"
            )


# /metrics: tests/test_metrics.py (with prometheus_client's parser, over this module's
# `served`).


# ---- the node as served, bounded bodies -------------------------------------


@attrs.define(eq=False)
class GatedSimulator(FakeSimulator):
    """Stages of generation 2 and later wait for ``gate``: a pass held open."""

    gate: trio.Event = attrs.field(factory=trio.Event)

    async def stage(self, host: Host, state) -> None:
        await super().stage(host, state)
        if state.generation >= 2:
            await self.gate.wait()


async def test_readyz_reports_the_served_state_while_a_new_one_reconciles(
    autojump_clock, host: Host
):
    sim = GatedSimulator("gpudriver")
    async with served(host, [sim]) as probe:
        assert (await probe.reconciler.reconcile_once(make_state(1))).ok
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe.reconciler.reconcile_once, make_state(2))
            await trio.testing.wait_all_tasks_blocked()
            # Half-way between two states, the simulator's live answer is not ready...
            sim.ready = Readiness.not_ready("driver tree half-way to generation 2")
            code, body = await probe.get("/readyz")
            # ...but the node still serves generation 1, which was ready.
            assert code == 200, body
            assert body["phase"] == "reconciling"
            assert body["simulators"]["gpudriver"] == {"ready": True, "reason": ""}
            sim.gate.set()
        # The pass is over: its outcome is what the node serves now.
        code, body = await probe.get("/readyz")
        assert code == 503
        assert body["not_ready"] == {"gpudriver": "driver tree half-way to generation 2"}


async def test_a_crash_overrides_the_served_readiness_at_once(autojump_clock, host: Host):
    sim = FakeDaemon("imex", crash_after=[5.0])
    gate = GatedSimulator("gpudriver")
    async with served(host, [gate, sim]) as probe:
        assert (await probe.reconciler.reconcile_once(make_state(1))).ok
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe.reconciler.reconcile_once, make_state(2))
            await trio.sleep(5.5)  # the daemon crashed during the pass (restart due at 6)
            code, body = await probe.get("/readyz")
            assert code == 503
            assert body["not_ready"]["imex"].startswith("daemon crashed: RuntimeError: boom")
            gate.gate.set()


async def test_bodies_quote_at_most_a_short_excerpt_of_an_error(autojump_clock, host: Host):
    huge = "x" * 5000
    sims = [FakeSimulator("gpudriver", always_fail_stage=StageError(f"profile.yaml: {huge}"))]
    async with served(host, sims) as probe:
        await probe.reconciler.reconcile_once(make_state(1))
        probe.reconciler._note_update(SourceUpdate(state=None, error=SpecError(huge)))
        for path in ("/healthz", "/readyz"):
            response = await probe.client.get(path)
            assert huge not in response.text
            assert len(response.text) < 3000, path
        _, body = await probe.get("/healthz")
        error = body["failed"]["gpudriver"]["error"]
        assert error.startswith("StageError: profile.yaml: xxx")
        assert len(error) == 200
        assert error.endswith("...")
        assert len(body["source_error"]["error"]) < 250


async def test_placeholder_device_reasons_are_said_once_with_the_count(autojump_clock, host: Host):
    from mokka.noderoot.artifacts import CharDevice
    from mokka.noderoot.fsops import placeholder_reason

    devices = [CharDevice(f"/dev/nvidia{i}", 195, i) for i in range(14)]
    reason = "; ".join([*(placeholder_reason(d) for d in devices), "nvidia-smi missing"])
    sims = [FakeSimulator("gpudriver", ready=Readiness.not_ready(reason))]
    async with served(host, sims) as probe:
        assert (await probe.reconciler.reconcile_once(make_state(1))).ok
        code, body = await probe.get("/readyz")
    assert code == 503
    said = body["not_ready"]["gpudriver"]
    assert said.count("CAP_MKNOD") == 1
    assert said == (
        "14 device nodes are placeholder files (/dev/nvidia0, /dev/nvidia1 and 12 more): "
        "no CAP_MKNOD; consumers cannot open them (run as root to get real nodes); "
        "nvidia-smi missing"
    )


async def test_a_daemon_waiting_for_the_root_says_so(autojump_clock, host: Host):
    sims = [FakeSimulator("gpudriver")]
    async with served(host, sims) as probe:
        view = probe.view
        view.set_holdup("waiting for the node root /r: another Mokka daemon (pid 42) holds it")
        code, body = await probe.get("/readyz")
        assert code == 503
        assert body["reasons"][0].startswith("waiting for the node root /r: ")
        assert "(pid 42)" in body["reasons"][0]
        assert body["phase"] == "waiting for the node root"
        code, _ = await probe.get("/healthz")
        assert code == 200  # alive: a restart would only wait again
        view.set_holdup(None)
        code, body = await probe.get("/readyz")
        assert body["reasons"] == ["no reconcile pass has succeeded yet"]
