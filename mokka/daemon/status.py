"""What the daemon publishes about itself: frozen values, replaced, never mutated.

The reconciler and the supervisor keep private mutable bookkeeping and,
whenever it changes, publish a new frozen snapshot built from it.  Health
probes, ``/metrics``, logs and ``--once``'s summary read only these values,
so a probe never sees a half-updated pass and never needs a lock (trio runs
one task at a time; a snapshot is swapped in with one assignment).

Two clocks appear: ``*_at`` fields are ``trio.current_time()`` (monotonic,
virtual under the test clock, used for durations and staleness), ``*_wall``
fields are ``time.time()`` (for humans reading health bodies).
"""

from __future__ import annotations

import bisect
import datetime
import re
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from mokka.simulators.base import Readiness
from mokka.state.reader import excerpt as input_excerpt

#: The waves of one pass, in order.
WAVES = ("stage", "supervise", "apply")


def _frozen_mapping(value: Mapping) -> Mapping:
    """A read-only copy: the publisher keeps mutating its own dict afterwards."""
    return MappingProxyType(dict(value))


#: Characters of any text from input (an error, a reason) a probe body carries:
#: enough to name the file and the field, never a file's content.
MAX_TEXT = 200

#: One device node written as a placeholder file for want of CAP_MKNOD (the
#: wording of ``mokka.noderoot.fsops.placeholder_reason``): said once per node, 14 times for a node
#: of 8 GPUs, which would bury every other reason.
_PLACEHOLDER = re.compile(
    r"(?P<path>\S+): no CAP_MKNOD, wrote a placeholder file instead of char device "
    r"\d+:\d+; consumers cannot open it \(run as root to get real nodes\)"
)


def excerpt(text: str | None, limit: int = MAX_TEXT) -> str | None:
    """``text`` cut to ``limit`` characters (the input reader's excerpt); ``None`` stays."""
    return None if text is None else input_excerpt(text, limit)


def summarize_reason(reason: str) -> str:
    """A readiness reason with the driver tree's per-node CAP_MKNOD sentences said once.

    The driver tree says one sentence per device node it wrote as a
    placeholder; the summary gives their count and a few names (the CDI
    specs' reason is already that short: ``mokka.simulators.cri.cdi.check``).
    """
    paths = [m["path"] for m in _PLACEHOLDER.finditer(reason)]
    if len(paths) >= 2:
        shown = ", ".join(paths[:2]) + (f" and {len(paths) - 2} more" if len(paths) > 2 else "")
        summary = (
            f"{len(paths)} device nodes are placeholder files ({shown}): no CAP_MKNOD; consumers "
            "cannot open them (run as root to get real nodes)"
        )
        rest = [part for part in _PLACEHOLDER.sub("", reason).split("; ") if part.strip()]
        reason = "; ".join([summary, *rest])
    return reason


