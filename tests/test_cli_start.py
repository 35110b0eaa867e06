"""``mokka --version`` and ``mokka --help`` load no command's module.

They are what a person (or an install check) runs first: the daemon's
module alone brings trio, attrs, PyYAML and every simulator.  Each command
runs as ``python -X importtime -m mokka ...``, the real entry point, and the
modules it imported are read from that list; the time itself is
``bench/cli_start.py``'s business.  ``--help`` lists the commands from
``cli.COMMAND_SUMMARIES``, which must say what the modules register.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from mokka import cli
from tests.daemon_support import PROCESS_TIMEOUT, daemon_env

pytestmark = pytest.mark.timeout(60)

#: Never loaded to print a version or the command list.
HEAVY = ("mokka.daemon", "mokka.simulators", "mokka.ctl", "mokka.ctl.fabricmanager",
         "mokka.state", "trio", "attrs", "yaml", "hypercorn", "prometheus_client", "grpc")
#: ``--version`` reads the version without ``importlib.metadata`` (``cli.package_version``).
VERSION_NEVER = (*HEAVY, "importlib.metadata", "email", "zipfile")


#: The help's width, the same in the child and here (``mokka.helpformat``).
COLUMNS = "100"


def imported(*argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``python -X importtime -m mokka ARGV``: the process and the modules it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "mokka", *argv],
                          env={**daemon_env(), "COLUMNS": COLUMNS}, capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT, check=False)
    # "import time:  self [us] | cumulative | name", the name indented by depth
    modules = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
               if line.startswith("import time:") and "cumulative" not in line}
    assert "mokka.cli" in modules, done.stderr[-2000:]
    return done, modules


def loaded(modules: set[str], watched: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == w or m.startswith(w + ".") for w in watched))


def test_version_loads_no_command_and_no_metadata_library():
    done, modules = imported("--version")
    assert (done.returncode, done.stdout) == (0, f"mokka {importlib.metadata.version('mokka')}\n")
    assert loaded(modules, VERSION_NEVER) == []


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_loads_no_command_and_reads_as_the_full_parsers(flag, monkeypatch):
    monkeypatch.setenv("COLUMNS", COLUMNS)
    done, modules = imported(flag)
    assert done.returncode == 0, done.stderr[-2000:]
    assert loaded(modules, HEAVY) == []
    # every command listed, each with its module's own summary
    assert done.stdout == cli.build_parser().format_help()


def test_the_summaries_are_what_the_modules_register():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if hasattr(a, "_choices_actions"))
    registered = {choice.dest: choice.help for choice in subparsers._choices_actions}
    assert registered == cli.COMMAND_SUMMARIES
