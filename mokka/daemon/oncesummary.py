"""``mokka daemon --once``: whether the node it left is ready, and the summary saying so.

A CI gate runs ``--once`` and reads its exit status, so a pass that staged
everything but left the node unusable (no CAP_MKNOD: device nodes are
placeholder files and the CDI specs are not published; ``/readyz`` says 503
in the same state) must not exit 0.  The verdict is ``/readyz``'s, over the
simulators ``--once`` runs to the end: a simulator with a daemon
(``implements(sim, Daemon)``) is not judged, since ``--once`` starts no
daemons and every such simulator would otherwise report its daemon "not
running"; its staged files are still judged by the simulators that read
them (the CDI specs, the driver tree).  The reasons are spelt as
``/readyz`` lists them (``simulator: reason``, the per-device CAP_MKNOD
sentences said once, each cut to ``MAX_TEXT``).

The summary is the pass's (``PassResult.summary``), then one line per
reason and the node root with its cleanup command; with ``--log-format
json`` it is one JSON object instead, so a collector reading the log reads
the verdict too.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import attrs

from mokka.daemon.status import PassResult, excerpt, summarize_reason
from mokka.simulators.base import Daemon, Readiness, Simulator, implements

#: The pass went well, but the node is not ready: distinct from a failed pass
#: (1) and a usage error (2), so a gate can tell "fix the node" from "fix the input".
EXIT_NOT_READY = 3


@attrs.frozen
class OnceVerdict:
    """Which simulators ``--once`` judged not ready, and which it could not judge."""

    #: simulator → its reason, as ``/readyz``'s ``not_ready`` spells it
    not_ready: dict[str, str]
    #: simulators with a daemon, which ``--once`` does not start
    unjudged: tuple[str, ...]

    @property
    def ready(self) -> bool:
        return not self.not_ready

    @property
    def reasons(self) -> list[str]:
        """``/readyz``'s ``reasons``: ``simulator: reason``."""
        return [f"{name}: {reason}" for name, reason in self.not_ready.items()]


def judge(simulators: list[Simulator]) -> OnceVerdict:
    """Each daemonless simulator's readiness after the pass (see the module docstring)."""
    not_ready: dict[str, str] = {}
    unjudged = []
    for sim in simulators:
        if implements(sim, Daemon):
            unjudged.append(sim.name)
            continue
        try:
            readiness = sim.readiness
        except Exception as exc:  # as ``/readyz`` counts a crashing check
            readiness = Readiness.not_ready(f"readiness check failed: {exc}")
        if not readiness.ready:
            not_ready[sim.name] = excerpt(summarize_reason(readiness.reason)) or ""
    return OnceVerdict(not_ready=not_ready, unjudged=tuple(unjudged))


def cleanup_command(root: Path) -> str:
    # quoted for a shell: the line is there to be pasted, whatever the root's name
    return f"mokka cleanup --root {shlex.quote(str(root))}"


def summary_text(result: PassResult, verdict: OnceVerdict, root: Path) -> str:
    """The lines ``--once`` prints (text logs)."""
    lines = [result.summary()]
    if result.ok:
        lines.append("node ready" if verdict.ready else "node not ready:")
        lines.extend(f"  {reason}" for reason in verdict.reasons)
    lines.append(f"node root: {root} (remove with: {cleanup_command(root)})")
    return "\n".join(lines)


def summary_json(result: PassResult, verdict: OnceVerdict, root: Path) -> str:
    """The one JSON line ``--once`` prints with ``--log-format json``."""
    return json.dumps({
        "once": result.as_json(),
        "ready": result.ok and verdict.ready,
        "reasons": verdict.reasons if result.ok else [],
        "not_ready": verdict.not_ready if result.ok else {},
        "daemons_not_started": list(verdict.unjudged),
        "node_root": str(root),
        "cleanup": cleanup_command(root),
    }, separators=(",", ":"))


def no_state_json(error: str) -> str:
    """``--once`` with no state to reconcile, as one JSON line."""
    return json.dumps(
        {"once": None, "ready": False, "reasons": [f"no state to reconcile: {error}"]},
        separators=(",", ":"))


def exit_code(result: PassResult, verdict: OnceVerdict) -> int:
    """0 ready; 1 the pass failed; ``EXIT_NOT_READY`` the pass went well, the node is not ready."""
    if not result.ok:
        return 1
    return 0 if verdict.ready else EXIT_NOT_READY
