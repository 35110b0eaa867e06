"""``python -m bench`` finds every benchmark script, and every script starts.

No timing here: the benchmarks print figures, they are never asserted.
What can break silently is the plumbing: a new script the entry point does
not pick up, a script that no longer imports (a renamed helper, a moved
module), a ``QUICK_ARGS`` naming a flag the script no longer has, or a
summary that loses the figures.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import discover, summary
from bench.figures import FIGURES_ENV, percentile, report
from tests.support import ROOT

BENCH = ROOT / "bench"
#: Every script runs in its own interpreter; importing mokka and trio is most of it.
HELP_TIMEOUT = 120


def scripts_with_a_main_block() -> set[str]:
    """Found by plain text, independently of the entry point's parse."""
    return {
        path.stem for path in BENCH.glob("*.py")
        if not path.name.startswith("_") and 'if __name__ == "__main__":' in path.read_text()
    }


def test_every_script_is_discovered_and_no_helper() -> None:
    found = discover()
    assert set(found) == scripts_with_a_main_block()
    for benchmark in ("cold_warm", "ctl_latency", "profile_change", "idle", "fleet",
                      "node_pass", "profile_reload"):
        assert benchmark in found
    for helper in ("fsfloor", "figures", "nodes", "__main__", "__init__"):
        assert helper not in found


def test_a_new_script_is_picked_up_with_its_quick_args(tmp_path: Path) -> None:
    (tmp_path / "new_one.py").write_text(
        'QUICK_ARGS = ["--rounds", "2"]\n\nif __name__ == "__main__":\n    pass\n')
    (tmp_path / "plain.py").write_text('if __name__ == "__main__":\n    pass\n')
    (tmp_path / "helper.py").write_text("def helper():\n    return 1\n")
    assert discover(tmp_path) == {"new_one": ["--rounds", "2"], "plain": []}


def test_quick_args_that_are_not_strings_are_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text('QUICK_ARGS = ["--rounds", 2]\nif __name__ == "__main__":\n'
                                     "    pass\n")
    with pytest.raises(SystemExit, match=r"bad\.py: QUICK_ARGS: expected a list of strings"):
        discover(tmp_path)


def test_list_names_every_script() -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "--list"], cwd=ROOT,
                          capture_output=True, text=True, timeout=HELP_TIMEOUT)
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.strip()}
    assert listed == scripts_with_a_main_block()


def test_an_unknown_name_is_refused_with_the_known_ones() -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "--only", "no_such_bench"],
                          cwd=ROOT, capture_output=True, text=True, timeout=HELP_TIMEOUT)
    assert done.returncode == 2
    assert "no benchmark named no_such_bench" in done.stderr
    assert "cold_warm" in done.stderr


@pytest.mark.parametrize("name", sorted(scripts_with_a_main_block()))
def test_help_works_and_names_the_quick_flags(name: str) -> None:
    done = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=HELP_TIMEOUT)
    assert done.returncode == 0, f"{name} --help failed:\n{done.stderr[-3000:]}"
    assert done.stdout.startswith("usage:"), done.stdout[:500]
    for flag in (arg for arg in discover()[name] if arg.startswith("--")):
        assert re.search(rf"{re.escape(flag)}\b", done.stdout), f"{name}: no {flag} in --help"


def test_reported_figures_reach_the_summary(tmp_path: Path, monkeypatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    figures = tmp_path / "figures.jsonl"
    monkeypatch.setenv(FIGURES_ENV, str(figures))
    report("cold_warm", "h100 cold --once process", 96.0, "ms", floor=32.0,
           floor_name="tar -x", goal="<= 3x floor")
    report("idle", "ready daemon PSS", 41.5, "MiB")
    printed = capsys.readouterr().out
    assert "3.0x" in printed
    assert "floor 32.0 ms (tar -x)" in printed
    assert [json.loads(line)["bench"] for line in figures.read_text().splitlines()] == [
        "cold_warm", "idle"]
    table = summary({"cold_warm": ("ok", 12.0), "idle": ("exit 1", 3.0),
                     "fleet": ("ok", 1.0)}, figures)
    rows = table.splitlines()
    cold = next(row for row in rows if "h100 cold --once process" in row)
    assert re.search(r"96\.0 ms\s+32\.0 ms tar -x\s+3\.0x\s+<= 3x floor", cold)
    assert any("[exit 1, 3 s]" in row for row in rows)
    fleet = rows.index(next(row for row in rows if row.startswith("fleet")))
    assert "(figures in its output above)" in rows[fleet + 1]


def test_percentile_is_a_measured_value() -> None:
    samples = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(samples, 50) == 3.0
    assert percentile(samples, 99) == 5.0
    assert percentile(samples, 1) == 1.0
    assert percentile(list(range(1, 101)), 95) == 95


def test_args_for_an_unknown_benchmark_are_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "--args", "nope=--rounds 1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=HELP_TIMEOUT)
    assert done.returncode == 2
    assert "--args 'nope=--rounds 1': expected NAME=ARGS" in done.stderr
