"""``mokka --version`` and ``mokka --help``: what starting one costs.

Run: ``.venv/bin/python bench/cli_start.py [--runs 21]``.

The first commands a person (or an install check) runs; neither loads any
command's module (``mokka.cli``: the version is read without
``importlib.metadata``, the command list from ``COMMAND_SUMMARIES``), so
each should cost little more than starting the interpreter.  Measured
against ``python -c pass``, the floor, each as ``python -m mokka ...``
(what the ``mokka`` console script runs); ``mokka daemon --help`` is given
for comparison, a command that does load its module (the daemon's flags
are its simulators').

Each figure is the median over ``--runs`` processes of the wall time and of
the CPU time (user + system); on a busy machine the CPU time and the ratio
to the floor are the figures to read.  The goal is 100 ms of wall time for
``--version`` on an idle machine.  Bytecode is cached as for an installed
package (a private ``PYTHONPYCACHEPREFIX``, warmed by one unmeasured run of
each).  Asserts nothing (``tests/test_cli_start.py`` pins what they import).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import nodes
from figures import report

#: What ``python -m bench --quick`` passes.
QUICK_ARGS = ["--runs", "5"]
GOAL = "<= 100 ms"
#: Wall time of one process beyond which something is wrong, not slow.
PROCESS_TIMEOUT = 60.0
FLOOR = "python -c pass"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="processes per figure (median)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mokka-cli-start-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        cases = {
            FLOOR: ["-c", "pass"],
            "mokka --version": ["-m", "mokka", "--version"],
            "mokka --help": ["-m", "mokka", "--help"],
            "mokka daemon --help": ["-m", "mokka", "daemon", "--help"],
        }

        def timed(case: list[str]) -> tuple[float, float]:
            return nodes.timed_process([sys.executable, *case], env=env, timeout=PROCESS_TIMEOUT)

        for case in cases.values():  # compile and cache the bytecode, unmeasured
            timed(case)
        print(f"mokka start-up cost: median of {args.runs} runs each "
              f"({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        # interleaved, so a burst of load elsewhere hits every case alike
        for _ in range(args.runs):
            for name, case in cases.items():
                samples[name].append(timed(case))
        floor_wall = statistics.median(w for w, _ in samples[FLOOR]) * 1000
        floor_cpu = statistics.median(c for _, c in samples[FLOOR]) * 1000
        report("cli_start", f"{FLOOR} (wall)", floor_wall, "ms")
        report("cli_start", f"{FLOOR} (CPU)", floor_cpu, "ms")
        for name in list(cases)[1:]:
            wall = statistics.median(w for w, _ in samples[name]) * 1000
            cpu = statistics.median(c for _, c in samples[name]) * 1000
            report("cli_start", f"{name} (wall)", wall, "ms", floor=floor_wall,
                   floor_name=FLOOR, goal=GOAL if name == "mokka --version" else "")
            report("cli_start", f"{name} (CPU)", cpu, "ms", floor=floor_cpu, floor_name=FLOOR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
