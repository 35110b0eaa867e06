"""/metrics: parsed with prometheus_client's own text parser, over snapshots and over HTTP.

The parser is Prometheus' reference reading of the 0.0.4 text format
(families, types, label escaping, float spelling); the figures are checked
against the snapshots they come from.
"""

from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

import mokka
from mokka.daemon import metrics
from mokka.daemon.status import (
    DURATION_BUCKETS,
    DaemonStatus,
    DurationSummary,
    PassResult,
    ReconcilerStatus,
    SupervisorStatus,
)
from mokka.errors import SpecError, StageError
from mokka.noderoot.host import Host
from mokka.simulators.base import Readiness
from mokka.state.sources.base import SourceUpdate
from tests.fakes import FakeApplier, FakeDaemon, FakeSimulator, make_state
from tests.support import snapshot
from tests.test_health import served


def parse(text: str) -> tuple[dict[str, str], dict[tuple[str, frozenset], float]]:
    """(family -> type, (sample name, labels) -> value), refusing a family twice."""
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset], float] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in types, f"family {family.name} twice"
        assert family.documentation, f"{family.name} has no HELP"
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"sample {s} twice"
            samples[key] = s.value
    return types, samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def buckets(samples: dict, name: str, **labels: str) -> list[tuple[str, float]]:
    """A histogram's (le, cumulative count) pairs, in bucket order."""
    found = [
        (dict(key[1])["le"], v)
        for key, v in samples.items()
        if key[0] == f"{name}_bucket" and {**dict(key[1]), "le": ""} == {**labels, "le": ""}
    ]
    return sorted(found, key=lambda pair: float(pair[0]))


def pass_result(generation: int, wall: float) -> PassResult:
    return PassResult(
        generation=generation, content_hash="h", started_at=0.0, duration=1.0, wall=wall
    )


# ---- over snapshots -----------------------------------------------------------


def test_durations_are_histograms_with_the_fixed_buckets() -> None:
    observed = [0.004, 0.02, 0.02, 3.0, 200.0]
    summary = DurationSummary()
    for seconds in observed:
        summary = summary.add(seconds)
    status = ReconcilerStatus(
        pass_duration=summary, wave_durations={("gpudriver", "stage"): summary}
    )
    types, samples = parse(metrics.render(status, SupervisorStatus(), {}))
    for name, labels in (
        ("mokka_pass_duration_seconds", {}),
        ("mokka_simulator_duration_seconds", {"simulator": "gpudriver", "wave": "stage"}),
    ):
        assert types[name] == "histogram"
        got = buckets(samples, name, **labels)
        bounds = [*DURATION_BUCKETS, math.inf]
        assert [float(le) for le, _ in got] == bounds
        # Cumulative, each bucket counting the observations <= its bound.
        assert [count for _, count in got] == [
            sum(1 for o in observed if o <= bound) for bound in bounds
        ]
        assert value(samples, f"{name}_count", **labels) == len(observed)
        assert value(samples, f"{name}_sum", **labels) == pytest.approx(sum(observed))
    assert value(samples, "mokka_pass_last_duration_seconds") == 200.0


def test_a_value_on_a_bound_falls_in_that_bucket() -> None:
    summary = DurationSummary().add(0.5)
    assert summary.buckets[DURATION_BUCKETS.index(0.5)] == 1
    assert sum(summary.buckets) == 1


def test_build_info_and_process_metrics() -> None:
    types, samples = parse(metrics.render(ReconcilerStatus(), SupervisorStatus(), {}))
    assert types["mokka_build_info"] == "gauge"
    info = value(
        samples,
        "mokka_build_info",
        version=mokka.__version__,
        python_version=platform.python_version(),
    )
    assert info == 1
    # The standard process collector's families, about this very process.
    assert types["process_cpu_seconds"] == "counter"
    assert value(samples, "process_cpu_seconds_total") > 0
    assert value(samples, "process_resident_memory_bytes") > 1_000_000
    start = value(samples, "process_start_time_seconds")
    assert time.time() - 24 * 3600 < start <= time.time()
    assert value(samples, "process_open_fds") == pytest.approx(
        len(os.listdir("/proc/self/fd")), abs=5
    )
    assert value(samples, "process_max_fds") > 0


def test_last_success_is_a_unix_timestamp() -> None:
    never = ReconcilerStatus()
    _types, samples = parse(metrics.render(never, SupervisorStatus(), {}))
    # 0, not NaN: `time() - x` is huge, so a node that never converged is stale.
    assert value(samples, "mokka_last_success_timestamp_seconds") == 0
    assert ("mokka_seconds_since_last_success", frozenset()) not in samples
    assert math.isnan(value(samples, "mokka_applied_generation"))

    wall = 1_790_000_000.25
    done = ReconcilerStatus(last_pass=pass_result(4, wall), last_success=pass_result(4, wall))
    types, samples = parse(metrics.render(done, SupervisorStatus(), {}))
    assert types["mokka_last_success_timestamp_seconds"] == "gauge"
    assert value(samples, "mokka_last_success_timestamp_seconds") == wall
    assert value(samples, "mokka_applied_generation") == 4


