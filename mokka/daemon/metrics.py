"""``/metrics``: the daemon's published status in the Prometheus text format (0.0.4).

Written by hand rather than with a client library: the daemon has a few
dozen series, all derived from the frozen snapshots the reconciler and the
supervisor already publish, so rendering them is a page of code and no new
dependency.  The format rules that matter are kept here:

* one ``# HELP`` and one ``# TYPE`` line per metric family, before its samples;
* label values escape ``\\``, ``"`` and newlines; help text escapes ``\\`` and
  newlines;
* values are Go-style floats (``NaN``, ``+Inf``) or integers;
* a summary without quantiles is ``_sum`` and ``_count`` samples.

Durations come from the trio clock (monotonic), so they are unaffected by a
wall clock step; "seconds since the last success" is NaN until one happened.

Rendering is a pure function of the snapshots (``render``), called per
scrape: nothing is accumulated here, so the counters are exactly the
reconciler's and reset with the process, which Prometheus' ``rate()``
and ``increase()`` expect of a counter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from mokka.daemon.status import DurationSummary, ReconcilerStatus, SupervisorStatus
from mokka.simulators.base import Readiness

#: The classic text exposition format's media type (OpenMetrics has its own);
#: Prometheus asks for ``text/plain;version=0.0.4`` in its Accept header.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Label name -> value; rendered in the mapping's order, which every caller
#: builds the same way each time, so a series' text is stable across scrapes.
Labels = Mapping[str, str]


def _escape_label(value: str) -> str:
    """Label values: backslash first, so the escapes added after it stay single."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    """HELP text: like labels, except that quotes need no escape there."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float | int | bool) -> str:
    """A sample value as Prometheus spells it.

    ``bool`` is tested first because it is an ``int`` to Python and should
    read as 1/0, not ``True``.  Integers print exactly (a counter above
    2**53 would lose digits as a float).  ``repr`` gives the shortest text
    that reads back as the same float, which Go's ``ParseFloat`` accepts.
    """
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class _Writer:
    """Accumulates families; each family's samples directly follow its header.

    The format requires every sample of a family to sit together, after its
    ``# TYPE`` line; writing a family in one call makes that impossible to
    get wrong.  Each family is written exactly once per body.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self,
        name: str,
        kind: str,
        help_text: str,
        samples: Iterable[tuple[str, Labels, float | int | bool]],
    ) -> None:
        """``samples``: ``(suffix, labels, value)``; suffix ``""``, ``_sum`` or ``_count``."""
        self.lines.append(f"# HELP {name} {_escape_help(help_text)}")
        self.lines.append(f"# TYPE {name} {kind}")
        for suffix, labels, value in samples:
            if labels:
                rendered = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
                self.lines.append(f"{name}{suffix}{{{rendered}}} {format_value(value)}")
            else:
                self.lines.append(f"{name}{suffix} {format_value(value)}")

    def summary(
        self, name: str, help_text: str, items: Iterable[tuple[Labels, DurationSummary]]
    ) -> None:
        """A summary family: ``_sum`` (seconds) and ``_count`` per label set, no quantiles."""
        samples: list[tuple[str, Labels, float | int]] = []
        for labels, summary in items:
            samples.append(("_sum", labels, summary.total))
            samples.append(("_count", labels, summary.count))
        self.family(name, "summary", help_text, samples)

    def text(self) -> str:
        """The body; the format requires a final newline."""
        return "\n".join(self.lines) + "\n"


def render(
    reconciler: ReconcilerStatus,
    supervisor: SupervisorStatus,
    readiness: Mapping[str, Readiness],
    *,
    now: float,
) -> str:
    """The whole ``/metrics`` body; ``now`` is ``trio.current_time()``.

    Families, in order: pass durations and outcomes, per-simulator per-wave
    durations and failures, readiness and daemon restarts, generations,
    staleness, source errors.  The family order is fixed, and within a family
    the series are sorted or follow the daemon's fixed simulator order, so
    two scrapes of an idle daemon differ only in values.  ``readiness`` is
    the per-simulator answer ``/readyz`` gives (a crashed daemon included).
    """
    w = _Writer()
    # -- passes ----------------------------------------------------------
    # Summaries without quantiles: quantiles computed in-process cannot be
    # aggregated across nodes, while _sum/_count give rate-based averages.
    w.summary(
        "mokka_pass_duration_seconds",
        "Duration of reconcile passes.",
        [({}, reconciler.pass_duration)],
    )
    # The last pass's length as a gauge too: visible in one scrape, without
    # a rate() over two of them, which is what a person debugging wants.
    w.family(
        "mokka_pass_last_duration_seconds",
        "gauge",
        "Duration of the last reconcile pass.",
        [("", {}, reconciler.pass_duration.last)],
    )
    # Every outcome is present from the start, at 0: ``increase()`` over a
    # series that appears only with its first failure misses that failure.
    outcomes = dict.fromkeys(("ok", "stage-failed", "supervise-failed", "apply-failed"), 0)
    outcomes.update(reconciler.passes_by_outcome)
    w.family(
        "mokka_passes_total",
        "counter",
        "Reconcile passes by outcome.",
        [("", {"outcome": k}, v) for k, v in outcomes.items()],
    )

    # -- simulators --------------------------------------------------------
    # Keys are (simulator, wave) pairs that ran at least once; sorted so the
    # body is stable between scrapes (diffable by eye).
    keys = sorted(reconciler.wave_durations)
    w.summary(
        "mokka_simulator_duration_seconds",
        "Duration of each simulator's call in each wave (stage, supervise, apply).",
        [
            ({"simulator": s, "wave": wave}, reconciler.wave_durations[(s, wave)])
            for s, wave in keys
        ],
    )
    w.family(
        "mokka_simulator_last_duration_seconds",
        "gauge",
        "Duration of each simulator's last call in each wave.",
        [
            ("", {"simulator": s, "wave": wave}, reconciler.wave_durations[(s, wave)].last)
            for s, wave in keys
        ],
    )
    # Zero-filled for every call that ran, for the same reason as the outcomes.
    failure_keys = sorted(set(keys) | set(reconciler.failures_total))
    w.family(
        "mokka_simulator_failures_total",
        "counter",
        "Failed simulator calls by wave.",
        [
            ("", {"simulator": s, "wave": wave}, reconciler.failures_total.get((s, wave), 0))
            for s, wave in failure_keys
        ],
    )
    # Mirrors /readyz per simulator, so an alert can name the one not ready.
    w.family(
        "mokka_simulator_ready",
        "gauge",
        "1 when the simulator reports itself ready.",
        [("", {"simulator": name}, r.ready) for name, r in readiness.items()],
    )
    # Only simulators that run a daemon under the supervisor appear here.
    w.family(
        "mokka_daemon_restarts_total",
        "counter",
        "Restarts of crashed daemons.",
        [("", {"simulator": name}, d.restarts) for name, d in sorted(supervisor.daemons.items())],
    )

    # -- generations and staleness ---------------------------------------
    # NaN rather than an absent series or a fake 0: "no value yet" stays
    # distinguishable from generation 0, and comparisons with NaN are false,
    # so an alert like ``observed < seen`` does not fire before the first pass.
    def generation(value: int | None) -> float | int:
        """The generation as a sample value; NaN for "none yet"."""
        return math.nan if value is None else value

    last_success = reconciler.last_success
    w.family(
        "mokka_observed_generation",
        "gauge",
        "Generation of the state the last pass ran over (NaN before the first pass).",
        [("", {}, generation(reconciler.observed_generation))],
    )
    w.family(
        "mokka_applied_generation",
        "gauge",
        "Generation of the last successful pass (NaN before the first).",
        [("", {}, generation(None if last_success is None else last_success.generation))],
    )
    # seen > applied is the signal that matters: a newer state is waiting for,
    # or failing, its pass.
    w.family(
        "mokka_seen_generation",
        "gauge",
        "Generation of the newest state the source delivered.",
        [("", {}, generation(reconciler.seen_generation))],
    )
    # Both times are trio-clock readings, so the difference is immune to wall
    # clock steps; staleness grows while passes fail or while none is due.
    since = math.nan if reconciler.last_success_at is None else now - reconciler.last_success_at
    w.family(
        "mokka_seconds_since_last_success",
        "gauge",
        "Seconds since the last successful pass ended (NaN before the first).",
        [("", {}, since)],
    )
    # Mirrors /healthz: the last Stage wave ran clean (1 before the first pass too).
    w.family(
        "mokka_stage_healthy",
        "gauge",
        "1 when the last Stage wave had no failure.",
        [("", {}, not reconciler.stage_failures)],
    )
    # -- the state source -----------------------------------------------------
    # A bad input leaves the last good state in force, so the passes above
    # look fine; these two are what shows that an edit was refused.
    w.family(
        "mokka_source_errors_total",
        "counter",
        "State source errors seen (a bad profile, topology or overrides file).",
        [("", {}, reconciler.source_errors_total)],
    )
    w.family(
        "mokka_source_error",
        "gauge",
        "1 while the newest source update is an error.",
        [("", {}, reconciler.source_error is not None)],
    )
    return w.text()
