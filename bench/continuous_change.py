"""Passes under a profile that never stops changing: 5 saves a second, then quiet.

Run: ``.venv/bin/python bench/continuous_change.py [--seconds 20] [--rate 5]``.

A daemon runs on a scratch root with a profile file (the built-in h100, 8
GPUs), and the profile is saved the way an editor does (a temp file renamed
over it), alternating 8 and 4 GPUs:

* **baseline**: single changes, the node idle before each, timed from the
  save until the daemon's log says ``reconcile pass ok generation=N`` for it
  (``bench/profile_change.py``'s figure, measured again in this run);
* **continuous**: ``--rate`` saves a second for ``--seconds``.  Every pass
  that completes meanwhile is counted from the log (passes per second, and
  the longest stretch with none), and after the last save the time until the
  pass over its generation completed, against the baseline.

A reconciler that let every newer input cut the pass in flight short would
complete no pass at all while the saves go on; the figures say it does,
about once per ``Reconciler.supersede_window`` plus a pass.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

import nodes
from figures import percentile, report
from profile_change import (
    SAMPLE_TIMEOUT,
    gpu_nodes,
    profile_variants,
    single_change,
    start_on_profile,
)

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--seconds", "5", "--rounds", "3"]

BENCH = "continuous_change"
DESIRED = re.compile(r"desired state generation (\d+) ")


def passes_between(daemon: nodes.Daemon, start: float, end: float) -> list[float]:
    """The log stamps of the good passes that finished between ``start`` and ``end``."""
    stamps = []
    for line in daemon.log_text().splitlines():
        if nodes.PASS_OK.search(line):
            stamp = nodes.log_stamp(line)
            if stamp is not None and start <= stamp <= end:
                stamps.append(stamp)
    return stamps


def newest_generation(daemon: nodes.Daemon) -> int:
    """The newest generation the daemon's source published, by its log."""
    return max((int(m[1]) for m in DESIRED.finditer(daemon.log_text())), default=0)


def wait_quiet(daemon: nodes.Daemon, saved: float) -> tuple[int, float]:
    """After the last save: its generation (the newest the source published once it
    was read) and the epoch second the pass over it finished."""
    deadline = time.monotonic() + SAMPLE_TIMEOUT
    while True:
        generation = newest_generation(daemon)
        done = nodes.pass_finished(daemon, generation)
        read = [nodes.log_stamp(line) for line in daemon.log_text().splitlines()
                if f"desired state generation {generation} " in line]
        if done is not None and read and (read[0] or 0) >= saved:
            return generation, done
        daemon.check_alive()
        if time.monotonic() > deadline:
            raise SystemExit(f"the last save was not converged after {SAMPLE_TIMEOUT:.0f} s")
        time.sleep(0.005)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="how long the profile keeps changing")
    parser.add_argument("--rate", type=float, default=5.0, help="saves per second meanwhile")
    parser.add_argument("--rounds", type=int, default=10, help="single changes (the baseline)")
    args = parser.parse_args(argv)
    nodes.warm_bytecode()
    variants = profile_variants()
    with tempfile.TemporaryDirectory(prefix="mokka-bench-continuous-") as tmp:
        daemon, profile = start_on_profile(Path(tmp), "bench-continuous", variants[1][0])
        try:
            nodes.wait_ready([daemon], timeout=600)
            generation = 1
            single = []
            for i in range(args.rounds):
                text, _gpus = variants[i % 2]
                generation += 1
                single.append(single_change(daemon, profile, text, generation))
            time.sleep(0.2)
            period = 1.0 / args.rate
            started = time.time()
            saves = 0
            while (now := time.time()) < started + args.seconds:
                text, gpus = variants[(args.rounds + saves) % 2]
                last_saved = nodes.save_file(profile, text)
                saves += 1
                time.sleep(max(0.0, started + saves * period - time.time()))
            _generation, converged = wait_quiet(daemon, last_saved)
            if gpu_nodes(daemon.root) != gpus:
                raise SystemExit(f"after the last save: {gpu_nodes(daemon.root)} GPU device "
                                 f"nodes, expected {gpus}")
            during = passes_between(daemon, started, now)
        finally:
            nodes.stop([daemon], timeout=120)
    gaps = [b - a for a, b in zip([started, *during], [*during, now], strict=True)]
    baseline = statistics.median(single) * 1000
    report(BENCH, "single change -> converged (median)", baseline, "ms")
    report(BENCH, f"saves per second for {args.seconds:.0f} s", saves / (now - started), "/s")
    report(BENCH, "passes completed per second meanwhile", len(during) / (now - started), "/s",
           goal=">= 1")
    report(BENCH, "longest stretch with no pass completed", max(gaps) * 1000, "ms",
           goal="<= 1000 ms")
    report(BENCH, "p50 stretch between completed passes",
           percentile([g * 1000 for g in gaps], 50), "ms")
    report(BENCH, "last save -> converged", (converged - last_saved) * 1000, "ms",
           floor=baseline, floor_name="a single change")


if __name__ == "__main__":
    main()
