"""``mokka.helpformat``: argparse's help, its width found without ``shutil``.

Every help text of every parser (``mokka``, each subcommand, ``mokka ctl``
and each of its verbs) must read exactly as argparse's stock formatter
writes it, at any width the environment or the terminal gives.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
from fcntl import ioctl
from termios import TIOCSWINSZ

import pytest

from mokka import cli
from mokka.ctl import command as ctl
from mokka.ctl.verbs import verbs_action
from mokka.helpformat import Formatter, terminal_columns
from tests.daemon_support import PROCESS_TIMEOUT


def every_parser() -> dict[str, argparse.ArgumentParser]:
    """Each parser a user can ask for help, by its command line, every ctl verb built."""
    parsers: dict[str, argparse.ArgumentParser] = {}
    top = cli.build_parser()
    parsers["mokka"] = top
    subcommands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in subcommands.choices.items():
        parsers[f"mokka {name}"] = parser
    for prefix, parser in (("mokka ctl", subcommands.choices["ctl"]),
                           ("ctl.main", _standalone_ctl())):
        verbs = verbs_action(parser)
        for verb in list(verbs.choices):
            parsers[f"{prefix} {verb}"] = verbs.load(verb)
    parsers["ctl.main"] = _standalone_ctl()
    return parsers


def _standalone_ctl() -> argparse.ArgumentParser:
    """The parser ``mokka.ctl.command.main`` builds (the standalone entry point)."""
    built: list[argparse.ArgumentParser] = []
    real = argparse.ArgumentParser.parse_args

    def keep(self, *args, **kwargs):
        built.append(self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = keep
    try:
        with pytest.raises(SystemExit):
            ctl.main(["status"])
    finally:
        argparse.ArgumentParser.parse_args = real
    return built[0]


def help_texts(parser: argparse.ArgumentParser, formatter: type) -> tuple[str, str]:
    """(help, usage) of ``parser`` with ``formatter``, the parser left as it was."""
    kept = parser.formatter_class
    parser.formatter_class = formatter
    try:
        return parser.format_help(), parser.format_usage()
    finally:
        parser.formatter_class = kept


@pytest.mark.parametrize("columns", [None, "40", "67", "200", "0", "-3", "wide"])
def test_every_help_reads_as_argparse_writes_it(columns, monkeypatch: pytest.MonkeyPatch):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    parsers = every_parser()
    assert {"mokka", "mokka daemon", "mokka ctl", "mokka ctl temp", "mokka ctl ib-counter",
            "ctl.main xid"} <= set(parsers)
    for name, parser in parsers.items():
        assert parser.formatter_class is Formatter, name
        ours = help_texts(parser, Formatter)
        assert ours == help_texts(parser, argparse.HelpFormatter), name
        assert ours[0].startswith("usage: "), name


@pytest.mark.parametrize("columns", [None, "1", "33", "250", "0", "-1", "80x", ""])
def test_the_width_is_shutils(columns, monkeypatch: pytest.MonkeyPatch):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.delenv("LINES", raising=False)
    assert terminal_columns() == shutil.get_terminal_size().columns


PROBE = """
import json, shutil
from mokka.helpformat import terminal_columns
print(json.dumps([terminal_columns(), shutil.get_terminal_size().columns]))
"""


@pytest.mark.parametrize(("columns", "env"), [(123, None), (0, None), (90, "57")])
def test_the_width_of_a_terminal_is_shutils(columns: int, env: str | None):
    """On a terminal (a pty of ``columns`` columns; 0: one that reports none)."""
    leader, follower = pty.openpty()
    try:
        ioctl(follower, TIOCSWINSZ, struct.pack("HHHH", 30, columns, 0, 0))
        environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        if env is not None:
            environ["COLUMNS"] = env
        done = subprocess.run([sys.executable, "-c", PROBE], stdout=follower,
                              stderr=subprocess.PIPE, env=environ, timeout=PROCESS_TIMEOUT,
                              check=True)
        assert not done.stderr
        out = os.read(leader, 4096).decode()
    finally:
        os.close(leader)
        os.close(follower)
    ours, theirs = json.loads(out.strip())
    assert ours == theirs
    assert ours == (int(env) if env else columns or 80)
