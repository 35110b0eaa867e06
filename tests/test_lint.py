"""The house rules that a tool can check: ruff over the whole project.

The rule sets (``ASYNC``, ``B``, ``PT``, ``RUF``, ``SIM``, ``UP`` and the
pyflakes/pycodestyle basics) are in ``pyproject.toml``; a finding fails the
suite rather than waiting for someone to run the linter by hand.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT, require_tool


def test_ruff_finds_nothing() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "mokka", "tests", "native", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_shell_scripts_pass_shellcheck() -> None:
    """The set-up scripts run on fresh machines, where a quoting slip is a failed CI run."""
    shellcheck = require_tool("shellcheck")
    scripts = sorted(str(p) for p in (ROOT / "scripts").iterdir() if p.is_file())
    result = subprocess.run(
        # -x: follow what the scripts source (scripts/lib), from the checkout
        [shellcheck, "-x", *scripts, str(ROOT / ".ci" / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert scripts
    assert result.returncode == 0, result.stdout + result.stderr