def test_counters_are_zero_filled_and_labels_escaped() -> None:
    status = ReconcilerStatus(
        passes_by_outcome={"ok": 3},
        failures_total={("cri", "apply"): 2},
        source_errors_total=1,
        source_error="bad",
    )
    supervisor = SupervisorStatus(
        daemons={"ib": DaemonStatus(name="ib", phase="running", restarts=2)}
    )
    readiness = {'we"ird\\name\n': Readiness.not_ready("x"), "gpudriver": Readiness.ok("y")}
    types, samples = parse(metrics.render(status, supervisor, readiness))
    assert types["mokka_passes"] == "counter"
    assert {o: value(samples, "mokka_passes_total", outcome=o) for o in metrics.OUTCOMES} == {
        "ok": 3,
        "stage-failed": 0,
        "supervise-failed": 0,
        "apply-failed": 0,
    }
    assert value(samples, "mokka_simulator_failures_total", simulator="cri", wave="apply") == 2
    assert value(samples, "mokka_daemon_restarts_total", simulator="ib") == 2
    assert value(samples, "mokka_source_errors_total") == 1
    assert value(samples, "mokka_source_error") == 1
    # The parser unescapes: the name reads back exactly as given.
    assert value(samples, "mokka_simulator_ready", simulator='we"ird\\name\n') == 0
    assert value(samples, "mokka_simulator_ready", simulator="gpudriver") == 1


def test_the_parser_sees_what_the_checks_above_rely_on() -> None:
    """The helpers are not vacuous: a bucket list and a missing sample are seen as such."""
    _types, samples = parse(metrics.render(ReconcilerStatus(), SupervisorStatus(), {}))
    got = buckets(samples, "mokka_pass_duration_seconds")
    assert len(got) == len(DURATION_BUCKETS) + 1
    assert all(count == 0 for _, count in got)
    with pytest.raises(KeyError):
        value(samples, "mokka_passes_total", outcome="no-such-outcome")


# ---- over HTTP ------------------------------------------------------------------


async def test_metrics_over_http_carry_the_figures(autojump_clock, host: Host, node_root: Path):
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
        assert response.headers["content-type"] == metrics.CONTENT_TYPE
        types, samples = parse(response.text)
        last_success = probe.reconciler.status.last_success
    assert types["mokka_pass_duration_seconds"] == "histogram"
    assert types["mokka_simulator_failures"] == "counter"
    assert value(samples, "mokka_pass_duration_seconds_count") == 2
    assert value(samples, "mokka_pass_duration_seconds_sum") == 2 + (2 + 3)
    assert value(samples, "mokka_pass_duration_seconds_bucket", le="2.5") == 1
    assert value(samples, "mokka_pass_duration_seconds_bucket", le="5.0") == 2
    assert value(samples, "mokka_pass_last_duration_seconds") == 5
    assert value(samples, "mokka_passes_total", outcome="ok") == 1
    assert value(samples, "mokka_passes_total", outcome="stage-failed") == 1
    assert value(samples, "mokka_simulator_failures_total", simulator="cri", wave="stage") == 1
    assert (
        value(samples, "mokka_simulator_failures_total", simulator="gpudriver", wave="stage") == 0
    )
    labels = {"simulator": "gpudriver", "wave": "stage"}
    assert value(samples, "mokka_simulator_duration_seconds_sum", **labels) == 4
    assert (
        value(samples, "mokka_simulator_last_duration_seconds", simulator="cri", wave="apply") == 3
    )
    ib = {"simulator": "ib", "wave": "supervise"}
    assert value(samples, "mokka_simulator_duration_seconds_count", **ib) == 1
    assert value(samples, "mokka_observed_generation") == 2
    assert value(samples, "mokka_applied_generation") == 2
    assert last_success is not None
    assert value(samples, "mokka_last_success_timestamp_seconds") == last_success.wall
    assert value(samples, "mokka_source_errors_total") == 1
    assert value(samples, "mokka_source_error") == 1
    assert value(samples, "mokka_stage_healthy") == 1
    assert value(samples, "mokka_simulator_ready", simulator="ib") == 1
    assert value(samples, "mokka_daemon_restarts_total", simulator="ib") == 0
    assert value(samples, "mokka_build_info", version=mokka.__version__,
                 python_version=platform.python_version()) == 1  # fmt: skip
    assert value(samples, "process_open_fds") > 0
    assert snapshot(node_root) == before


async def test_metrics_before_any_pass_over_http(autojump_clock, host: Host):
    async with served(host, [FakeSimulator("a")]) as probe:
        response = await probe.client.get("/metrics")
    _types, samples = parse(response.text)
    assert math.isnan(value(samples, "mokka_observed_generation"))
    assert value(samples, "mokka_last_success_timestamp_seconds") == 0
    assert value(samples, "mokka_pass_duration_seconds_count") == 0
