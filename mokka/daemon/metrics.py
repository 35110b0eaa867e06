"""``/metrics``: the daemon's published status in the Prometheus text format (0.0.4).

Rendered with ``prometheus_client`` through a custom collector over the
frozen snapshots the reconciler and the supervisor already publish: the
library owns the exposition format (escaping, float spelling, family
grouping) and the standard ``process_*`` metrics (CPU, memory, open file
descriptors, start time), which a hand-written renderer would have to
re-implement from ``/proc``.  Nothing is accumulated here: each scrape
builds a fresh registry over the current snapshots, so counters are exactly
the reconciler's and reset with the process, as Prometheus' ``rate()`` and
``increase()`` expect.

Durations are histograms with fixed buckets (``status.DURATION_BUCKETS``),
so a fleet's percentiles can be computed by summing buckets across nodes
(quantiles computed in-process cannot be aggregated).  They come from the
trio clock (monotonic); the one wall-clock figure, the end of the last
successful pass, is a Unix timestamp, so an alert reads
``time() - mokka_last_success_timestamp_seconds``.
"""

from __future__ import annotations

import itertools
import math
import platform
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from mokka import __version__
from mokka.daemon.status import (
    DURATION_BUCKETS,
    DurationSummary,
    ReconcilerStatus,
    SupervisorStatus,
)
from mokka.simulators.base import Readiness

#: The classic text exposition format's media type (what ``generate_latest``
#: writes); Prometheus asks for ``text/plain;version=0.0.4`` in its Accept header.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Every pass outcome, present from the start at 0: ``increase()`` over a
#: series that appears only with its first failure misses that failure.
OUTCOMES = ("ok", "stage-failed", "supervise-failed", "apply-failed")


