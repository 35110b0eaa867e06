"""Run every benchmark in bench/ and print one summary table.

    python -m bench [--quick] [--only NAME ...] [--args NAME="ARGS" ...] [--list]
                    [--timeout SECONDS]

(from the checkout's top directory, with the project's interpreter:
``.venv/bin/python -m bench``).

**Which scripts**: every ``bench/<name>.py`` with an
``if __name__ == "__main__":`` block; modules without one (``fsfloor``,
``figures``, ``nodes``) are helpers the scripts import.  A new script is
picked up by being there: nothing here names them.

**How**: each runs in its own process, ``python bench/<name>.py``, from the
checkout's top directory (so the benchmarks never share an interpreter, a
loaded library or a leftover thread), its output shown as it comes.

**--quick**: a script that wants a shorter run under ``--quick`` says how
with a module-level list of literal strings, ``QUICK_ARGS = ["--rounds",
"2"]``, read from its source (the script is not imported); a script without
one runs with its defaults either way.

**--args NAME="ARGS"**: arguments for one script (shell-split), in place of
its defaults or its quick arguments, e.g. ``--args fleet="--daemons 30"``.

**Summary**: scripts that report through ``figures.report`` append their
figures (value, floor, ratio, goal) to the file named by
``MOKKA_BENCH_FIGURES``, which this sets; the table lists those, and for
every script its exit status and wall time.  The exit status is 1 when any
script failed.
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.figures import FIGURES_ENV, format_value, read_records

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
#: Seconds a timed-out script gets to stop what it started after SIGINT.
STOP_GRACE = 180


def has_main_block(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [node.test.left, *node.test.comparators]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(
                isinstance(n, ast.Constant) and n.value == "__main__" for n in names
            ):
                return True
    return False


def quick_args(tree: ast.Module, path: Path) -> list[str]:
    """The script's ``QUICK_ARGS`` (a literal list of strings), or none."""
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "QUICK_ARGS" for t in targets):
                value = ast.literal_eval(node.value)
                if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                    raise SystemExit(f"{path}: QUICK_ARGS: expected a list of strings")
                return value
    return []


def discover(directory: Path = BENCH_DIR) -> dict[str, list[str]]:
    """Benchmark name -> its quick arguments, for every script in ``directory``."""
    found = {}
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        if has_main_block(tree):
            found[path.stem] = quick_args(tree, path)
    return found


def run_one(name: str, args: list[str], figures: Path, timeout: float) -> tuple[str, float]:
    print(f"\n=== {name} {' '.join(args)}".rstrip(), flush=True)
    env = dict(os.environ, **{FIGURES_ENV: str(figures)})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, str(BENCH_DIR / f"{name}.py"), *args],
                               cwd=REPO, env=env)
    try:
        code = process.wait(timeout=timeout)
        status = "ok" if code == 0 else f"exit {code}"
    except subprocess.TimeoutExpired:
        # SIGINT, not SIGKILL: the script's own clean-up stops the daemons it started.
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        status = f"timeout {timeout:g} s"
    return status, time.perf_counter() - started


def summary(runs: dict[str, tuple[str, float]], figures: Path) -> str:
    records = read_records(str(figures))
    rows = [("benchmark", "figure", "value", "floor", "ratio", "goal")]
    for name, (status, seconds) in runs.items():
        rows.append((name, f"[{status}, {seconds:.0f} s]", "", "", "", ""))
        mine = [r for r in records if r["bench"] == name]
        for r in mine:
            floor = "" if r["floor"] is None else (
                f"{format_value(r['floor'], r['unit'])} {r['floor_name']}".strip())
            times = r["ratio"]
            rows.append(("", r["figure"], format_value(r["value"], r["unit"]), floor,
                         "" if times is None or math.isnan(times) else f"{times:,.1f}x",
                         r["goal"]))
        if not mine:
            rows.append(("", "(figures in its output above)", "", "", "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="each script's QUICK_ARGS: a short run, for a smoke check")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument("--args", action="append", default=[], metavar='NAME="ARGS"',
                        help="arguments for one benchmark instead of its defaults")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds one benchmark may take before it is stopped")
    args = parser.parse_args(argv)
    scripts = discover()
    if args.list:
        for name, quick in scripts.items():
            print(f"{name:20s} quick: {' '.join(quick) or '(its defaults)'}")
        return 0
    unknown = sorted(set(args.only or ()) - set(scripts))
    if unknown:
        parser.error(f"no benchmark named {', '.join(unknown)} (known: {', '.join(scripts)})")
    chosen = [name for name in scripts if not args.only or name in args.only]
    arguments = {name: scripts[name] if args.quick else [] for name in chosen}
    for item in args.args:
        name, sep, text = item.partition("=")
        if not sep or name not in scripts:
            parser.error(f"--args {item!r}: expected NAME=ARGS, NAME one of {', '.join(scripts)}")
        arguments[name] = shlex.split(text)
    runs: dict[str, tuple[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="mokka-bench-") as tmp:
        figures = Path(tmp) / "figures.jsonl"
        for name in chosen:
            runs[name] = run_one(name, arguments[name], figures, args.timeout)
        print("\n" + summary(runs, figures))
    return 0 if all(status == "ok" for status, _ in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
