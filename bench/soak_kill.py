"""Soak: SIGKILL the real daemon at many seeded writes, ``mokka cleanup``, compare the root.

The same machinery as ``tests/test_fault_injection.py`` (daemons forked from
one zygote, killed at a chosen write of the first pass, of a change pass or
of teardown; see ``tests/fault_support.py``), for many more runs than CI
makes.  Prints the writes per phase, then one line per failed run (phase,
write, what went wrong, the log) and a summary: runs, kills that landed,
failures, seconds per run.  Exit 1 when any run did not end with the root
restored byte for byte.  Needs root (the planted files include another
user's setuid binary).

``--every-step`` kills at every occurrence of every teardown step instead
(``fault_support.step_of``; CI kills at the first and last of each), on a
root with a file of the user's at every path the daemon replaces, after a
``mokka ctl`` change (``--runs`` caps how many).

    .venv/bin/python bench/soak_kill.py [--runs 500] [--seed N] [--keep] [--every-step]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fault_support import (
    KillRun,
    calibrate,
    kill_and_clean,
    kill_step_and_clean,
    plan_kills,
    teardown_steps,
    touched_paths,
    zygote,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--keep", action="store_true", help="keep every run's root and log")
    parser.add_argument("--every-step", action="store_true",
                        help="kill at every occurrence of every teardown step")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mokka-soak-"))
    failures = 0
    landed = collections.Counter()
    began = time.monotonic()
    with zygote() as server:
        if args.every_step:
            touched = touched_paths(server, work / "survey")
            steps = teardown_steps(server, work / "calibration", touched)
            seen = collections.Counter()
            plan = []
            for step, _path in steps:
                seen[step] += 1
                plan.append(KillRun("teardown", seen[step], step))
            plan = plan[:args.runs]
            print(f"{len(steps)} teardown writes in {len(seen)} steps")
        else:
            counts = calibrate(server, work / "calibration")
            print(f"seed {args.seed}; writes per phase: {counts}")
            plan = plan_kills(args.seed, counts, args.runs)
        for i, run in enumerate(plan):
            if args.every_step:
                out = kill_step_and_clean(server, work / f"run{i:04}", run, touched)
            else:
                out = kill_and_clean(server, work / f"run{i:04}", run)
            landed[run.phase] += out.killed
            if out.cleanup_code != 0 or not out.restored:
                failures += 1
                print(
                    f"FAIL run {i}: killed in {run.phase} at {run.step or 'write'} {run.kill_at} "
                    f"(landed: {out.killed}); cleanup exit {out.cleanup_code}, "
                    f"restored: {out.restored}; log {out.log}"
                )
            elif not args.keep:
                shutil.rmtree(work / f"run{i:04}")
    elapsed = time.monotonic() - began
    print(
        f"{len(plan)} runs, kills landed per phase {dict(landed)}, {failures} failed, "
        f"{elapsed / max(len(plan), 1):.2f} s per run ({elapsed:.0f} s)"
    )
    if failures == 0 and not args.keep:
        shutil.rmtree(work)
    else:
        print(f"runs kept under {work}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
