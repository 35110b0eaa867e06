"""A whole node: one reconcile pass with every registered simulator.

Run: ``.venv/bin/python bench/node_pass.py [--profile h100 gb200] [--rounds 5]``.

For each profile, on a scratch root: the cold pass (everything created), the
repair pass (the same state again: nothing to write, every file compared),
and teardown (revoke + discard).  The baseline, measured in the same run, is
the filesystem floor: the staged tree written again with bare syscalls
(``fsfloor.write_floor``).  Prints medians and the ratio of each phase to
the floor.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import trio
from figures import report
from fsfloor import read_tree, write_floor

from mokka import cli
from mokka.daemon.command import build_simulators
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.teardown import teardown
from mokka.noderoot.host import Host
from mokka.state.compile import compile_profile

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--rounds", "1"]


async def one_round(profile: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "node"
        root.mkdir()
        args = cli.build_parser().parse_args(["daemon", "--root", str(root), "--profile", profile])
        simulators = build_simulators(args)
        host = Host(root)
        state = compile_profile(profile, node_name="bench-node")
        reconciler = Reconciler(host, simulators, supervisor=None)
        for phase in ("cold pass", "repair pass"):
            start = time.perf_counter()
            result = await reconciler.reconcile_once(state)
            figures[phase] = time.perf_counter() - start
            assert result.ok, result.summary()
        entries = await trio.to_thread.run_sync(read_tree, root)
        figures["files"] = len(entries)
        figures["floor"] = await trio.to_thread.run_sync(write_floor, entries)
        start = time.perf_counter()
        report = await teardown(host, simulators, timeout=60)
        figures["teardown"] = time.perf_counter() - start
        assert report.clean, report.failures
    return figures


async def main(profiles: list[str], rounds: int) -> None:
    for profile in profiles:
        results = [await one_round(profile) for _ in range(rounds)]
        floor = statistics.median(r["floor"] for r in results) * 1000
        print(f"{profile}: {int(results[0]['files'])} paths staged, {rounds} rounds")
        for phase in ("cold pass", "repair pass", "teardown"):
            median = statistics.median(r[phase] for r in results) * 1000
            report("node_pass", f"{profile} in-process {phase} (median)", median, "ms",
                   floor=floor, floor_name="bare-syscall writes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", nargs="+", default=["h100", "gb200"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the figures, not the simulators' notes
    trio.run(main, args.profile, args.rounds)