def histogram_buckets(summary: DurationSummary) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs, ending with ``+Inf`` = every observation."""
    cumulative = itertools.accumulate(summary.buckets)
    bounds = [(floatToGoString(b), c) for b, c in zip(DURATION_BUCKETS, cumulative, strict=True)]
    return [*bounds, ("+Inf", summary.count)]


def _generation(value: int | None) -> float:
    """NaN for "none yet": distinguishable from generation 0, and comparisons
    with NaN are false, so ``observed < seen`` does not fire before the first pass."""
    return math.nan if value is None else float(value)


class SnapshotCollector:
    """The mokka_* families, from one set of snapshots (a collector per scrape)."""

    def __init__(
        self,
        reconciler: ReconcilerStatus,
        supervisor: SupervisorStatus,
        readiness: Mapping[str, Readiness],
    ) -> None:
        self.reconciler = reconciler
        self.supervisor = supervisor
        self.readiness = readiness

    def collect(self) -> Iterator[Metric]:
        yield from self._build()
        yield from self._passes()
        yield from self._simulators()
        yield from self._generations()
        yield from self._source()

    def _build(self) -> Iterable[Metric]:
        info = GaugeMetricFamily(
            "mokka_build_info",
            "Version of the running daemon and of its Python; always 1.",
            labels=["version", "python_version"],
        )
        info.add_metric([__version__, platform.python_version()], 1)
        return [info]

    def _passes(self) -> Iterable[Metric]:
        r = self.reconciler
        duration = HistogramMetricFamily(
            "mokka_pass_duration_seconds", "Duration of reconcile passes.", labels=[]
        )
        duration.add_metric([], histogram_buckets(r.pass_duration), r.pass_duration.total)
        # The last pass's length as a gauge too: visible in one scrape, without
        # a rate() over two of them, which is what a person debugging wants.
        last = GaugeMetricFamily(
            "mokka_pass_last_duration_seconds",
            "Duration of the last reconcile pass.",
            value=r.pass_duration.last,
        )
        passes = CounterMetricFamily(
            "mokka_passes", "Reconcile passes by outcome.", labels=["outcome"]
        )
        outcomes = dict.fromkeys(OUTCOMES, 0)
        outcomes.update(r.passes_by_outcome)
        for outcome, count in outcomes.items():
            passes.add_metric([outcome], count)
        return [duration, last, passes]

    def _simulators(self) -> Iterable[Metric]:
        r = self.reconciler
        # (simulator, wave) pairs that ran at least once; sorted so two
        # scrapes of an idle daemon differ only in values.
        keys = sorted(r.wave_durations)
        labels = ["simulator", "wave"]
        duration = HistogramMetricFamily(
            "mokka_simulator_duration_seconds",
            "Duration of each simulator's call in each wave (stage, supervise, apply).",
            labels=labels,
        )
        last = GaugeMetricFamily(
            "mokka_simulator_last_duration_seconds",
            "Duration of each simulator's last call in each wave.",
            labels=labels,
        )
        for key in keys:
            summary = r.wave_durations[key]
            duration.add_metric(list(key), histogram_buckets(summary), summary.total)
            last.add_metric(list(key), summary.last)
        # Zero-filled for every call that ran, for the same reason as OUTCOMES.
        failures = CounterMetricFamily(
            "mokka_simulator_failures", "Failed simulator calls by wave.", labels=labels
        )
        for key in sorted(set(keys) | set(r.failures_total)):
            failures.add_metric(list(key), r.failures_total.get(key, 0))
        # Mirrors /readyz per simulator, so an alert can name the one not ready.
        ready = GaugeMetricFamily(
            "mokka_simulator_ready",
            "1 when the simulator reports itself ready.",
            labels=["simulator"],
        )
        for name, readiness in self.readiness.items():
            ready.add_metric([name], 1 if readiness.ready else 0)
        # Only simulators that run a daemon under the supervisor appear here.
        restarts = CounterMetricFamily(
            "mokka_daemon_restarts", "Restarts of crashed daemons.", labels=["simulator"]
        )
        for name, daemon in sorted(self.supervisor.daemons.items()):
            restarts.add_metric([name], daemon.restarts)
        return [duration, last, failures, ready, restarts]

    def _generations(self) -> Iterable[Metric]:
        r = self.reconciler
        success = r.last_success
        # seen > applied is the signal that matters: a newer state is waiting
        # for, or failing, its pass.
        return [
            GaugeMetricFamily(
                "mokka_observed_generation",
                "Generation of the newest state the loop has acted on (NaN before the first pass).",
                value=_generation(r.observed_generation),
            ),
            GaugeMetricFamily(
                "mokka_applied_generation",
                "Generation of the last successful pass (NaN before the first).",
                value=_generation(None if success is None else success.generation),
            ),
            GaugeMetricFamily(
                "mokka_seen_generation",
                "Generation of the newest state the source delivered.",
                value=_generation(r.seen_generation),
            ),
            # 0 before the first success: `time() - x` is then huge, so a node
            # that never converged reads as stale, not as fresh.
            GaugeMetricFamily(
                "mokka_last_success_timestamp_seconds",
                "Unix time at which the last successful pass ended (0 before the first).",
                value=0.0 if success is None else success.wall,
            ),
            # Mirrors /healthz: the last Stage wave ran clean (1 before the first pass too).
            GaugeMetricFamily(
                "mokka_stage_healthy",
                "1 when the last Stage wave had no failure.",
                value=0 if r.stage_failures else 1,
            ),
        ]

    def _source(self) -> Iterable[Metric]:
        # A bad input leaves the last good state in force, so the passes look
        # fine; these two are what shows that an edit was refused.
        r = self.reconciler
        return [
            CounterMetricFamily(
                "mokka_source_errors",
                "State source errors seen (a bad profile, topology or overrides file).",
                value=r.source_errors_total,
            ),
            GaugeMetricFamily(
                "mokka_source_error",
                "1 while the newest source update is an error.",
                value=0 if r.source_error is None else 1,
            ),
        ]


def render(
    reconciler: ReconcilerStatus,
    supervisor: SupervisorStatus,
    readiness: Mapping[str, Readiness],
) -> str:
    """The whole ``/metrics`` body.

    ``readiness`` is the per-simulator answer ``/readyz`` gives (a crashed
    daemon included).  A registry per call: the snapshots are the state, and
    ``ProcessCollector`` reads ``/proc/self`` at collection time.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(reconciler, supervisor, readiness))
    ProcessCollector(registry=registry)
    return generate_latest(registry).decode()
