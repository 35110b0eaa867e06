"""/healthz, /readyz and /metrics over real HTTP: hypercorn on port 0, httpx as the client."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import pytest
import trio
import trio.testing

from mokka.daemon.backoff import Backoff
from mokka.daemon.health import DaemonView, create_app, serve_health
from mokka.daemon.metrics import format_value
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.supervisor import Supervisor
from mokka.daemon.teardown import teardown
from mokka.errors import SpecError, StageError
from mokka.host import Host
from mokka.simulators.base import Readiness
from mokka.state.sources.base import SourceUpdate
from tests.fakes import FakeApplier, FakeDaemon, FakeSimulator, make_state
from tests.support import snapshot


@attrs.define
class Probe:
    client: httpx.AsyncClient
    reconciler: Reconciler
    supervisor: Supervisor

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
        app = create_app(DaemonView(reconciler, sims, supervisor))
        port = await nursery.start(
            lambda task_status: serve_health(
                app, ("127.0.0.1", 0), shutdown_trigger=shutdown.wait, task_status=task_status
            )
        )
        assert port > 0
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            yield Probe(client, reconciler, supervisor)
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


# ---- /metrics -------------------------------------------------------------

_SAMPLE = re.compile(
    r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def parse_prometheus(text: str) -> tuple[dict[str, str], dict[tuple[str, frozenset], float]]:
    """A strict little parser of the text format: returns (family → type, samples)."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    helps: set[str] = set()
    samples: dict[tuple[str, frozenset], float] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            assert name not in helps, f"second HELP for {name}"
            helps.add(name)
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "summary", "histogram", "untyped"), line
            assert name not in types, f"second TYPE for {name}"
            types[name] = kind
            continue
        assert line, "empty line"
        assert not line.startswith("#"), f"unexpected comment {line!r}"
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name = match["name"]
        family = re.sub(r"_(sum|count)$", "", name) if name not in types else name
        assert family in types, f"sample {name} before its TYPE line"
        if types[family] == "summary":
            assert name != family, f"summary {family} with a bare sample"
        labels_text = match["labels"] or ""
        labels = {}
        pos = 0
        while pos < len(labels_text):
            label = _LABEL.match(labels_text, pos)
            assert label, f"bad labels in {line!r}"
            labels[label[1]] = label[2]
            pos = label.end()
        value = match["value"]
        assert re.fullmatch(r"[-+]?(\d+(\.\d*)?([eE][-+]?\d+)?|NaN|Inf)", value), value
        key = (name, frozenset(labels.items()))
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(value)
    assert set(types) <= helps, "a family without HELP"
    return types, samples


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


async def test_metrics_parse_and_carry_the_figures(autojump_clock, host: Host, node_root: Path):
    before = snapshot(node_root)
    sims = [
        FakeSimulator("gpudriver", stage_delay=2),
        FakeApplier("cri", stage_errors=[StageError("x")], apply_delay=3),
        FakeDaemon("ib"),
    ]
    async with served(host, sims) as probe:
        await probe.reconciler.reconcile_once(make_state(1))
        await probe.reconciler.reconcile_once(make_state(2), attempt=2)
        probe.reconciler._note_update(SourceUpdate(state=make_state(2), error=SpecError("bad")))
        await trio.sleep(30)
        response = await probe.client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        types, samples = parse_prometheus(response.text)
    assert types["mokka_pass_duration_seconds"] == "summary"
    assert types["mokka_simulator_failures_total"] == "counter"
    assert sample(samples, "mokka_pass_duration_seconds_count") == 2
    assert sample(samples, "mokka_pass_duration_seconds_sum") == 2 + (2 + 3)
    assert sample(samples, "mokka_pass_last_duration_seconds") == 5
    assert sample(samples, "mokka_passes_total", outcome="ok") == 1
    assert sample(samples, "mokka_passes_total", outcome="stage-failed") == 1
    assert sample(samples, "mokka_passes_total", outcome="apply-failed") == 0
    assert sample(samples, "mokka_simulator_failures_total", simulator="cri", wave="stage") == 1
    assert (
        sample(samples, "mokka_simulator_failures_total", simulator="gpudriver", wave="stage") == 0
    )
    assert (
        sample(samples, "mokka_simulator_duration_seconds_sum", simulator="gpudriver", wave="stage")
        == 4
    )
    assert (
        sample(samples, "mokka_simulator_duration_seconds_count", simulator="cri", wave="apply")
        == 1
    )
    assert (
        sample(samples, "mokka_simulator_last_duration_seconds", simulator="cri", wave="apply") == 3
    )
    assert (
        sample(samples, "mokka_simulator_duration_seconds_count", simulator="ib", wave="supervise")
        == 1
    )
    assert sample(samples, "mokka_observed_generation") == 2
    assert sample(samples, "mokka_applied_generation") == 2
    assert sample(samples, "mokka_seconds_since_last_success") == 30
    assert sample(samples, "mokka_source_errors_total") == 1
    assert sample(samples, "mokka_source_error") == 1
    assert sample(samples, "mokka_stage_healthy") == 1
    assert sample(samples, "mokka_simulator_ready", simulator="ib") == 1
    assert sample(samples, "mokka_daemon_restarts_total", simulator="ib") == 0
    assert snapshot(node_root) == before


async def test_metrics_before_any_pass(autojump_clock, host: Host):
    async with served(host, [FakeSimulator('we"ird\\name')]) as probe:
        response = await probe.client.get("/metrics")
    _types, samples = parse_prometheus(response.text)
    assert math.isnan(sample(samples, "mokka_observed_generation"))
    assert math.isnan(sample(samples, "mokka_seconds_since_last_success"))
    # Label values are escaped and parse back.
    assert sample(samples, "mokka_simulator_ready", simulator='we\\"ird\\\\name') == 1


@pytest.mark.parametrize(
    ("value", "text"),
    [(1, "1"), (True, "1"), (False, "0"), (0.5, "0.5"), (math.nan, "NaN"), (math.inf, "+Inf")],
)
def test_metric_values_are_spelled_the_prometheus_way(value, text):
    assert format_value(value) == text
