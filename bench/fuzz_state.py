"""A long run of the desired-state text fuzz: any number of generated inputs.

The suite's ``tests/test_fuzz_state.py`` tries a few thousand mutated
profiles, topology documents and overrides files per run; this runs the
same generator (``run_text_fuzz``: lines dropped, doubled, cut, characters
flipped, anchors, aliases and nested alias bombs spliced in, a tenth read
from real files through the bounded reader) over as many inputs as asked,
seed after seed, and prints what it met: inputs per second, how many parsed
and compiled, how many were refused with a ``SpecError``, and the slowest
single input (a hang or a blow-up shows there first).  Any other outcome
(a traceback, a long or unnamed message) stops the run with the seed and
the mutations that produced it.

    .venv/bin/python bench/fuzz_state.py [--inputs N] [--first-seed S]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# The generator lives with the tests, which run it in the suite.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_fuzz_state import run_text_fuzz

#: Inputs per seed: one seed's documents are one reproducible batch.
PER_SEED = 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs in all")
    parser.add_argument("--first-seed", type=int, default=1000,
                        help="seeds from here on (the suite uses 1..3)")
    args = parser.parse_args()
    ok = refused = done = 0
    slowest, slowest_what = 0.0, ""
    started = time.perf_counter()
    seed = args.first_seed
    while done < args.inputs:
        batch = min(PER_SEED, args.inputs - done)
        run = run_text_fuzz(seed, batch)
        ok, refused, done = ok + run.ok, refused + run.refused, done + batch
        if run.slowest > slowest:
            slowest, slowest_what = run.slowest, run.slowest_what
        elapsed = time.perf_counter() - started
        print(f"seed {seed}: {done} inputs, {done / elapsed:.0f}/s", flush=True)
        seed += 1
    elapsed = time.perf_counter() - started
    print(f"inputs          {done}")
    print(f"parsed+compiled {ok}")
    print(f"refused         {refused} (SpecError naming the file)")
    print("tracebacks      0")
    print(f"time            {elapsed:.1f} s ({done / elapsed:.0f} inputs/s)")
    print(f"slowest input   {slowest * 1000:.1f} ms: {slowest_what}")


if __name__ == "__main__":
    main()
