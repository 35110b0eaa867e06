"""How a benchmark reports a figure: one printed line, and a record for the summary.

Every benchmark prints its own figures.  Those that call ``report`` also
append one JSON line per figure to the file named by ``MOKKA_BENCH_FIGURES``
when it is set (``python -m bench`` sets it), so the entry point can print
one table over all of them.  A figure is a value with its unit and, where
the benchmark measured one in the same run, the floor it is compared with
(the ratio is the figure that means something on a busy machine) and the
goal it is held to (text, for the reader: nothing here asserts it).
"""

from __future__ import annotations

import json
import math
import os

#: Environment variable naming the JSON-lines file figures are appended to.
FIGURES_ENV = "MOKKA_BENCH_FIGURES"


def percentile(samples: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100): a value that was measured."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ratio(value: float, floor: float | None) -> float | None:
    if floor is None or floor <= 0 or math.isnan(floor) or math.isnan(value):
        return None
    return value / floor


def format_value(value: float, unit: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if unit in ("", "count") or abs(value) >= 100:
        return f"{value:,.0f} {unit}".rstrip()
    return f"{value:,.1f} {unit}" if abs(value) >= 10 else f"{value:,.2f} {unit}"


def report(bench: str, figure: str, value: float, unit: str, *,
           floor: float | None = None, floor_name: str = "", goal: str = "") -> None:
    """Print one figure (with its floor and ratio) and record it for the summary."""
    parts = [f"  {figure:<44} {format_value(value, unit):>14}"]
    times = ratio(value, floor)
    if floor is not None:
        parts.append(f"   floor {format_value(floor, unit)} ({floor_name})")
    if times is not None:
        parts.append(f"   {times:,.1f}x")
    if goal:
        parts.append(f"   goal {goal}")
    print("".join(parts), flush=True)
    path = os.environ.get(FIGURES_ENV)
    if path:
        record = {"bench": bench, "figure": figure, "value": value, "unit": unit,
                  "floor": floor, "floor_name": floor_name, "ratio": times, "goal": goal}
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


def read_records(path: str) -> list[dict]:
    """Every figure recorded in ``path`` (missing file: none)."""
    try:
        with open(path, encoding="utf-8") as source:
            return [json.loads(line) for line in source if line.strip()]
    except FileNotFoundError:
        return []