def iso(wall: float | None) -> str | None:
    """``time.time()`` → ISO 8601 UTC with a ``Z`` (``None`` stays ``None``)."""
    if wall is None:
        return None
    moment = datetime.datetime.fromtimestamp(wall, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@attrs.frozen(kw_only=True)
class SimulatorOutcome:
    """How one simulator fared in one wave of one pass."""

    name: str
    #: ``stage`` | ``supervise`` | ``apply``
    wave: str
    ok: bool
    #: ``Type: message`` of the failure, ``None`` when ok
    error: str | None = None
    #: the failure was a ``SpecError``: retrying the same input cannot help
    terminal: bool = False
    #: an applier cancelled because a sibling failed first (fail fast); not a failure itself
    cancelled: bool = False
    #: trio clock when the call started, and how long it took (seconds)
    started_at: float = 0.0
    duration: float = 0.0
    #: wall clock when the call ended
    wall: float = 0.0

    @property
    def failed(self) -> bool:
        """A real failure; a fail-fast cancellation is not one (the sibling was at fault)."""
        return not self.ok and not self.cancelled

    def as_json(self) -> dict:
        """The probe bodies' spelling: wall time as ISO 8601, durations in seconds."""
        return {
            "ok": self.ok,
            "error": excerpt(self.error),
            "terminal": self.terminal,
            "cancelled": self.cancelled,
            "at": iso(self.wall),
            "duration_seconds": round(self.duration, 6),
        }


@attrs.frozen(kw_only=True)
class PassResult:
    """The outcome of one reconcile pass (stage → barrier → supervise → apply)."""

    generation: int
    content_hash: str
    #: trio clock at the start and the pass's length in seconds
    started_at: float
    duration: float
    #: wall clock at the end
    wall: float
    stage: tuple[SimulatorOutcome, ...] = ()
    supervise: tuple[SimulatorOutcome, ...] = ()
    apply: tuple[SimulatorOutcome, ...] = ()
    #: seconds until the loop retries this state; ``None``: no retry (success, or
    #: a terminal ``SpecError`` that waits for new input)
    retry_delay: float | None = None

    @property
    def outcomes(self) -> tuple[SimulatorOutcome, ...]:
        """Every outcome of the pass, wave by wave."""
        return self.stage + self.supervise + self.apply

    @property
    def failures(self) -> tuple[SimulatorOutcome, ...]:
        """The outcomes that failed (never empty for a failed pass: that is the contract)."""
        return tuple(o for o in self.outcomes if o.failed)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def terminal(self) -> bool:
        """A ``SpecError`` is among the failures: retrying this input cannot help.

        One terminal failure makes the whole pass terminal even if other
        simulators failed transiently: the input must change anyway, and the
        next input gets a fresh pass over every simulator.
        """
        return any(o.terminal for o in self.failures)

    @property
    def outcome(self) -> str:
        """``ok``, or the first wave that failed (``stage-failed``, ``supervise-failed``,
        ``apply-failed``)."""
        for wave, outcomes in (
            ("stage", self.stage),
            ("supervise", self.supervise),
            ("apply", self.apply),
        ):
            if any(o.failed for o in outcomes):
                return f"{wave}-failed"
        return "ok"

    def summary(self) -> str:
        """A few human lines: the outcome, then one line per failing simulator."""
        head = (
            f"generation {self.generation}: {self.outcome} in {self.duration:.3f}s "
            f"({len(self.stage)} staged, {len(self.supervise)} supervised, "
            f"{len(self.apply)} applied)"
        )
        lines = [head]
        lines.extend(f"  {o.wave} {o.name}: {o.error}" for o in self.failures)
        return "\n".join(lines)

    def as_json(self) -> dict:
        """``last_pass`` in the probe bodies."""
        return {
            "generation": self.generation,
            "outcome": self.outcome,
            "at": iso(self.wall),
            "duration_seconds": round(self.duration, 6),
            "retry_in_seconds": self.retry_delay,
            "failures": [
                {
                    "simulator": o.name,
                    "wave": o.wave,
                    "error": excerpt(o.error),
                    "at": iso(o.wall),
                }
                for o in self.failures
            ],
        }


#: Upper bounds (seconds) of the duration histograms' buckets: a simulator's
#: call takes milliseconds, a pass over a large profile seconds, a stuck one
#: minutes.  Fixed, so every node's buckets add up across a fleet.
DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip


@attrs.frozen(kw_only=True)
class DurationSummary:
    """Count, sum, last value and bucket counts of a duration (a Prometheus histogram)."""

    count: int = 0
    total: float = 0.0
    last: float = 0.0
    #: observations per bucket of ``DURATION_BUCKETS`` (not cumulative: the
    #: one whose bound is the first >= the value); longer ones only in ``count``
    buckets: tuple[int, ...] = (0,) * len(DURATION_BUCKETS)

    def add(self, seconds: float) -> DurationSummary:
        """A new summary including ``seconds`` (values are replaced, never mutated)."""
        buckets = list(self.buckets)
        index = bisect.bisect_left(DURATION_BUCKETS, seconds)
        if index < len(buckets):
            buckets[index] += 1
        return DurationSummary(
            count=self.count + 1, total=self.total + seconds, last=seconds, buckets=tuple(buckets)
        )


@attrs.frozen(kw_only=True)
class ReconcilerStatus:
    """The reconcile loop as health and metrics see it."""

    #: ``waiting`` (no state yet), ``reconciling``, ``idle`` (converged),
    #: ``backoff`` (a retry is scheduled), ``terminal`` (bad input, waiting for new input)
    phase: str = "waiting"
    passes_total: int = 0
    #: pass count by outcome (``ok``, ``stage-failed``, ...)
    passes_by_outcome: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen_mapping)
    last_pass: PassResult | None = None
    last_success: PassResult | None = None
    #: trio clock when the last successful pass ended
    last_success_at: float | None = None
    pass_duration: DurationSummary = DurationSummary()
    #: ``(simulator, wave)`` → durations of that call
    wave_durations: Mapping[tuple[str, str], DurationSummary] = attrs.field(
        factory=dict, converter=_frozen_mapping
    )
    #: ``(simulator, wave)`` → failures so far
    failures_total: Mapping[tuple[str, str], int] = attrs.field(
        factory=dict, converter=_frozen_mapping
    )
    #: generation of the newest state the source delivered (reconciled or not)
    seen_generation: int | None = None
    #: the newest source error, while it is the newest thing the source said
    source_error: str | None = None
    source_error_wall: float | None = None
    source_errors_total: int = 0
    #: Each simulator's readiness as the last pass left it (``None`` before
    #: the first pass): what the node serves while the next pass runs, when
    #: the simulators' live answers are those of a node half-way between states.
    settled_readiness: Mapping[str, Readiness] | None = attrs.field(
        default=None, converter=lambda m: None if m is None else _frozen_mapping(m)
    )
    #: Generation of the newest state the loop has acted on: the last pass's,
    #: or a later one it skipped because its content equals what that pass ran
    #: over (the node already is that state).
    observed_generation: int | None = None

    @property
    def stage_failures(self) -> tuple[SimulatorOutcome, ...]:
        """Failures of the last Stage wave (what ``/healthz`` reports)."""
        if self.last_pass is None:
            return ()
        return tuple(o for o in self.last_pass.stage if o.failed)


@attrs.frozen(kw_only=True)
class DaemonStatus:
    """One supervised daemon."""

    name: str
    #: ``running`` | ``crashed`` (a restart is scheduled) | ``restarting`` (the
    #: restart is under way) | ``stopped``
    phase: str
    #: restarts after a crash so far
    restarts: int = 0
    #: the last crash, as ``Type: message``
    error: str | None = None
    #: seconds between the crash and the scheduled restart
    restart_delay: float | None = None
    #: trio clock of the scheduled restart
    restart_at: float | None = None

    def readiness_override(self) -> Readiness | None:
        """Not ready while crashed (whatever the simulator says); ``None``: ask the simulator."""
        if self.phase == "crashed":
            return Readiness.not_ready(
                f"daemon crashed: {self.error}, restarting in {self.restart_delay:g}s"
            )
        if self.phase == "restarting":
            return Readiness.not_ready(f"daemon restarting after a crash: {self.error}")
        if self.phase == "stopped":
            return Readiness.not_ready("daemon stopped")
        return None


@attrs.frozen(kw_only=True)
class SupervisorStatus:
    """Every started daemon's status, by simulator name (absent: never started)."""

    daemons: Mapping[str, DaemonStatus] = attrs.field(factory=dict, converter=_frozen_mapping)
