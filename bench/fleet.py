"""A fleet on one machine: N daemons started together, changed together, stopped together.

Run: ``.venv/bin/python bench/fleet.py [--daemons 100] [--idle 60]``.

Each daemon has its own scratch root, ``--node-name fleet-<i>`` and
``--health-addr 127.0.0.1:<port>``; all read one profile file (a copy of
the built-in h100, as a DaemonSet's pods read one ConfigMap).  Reported:

* **start**: seconds from launching them all until every ``/readyz``
  answered 200 (p50 and the last one);
* **memory**: PSS of each ready daemon (``smaps_rollup``, with children),
  total and per daemon, against a bare trio process;
* **idle load**: CPU seconds of the whole fleet over ``--idle`` seconds, as
  a share of one core;
* **fleet-wide change**: the profile file saved once with four GPUs, until
  every daemon has converged (its ``reconcile pass ok generation=2`` line,
  by the line's own timestamp; ``/readyz`` then confirms
  ``observed_generation`` 2 on every daemon);
* **stop**: SIGTERM to all at once until every process exited; a daemon is
  in budget when it exited 0 within ``--shutdown-timeout`` and its logged
  teardown reported no failure, and its root is empty.

inotify descriptors are counted per user (``fs.inotify.max_user_instances``,
128 by default).  A daemon holds one, shared by all its watchers (its input
files, the fabric manager's marker, the kubelet's socket, the drift watch);
one that gets none falls back to polling (a 2 s tick for the fabric
manager's marker), which would be most of an idle fleet's load.  The
figures print the machine's limit and how many descriptors the fleet
holds; ``--inotify-instances N`` sets the limit for the run (restored
afterwards), e.g. to see a fleet larger than the default allows
(docs/operations.md, "inotify").
"""

from __future__ import annotations

import argparse
import importlib.resources
import statistics
import sys
import tempfile
import time
from pathlib import Path

import fsfloor
import nodes
from figures import percentile, report

sys.path.insert(0, str(nodes.REPO))  # the 4-GPU cut is the reload tests' own helper

from tests.test_daemon_reload import four_gpu_profile
from tests.test_shared_inotify import inotify_descriptors

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--daemons", "10", "--idle", "10"]

BENCH = "fleet"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemons", type=int, default=100)
    parser.add_argument("--idle", type=float, default=60.0, help="idle window, seconds")
    parser.add_argument(
        "--settle", type=float, default=0.0,
        help="seconds between all ready and the idle window; past 60 s the window holds "
             "steady-state resyncs only (each daemon's first repair pass re-makes the few "
             "calls whose records its first pass's own writes made stale)")
    parser.add_argument("--shutdown-timeout", type=float, default=25.0,
                        help="each daemon's teardown budget (its own flag)")
    parser.add_argument("--ready-timeout", type=float, default=1800.0)
    parser.add_argument("--inotify-instances", type=int, metavar="N",
                        help="set fs.inotify.max_user_instances to N for the run (root)")
    args = parser.parse_args(argv)
    limit = INSTANCES.read_text().strip()
    if args.inotify_instances:
        INSTANCES.write_text(str(args.inotify_instances))
    try:
        run(args)
    finally:
        INSTANCES.write_text(limit)


#: The per-user inotify descriptor limit.
INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")


def run(args: argparse.Namespace) -> None:
    n = args.daemons
    eight = (importlib.resources.files("mokka.state") / "profiles" / "h100.yaml").read_text()
    with tempfile.TemporaryDirectory(prefix="mokka-bench-fleet-") as tmp:
        work = Path(tmp)
        profile = work / "profile.yaml"
        profile.write_text(eight)
        daemons: list[nodes.Daemon] = []
        bare = nodes.bare_trio()
        try:
            nodes.warm_bytecode()
            report(BENCH, "a file create where the roots are, before the start",
                   fsfloor.create_cost(work) * 1e6, "us")
            ports = nodes.free_ports(n)
            launched = time.time()
            for i in range(n):
                daemons.append(nodes.start(
                    work / f"fleet-{i}", f"fleet-{i}", "--profile", str(profile),
                    "--shutdown-timeout", f"{args.shutdown_timeout:g}", work=work,
                    port=ports[i]))
            ready = nodes.wait_ready(daemons, timeout=args.ready_timeout, poll=0.25)
            all_ready = max(d.started + ready[d.name] for d in daemons) - launched
            print(f"{n} daemons, launched in {daemons[-1].started - launched:.1f} s")
            report(BENCH, f"{n} daemons: all ready after", all_ready, "s", goal="<= 30 s")
            report(BENCH, "time to ready, p50", percentile(list(ready.values()), 50), "s")

            time.sleep(2)  # a benchmark, not a test: the last starts wind down
            pss = [nodes.pss_kib(d.pid) / 1024 for d in daemons]
            bare_pss = nodes.pss_kib(bare.pid) / 1024
            report(BENCH, "PSS per daemon, median", statistics.median(pss), "MiB",
                   floor=bare_pss, floor_name="bare trio", goal="<= 30 MiB")
            report(BENCH, "PSS per daemon, max", max(pss), "MiB")
            report(BENCH, "PSS, whole fleet", sum(pss), "MiB")

            time.sleep(args.settle)
            c0 = sum(nodes.cpu_seconds(d.pid) for d in daemons)
            time.sleep(args.idle)
            c1 = sum(nodes.cpu_seconds(d.pid) for d in daemons)
            held = [inotify_descriptors(d.pid) for d in daemons]
            print(f"  inotify descriptors: {sum(held)} held by the fleet, at most {max(held)} "
                  f"per daemon, {held.count(0)} daemon(s) with none; per-user limit "
                  f"{INSTANCES.read_text().strip()}")
            after = f", {args.settle:g} s after all ready" if args.settle else ""
            report(BENCH, f"idle load over {args.idle:g} s{after} (% of one core)",
                   100 * (c1 - c0) / args.idle, "%", goal="<= 5 %")

            saved = nodes.save_file(profile, four_gpu_profile(eight))
            done = nodes.wait_pass(daemons, 2, timeout=args.ready_timeout, poll=0.05)
            latencies = [stamp - saved for stamp in done.values()]
            report(BENCH, "fleet-wide profile change: all converged", max(latencies), "s")
            report(BENCH, "fleet-wide profile change: p50", percentile(latencies, 50), "s")
            observed = [(d.readyz() or {}).get("observed_generation") for d in daemons]
            print(f"  /readyz observed_generation 2 on {observed.count(2)} of {n} daemons")
        finally:
            bare.kill()
            bare.wait()
            exits = nodes.stop(daemons, timeout=args.shutdown_timeout * 4 + 60)
        codes = [code for code, _ in exits.values()]
        seconds = [elapsed for _, elapsed in exits.values()]
        in_budget = 0
        for daemon in daemons:
            code, elapsed = exits[daemon.name]
            logged = nodes.teardown_report(daemon)
            if (code == 0 and elapsed <= args.shutdown_timeout and logged and logged[1] == 0
                    and nodes.files_left(daemon.root) == 0):
                in_budget += 1
    if seconds:
        report(BENCH, "SIGTERM -> all exited", max(seconds), "s",
               goal=f"each within its {args.shutdown_timeout:g} s budget")
        report(BENCH, "daemons whose teardown stayed in budget", in_budget, "count",
               goal=f"{len(daemons)} of {len(daemons)}")
        print(f"  exit codes: {sorted(set(codes), key=str)}")


if __name__ == "__main__":
    main()
