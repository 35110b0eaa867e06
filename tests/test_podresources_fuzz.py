"""The workload daemon against a hostile kubelet: a real gRPC server serving crafted bytes.

The server (``tests.podresources_support``, ``raw`` mode) answers every call
with the bytes a test sets: answers under the 4 MiB cap that no encoder
would make (millions of empty pods, unknown fields, a pod of 100,000
containers, names of megabytes, messages nested thousands deep), answers over
the cap, seeded random bytes, and a call that never ends.  The daemon must
keep polling through all of it: each answer is refused with one line that
names the socket and the bound, the last good workload file stays, a good
answer afterwards is taken at once, one poll's memory stays bounded
(``tracemalloc``'s peak above what was held before: Python's own
allocations, the server's included, deterministic, unlike RSS), and the log
gets one line for the whole run of failures.
"""

from __future__ import annotations

import logging
import random
import tracemalloc
from pathlib import Path

import pytest
import trio

from mokka.noderoot.host import Host
from mokka.simulators.workload import WorkloadSettings, WorkloadSimulator
from mokka.simulators.workload.podresources import MAX_MESSAGE_BYTES
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.podresources_support import (
    HOSTILE_LISTS,
    Pod,
    PodResourcesServer,
    field,
    pb2_fixture,  # noqa: F401  (a fixture: tests name it pb2)
    server_fixture,  # noqa: F401  (a fixture: tests name it server)
    workload,
)
from tests.support import snapshot

SEED = 20261229
#: What one poll of a hostile answer may allocate at its peak: the answer
#: (at most 4 MiB) as gRPC's server and client each copy it (three copies
#: measured), a copy of one level of it, and the few capped values kept.
#: Unbounded decoding took about 194 MB for two million empty pods.
PEAK_BOUND = 6 * MAX_MESSAGE_BYTES


def hostile_answers() -> list[tuple[str, bytes, str]]:
    """(name, answer, words the readiness reason must hold) for every hostile kubelet."""
    cases = [(name, answer, words or "") for name, (answer, words) in HOSTILE_LISTS.items()
             # Decodable ones are a good answer to the daemon: they go below.
             if words is not None]
    cases.append(("over the 4 MiB cap", field(1, b"p" * MAX_MESSAGE_BYTES), "RESOURCE_EXHAUSTED"))
    rng = random.Random(SEED)
    for n in range(12):
        cases.append((f"random bytes #{n}", rng.randbytes(rng.choice([1, 7, 300, 70_000])), ""))
    return cases


@pytest.mark.timeout(240)
async def test_a_hostile_kubelet_never_takes_the_poller_down(
    host: Host, node_root: Path, server: PodResourcesServer, caplog: pytest.LogCaptureFixture,
) -> None:
    before = snapshot(node_root)
    h100: State = compile_profile("h100", node_name="node-a")
    server.pods = [Pod("team", "train", {"main": [("nvidia.com/gpu", ["0"])]})]
    # A long call timeout: tracemalloc makes the decode ten times slower.
    sim = WorkloadSimulator(settings=WorkloadSettings(poll_interval=0.05, call_timeout=5.0))
    refused, peaks = [], {}
    tracemalloc.start()
    try:
        with trio.fail_after(200):
            async with trio.open_nursery() as nursery:
                await nursery.start(sim.run, host, h100)
                await sim.polls.wait_value(lambda _: workload(node_root) is not None)
                good = workload(node_root)
                assert good["device.0.process_count"] == 1
                for name, answer, words in hostile_answers():
                    server.mode, server.raw = "raw", answer
                    # Two more polls: the second one read this answer from its start.
                    target = sim.polls.value + 2
                    tracemalloc.reset_peak()
                    held = tracemalloc.get_traced_memory()[0]
                    await sim.polls.wait_value(lambda value, t=target: value >= t)
                    peaks[name] = tracemalloc.get_traced_memory()[1] - held
                    reason = sim.readiness.reason
                    if not sim.readiness.ready:
                        refused.append(name)
                        assert reason.startswith(
                            "pod-resources socket /var/lib/kubelet/pod-resources/kubelet.sock: "
                        ), (name, reason)
                        assert words in reason, (name, reason)
                        assert "\n" not in reason, (name, reason)
                        assert len(reason) < 400, (name, reason)
                        assert workload(node_root) == good, name
                    else:  # random bytes that happen to be a (grant-free) answer
                        assert words == "", (name, reason)
                        assert name.startswith("random"), (name, reason)
                # A call that never ends: the deadline ends the wait.
                server.mode = "stall"
                await sim.polls.wait_value(lambda _: "DEADLINE_EXCEEDED" in sim.readiness.reason)
                server.release.set()
                # Decodable hostile answers, then a good one: taken at once.
                for name in ("a 3 MiB pod name", "nested 2,000 deep as a container"):
                    server.mode, server.raw = "raw", HOSTILE_LISTS[name][0]
                    await sim.polls.wait_value(lambda _: sim.readiness.ready)
                    assert workload(node_root)["device.0.process_count"] == 0, name
                server.mode = "ok"
                await sim.polls.wait_value(
                    lambda _: (workload(node_root) or {}).get("device.0.process_count") == 1)
                assert sim.readiness.ready
                nursery.cancel_scope.cancel()
    finally:
        tracemalloc.stop()
    # Every crafted answer was refused, each within the memory bound.
    assert set(HOSTILE_LISTS) - {"a 3 MiB pod name", "nested 2,000 deep as a container"} <= set(
        refused)
    assert max(peaks.values()) < PEAK_BOUND, sorted(peaks.items(), key=lambda kv: -kv[1])[:3]
    # The whole run of failures is one log line (one more at most after the recovery in
    # between: the decodable answers were good polls).
    lines = [r.getMessage() for r in caplog.records
             if r.name.startswith("mokka.simulators.workload") and r.levelno >= logging.WARNING]
    assert 1 <= len(lines) <= 2, lines
    await sim.discard(host)
    assert snapshot(node_root) == before
