"""What a ready daemon costs while nothing happens: CPU, wake-ups, memory.

Run: ``.venv/bin/python bench/idle.py [--seconds 60] [--settle 5]``.

A daemon (built-in h100, every simulator, the default 60 s resync) starts
on a scratch root; once ``/readyz`` answers 200 and ``--settle`` seconds
have passed, its CPU seconds (``/proc/PID/stat``, all threads) and context
switches (every thread's ``status``) are read at the start and end of a
``--seconds`` window, and its PSS (``smaps_rollup``, with any child
processes).  Beside it, over the same window, a bare trio process
(``trio.run(trio.sleep_forever)``) is the floor: an idle event loop costs
no CPU and no wake-ups, and its PSS is the interpreter's own.  Passes the
daemon ran inside the window (the resync's repair pass) are counted from
its log.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import nodes
from figures import report

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--seconds", "10", "--settle", "2"]

BENCH = "idle"


def sample(pid: int) -> tuple[float, dict[int, int]]:
    return nodes.cpu_seconds(pid), nodes.thread_switches(pid)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds after ready before the window opens")
    args = parser.parse_args(argv)
    nodes.warm_bytecode()
    with tempfile.TemporaryDirectory(prefix="mokka-bench-idle-") as tmp:
        daemon = nodes.start(Path(tmp) / "node", "bench-idle")
        bare = nodes.bare_trio()
        try:
            nodes.wait_ready([daemon], timeout=600)
            time.sleep(args.settle)  # a benchmark, not a test: start-up's threads wind down
            passes_before = daemon.log_text().count("reconcile pass ")
            d0, b0 = sample(daemon.pid), sample(bare.pid)
            time.sleep(args.seconds)
            d1, b1 = sample(daemon.pid), sample(bare.pid)
            passes = daemon.log_text().count("reconcile pass ") - passes_before
            pss = nodes.pss_kib(daemon.pid) / 1024
            bare_pss = nodes.pss_kib(bare.pid) / 1024
        finally:
            bare.kill()
            bare.wait()
            nodes.stop([daemon], timeout=120)
    window = f"per {args.seconds:g} s"
    print(f"idle window {args.seconds:g} s; {passes} reconcile pass(es) in it")
    report(BENCH, f"idle daemon CPU {window}", d1[0] - d0[0], "s",
           floor=b1[0] - b0[0], floor_name="bare trio", goal="0 beyond asked-for timers")
    report(BENCH, f"idle daemon context switches {window}",
           nodes.switches_between(d0[1], d1[1]), "count",
           floor=nodes.switches_between(b0[1], b1[1]), floor_name="bare trio")
    report(BENCH, "ready daemon PSS", pss, "MiB", floor=bare_pss, floor_name="bare trio",
           goal="<= 30 MiB")


if __name__ == "__main__":
    main()
