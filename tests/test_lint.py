"""The house rules that a tool can check: ruff over the whole project.

The rule sets (``ASYNC``, ``B``, ``PT``, ``RUF``, ``SIM``, ``UP`` and the
pyflakes/pycodestyle basics) are in ``pyproject.toml``; a finding fails the
suite rather than waiting for someone to run the linter by hand.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT


def test_ruff_finds_nothing() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "mokka", "tests", "native", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
