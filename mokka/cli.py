"""Command line: ``mokka [daemon|cleanup|ctl|fabricmanager-ctl]``.

A thin dispatcher.  Each subcommand lives in its own module, which exposes
``register(subparsers)``; registration adds a parser whose ``func`` default
takes the parsed arguments and returns the process exit code.  ``mokka``
with no subcommand (or with only flags) is ``mokka daemon``, and
``mokka-node-agent`` (the name the chart's container runs) is ``mokka
daemon`` too.

Every parser is a ``MokkaArgumentParser``: no abbreviated flags (``--profil``
meaning ``--profile`` today would silently change meaning the day another
flag starts with the same letters), and a usage error is one line naming
the flag, like the errors the settings themselves raise.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from mokka.helpformat import Formatter

#: Each command and the module that registers it, in the order ``--help``
#: lists them.  A call parses with a parser holding only its own command's
#: module: the full parser imports every command's module, and each drags in
#: what the others never use (``mokka ctl`` would pay for the daemon's
#: simulators and health server, ten times what ctl itself needs; the daemon
#: for ctl's verbs).  Only ``--help``, ``--version`` and a misspelt command
#: build the full one.  ``tests/test_startup_imports.py`` keeps this table
#: equal to what the modules register, and checks what each command imports.
COMMAND_MODULES: dict[str, str] = {
    "daemon": "mokka.daemon.command",
    "cleanup": "mokka.daemon.command",
    "ctl": "mokka.ctl",
    "fabricmanager-ctl": "mokka.fabricmanager_ctl",
}
#: Modules providing subcommands, in the order ``--help`` lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMAND_MODULES.values()))
#: What the command line may start with instead of a command, and still not
#: mean ``mokka daemon``.
_TOP_LEVEL_FLAGS = ("-h", "--help", "--version")

#: How argparse's ``type=`` failures are spelt for a human.
_TYPE_NAMES = {"int": "an integer", "float": "a number"}

#: ``argument --flag: invalid int value: 'abc'`` (argparse's own wording).
_INVALID_VALUE = re.compile(
    r"^argument (?P<flags>\S+): invalid (?P<type>\w+) value: (?P<value>.*)$"
)
#: ``argument -q/--query: ...``: any other message about one argument.
_ABOUT_ARGUMENT = re.compile(r"^argument (?P<flags>\S+): (?P<rest>.*)$")


def one_line_error(message: str) -> str:
    """argparse's message about a flag, reworded as ``--flag: what, expected what``."""
    if match := _INVALID_VALUE.match(message):
        flag = match["flags"].split("/")[-1]
        kind = _TYPE_NAMES.get(match["type"], f"a valid {match['type']}")
        return f"{flag}: {match['value']} is not {kind}"
    if match := _ABOUT_ARGUMENT.match(message):
        return f"{match['flags'].split('/')[-1]}: {match['rest']}"
    return message


class MokkaArgumentParser(argparse.ArgumentParser):
    """No abbreviations; errors are one line on stderr and exit 2 (no usage dump).

    ``add_subparsers`` hands its parser class down, so every subcommand's
    parser (and their verbs') is one of these too.  Help is formatted by
    ``mokka.helpformat.Formatter`` (argparse's, without importing ``shutil``).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line_error(message)}\n")


def package_version() -> str:
    """The installed distribution's version (what ``pip show mokka`` says)."""
    # imported here: ``importlib.metadata`` alone costs about as much as a
    # whole ``mokka ctl`` call, and only ``--version`` needs it
    import importlib.metadata

    try:
        return importlib.metadata.version("mokka")
    except importlib.metadata.PackageNotFoundError:  # run from a bare source tree
        from mokka import __version__

        return __version__


class _VersionAction(argparse._VersionAction):
    """``--version``, the version looked up only when asked (see ``package_version``)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        self.version = f"mokka {package_version()}"
        super().__call__(parser, namespace, values, option_string)


def build_parser(modules: Sequence[str] = SUBCOMMAND_MODULES) -> MokkaArgumentParser:
    """The ``mokka`` parser with the subcommands of ``modules`` (default: all of them)."""
    parser = MokkaArgumentParser(
        prog="mokka",
        description="Makes a Kubernetes node look like it has NVIDIA GPUs.",
    )
    parser.add_argument("--version", action=_VersionAction)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in modules:
        importlib.import_module(module_name).register(subparsers)
    return parser


def command_names(parser: argparse.ArgumentParser) -> list[str]:
    """The subcommands ``parser`` knows, in registration order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = args_list[0] if args_list else None
    if first is None or (first.startswith("-") and first not in _TOP_LEVEL_FLAGS):
        args_list.insert(0, "daemon")
        first = "daemon"
    if first in COMMAND_MODULES:
        parser = build_parser([COMMAND_MODULES[first]])
    elif first in _TOP_LEVEL_FLAGS:
        parser = build_parser()
    else:
        # A word where a command goes is a misspelt command, not a stray
        # argument of the default command.
        print(
            f"mokka: error: unknown command {first!r}, expected one of: "
            f"{', '.join(COMMAND_MODULES)} (no command: daemon)",
            file=sys.stderr,
        )
        return 2
    args = parser.parse_args(args_list)
    return int(args.func(args))


def node_agent_main() -> int:
    """Entry point of ``mokka-node-agent``: always the daemon."""
    return main(["daemon", *sys.argv[1:]])
