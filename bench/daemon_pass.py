"""What the daemon core costs: one reconcile pass, and an idle daemon's memory.

1. **Pass overhead**: ``Reconciler.reconcile_once`` over N no-op simulators
   (a third of them appliers, a few daemons under a running supervisor)
   versus an empty pass, so the figure is the waves' own cost (nurseries,
   outcome records, the published snapshot, the canonical log line), not
   any simulator's work.
2. **Idle RSS**: a real ``python -m mokka`` on a scratch root, once it has
   logged its first pass and sat for a few seconds; ``VmRSS`` and ``VmHWM``
   from ``/proc``.  It is then stopped with SIGTERM (the root ends empty).

Run: ``.venv/bin/python bench/daemon_pass.py [--rounds 300] [--idle 3]``.
Prints median and 95th percentile per pass size, and the RSS figures.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from mokka.daemon.reconciler import Reconciler
from mokka.daemon.supervisor import Supervisor
from mokka.noderoot.host import Host
from mokka.simulators.base import Readiness
from mokka.state.model import State, System

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--rounds", "30", "--idle", "1"]

REPO = Path(__file__).resolve().parent.parent


class NoopSimulator:
    readiness = Readiness.ok()

    def __init__(self, name: str) -> None:
        self.name = name

    async def stage(self, host, state) -> None:
        pass

    async def discard(self, host) -> None:
        pass


class NoopApplier(NoopSimulator):
    async def apply(self, host, state) -> None:
        pass

    async def revoke(self, host) -> None:
        pass


class NoopDaemon(NoopSimulator):
    async def run(self, host, state, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def reload(self, state) -> None:
        pass


def simulators(n: int) -> list[NoopSimulator]:
    kinds = (NoopSimulator, NoopApplier, NoopApplier, NoopSimulator, NoopDaemon)
    return [kinds[i % len(kinds)](f"sim{i}") for i in range(n)]


def state(generation: int) -> State:
    system = System(
        driver_version="550.54.15",
        nvml_version="12.550.54.15",
        cuda_version_major=12,
        cuda_version_minor=4,
    )
    return State(
        generation=generation,
        content_hash=f"h{generation}",
        node_name="bench",
        profile_name="bench",
        system=system,
        gpus=(),
    )


async def time_passes(n: int, rounds: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        host = Host(tmp)
        supervisor = Supervisor(host)
        reconciler = Reconciler(host, simulators(n), supervisor=supervisor)
        samples = []
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            await reconciler.reconcile_once(state(0))  # starts the daemons once
            for i in range(rounds):
                start = time.perf_counter()
                result = await reconciler.reconcile_once(state(i + 1))
                samples.append(time.perf_counter() - start)
                assert result.ok
            nursery.cancel_scope.cancel()
    return samples


def idle_rss(idle_seconds: float) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mokka",
                "--root",
                tmp,
                "--health-addr",
                "127.0.0.1:0",
                "--node-name",
                "bench",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        try:
            assert process.stdout is not None
            for line in process.stdout:
                if "reconcile pass" in line:
                    break
            else:
                raise SystemExit("the daemon exited before its first pass")
            time.sleep(idle_seconds)  # a benchmark, not a test: let it settle
            status = Path(f"/proc/{process.pid}/status").read_text()
            figures = {
                key: int(re.search(rf"^{key}:\s+(\d+) kB", status, re.M)[1])
                for key in ("VmRSS", "VmHWM")
            }
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
        figures["exit code"] = code
        figures["files left"] = sum(1 for _ in Path(tmp).rglob("*"))
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--idle", type=float, default=3.0, help="seconds idle before reading RSS")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the canonical line per pass would time the terminal
    print(f"one reconcile pass (median / p95 of {args.rounds}, no-op simulators):")
    baseline = None
    for n in (0, 8, 100, 1000):
        samples = sorted(trio.run(time_passes, n, args.rounds))
        median = statistics.median(samples)
        p95 = samples[int(len(samples) * 0.95) - 1]
        baseline = median if baseline is None else baseline
        extra = "" if n == 0 else f"  (+{(median - baseline) * 1e6 / n:.1f} us per simulator)"
        print(f"  {n:5d} simulators: {median * 1e3:8.3f} ms / {p95 * 1e3:8.3f} ms{extra}")
    logging.disable(logging.NOTSET)
    figures = idle_rss(args.idle)
    print(
        f"idle daemon (built-in h100, all simulators): VmRSS {figures['VmRSS'] / 1024:.1f} MiB, "
        f"peak {figures['VmHWM'] / 1024:.1f} MiB; SIGTERM exit code {figures['exit code']}, "
        f"{figures['files left']} file(s) left in the root"
    )


if __name__ == "__main__":
    main()
