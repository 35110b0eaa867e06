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
#: for ctl's verbs).  ``--help`` lists the commands from ``COMMAND_SUMMARIES``
#: and ``--version`` builds no parser at all: neither imports any command.
#: ``tests/test_startup_imports.py`` keeps this table equal to what the
#: modules register, and checks what each command imports.
COMMAND_MODULES: dict[str, str] = {
    "daemon": "mokka.daemon.command",
    "cleanup": "mokka.daemon.command",
    "ctl": "mokka.ctl.command",
    "fabricmanager-ctl": "mokka.ctl.fabricmanager",
}
#: Modules providing subcommands, in the order ``--help`` lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMAND_MODULES.values()))
#: Each command's one-line summary, as its module registers it: ``mokka
#: --help`` lists them without importing any command's module (the daemon's
#: alone takes trio, attrs, PyYAML and every simulator, some two seconds on
#: a cold cache, for a screen of text).  ``tests/test_cli_start.py`` keeps
#: them equal to what the modules register.
COMMAND_SUMMARIES: dict[str, str] = {
    "daemon": "run the node daemon (the default command)",
    "cleanup": "remove everything a (killed) daemon left under a node root",
    "ctl": "change the mock GPUs at runtime (failures, Xids, metrics)",
    "fabricmanager-ctl": "query the fabric manager stand-in (READY / NOT READY)",
}
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

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, but an unknown ``--flag`` is named before any missing required one.

        argparse checks the required flags before it reports what it did not
        recognise, so ``mokka ctl temp --cels 50`` would say ``--celsius`` is
        required, hiding the typo that caused it.  Only a parser without
        subcommands looks (the words after a command are its parser's).
        """
        leaf = not any(isinstance(a, argparse._SubParsersAction) for a in self._actions)
        if args is not None and leaf and (unknown := self.unknown_flags(args)):
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return super().parse_known_args(args, namespace)

    def unknown_flags(self, args: Sequence[str]) -> list[str]:
        """The ``--long`` words of ``args`` (up to a ``--``) that are none of its flags."""
        unknown = []
        for arg in args:
            if arg == "--":
                break
            if arg.startswith("--") and arg.split("=", 1)[0] not in self._option_string_actions:
                unknown.append(arg.split("=", 1)[0])
        return unknown


def package_version() -> str:
    """The installed distribution's version (what ``pip show mokka`` says).

    Read from the first ``mokka-*.dist-info/METADATA`` on ``sys.path``, the
    one ``importlib.metadata`` would find: importing that costs more than
    the rest of ``mokka --version`` together (it brings ``email``,
    ``zipfile`` and ``csv``), so it is only the fallback.
    """
    import os

    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if (name.startswith("mokka-") and name.endswith(".dist-info")
                    and (version := _metadata_version(
                        os.path.join(entry or ".", name, "METADATA")))):
                return version
    # imported here: ``importlib.metadata`` alone costs about as much as a
    # whole ``mokka ctl`` call
    import importlib.metadata

    try:
        return importlib.metadata.version("mokka")
    except importlib.metadata.PackageNotFoundError:  # run from a bare source tree
        from mokka import __version__

        return __version__


def _metadata_version(path: str) -> str | None:
    """The ``Version:`` header of a distribution's ``METADATA`` file; ``None`` without one."""
    try:
        with open(path, encoding="utf-8") as metadata:
            for line in metadata:
                if line.startswith("Version:"):
                    return line.partition(":")[2].strip() or None
                if not line.strip():  # the headers end at the first empty line
                    return None
    except (OSError, UnicodeDecodeError):
        return None
    return None


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


def help_parser() -> MokkaArgumentParser:
    """The ``mokka`` parser for ``--help``: every command listed, none of their modules loaded.

    Its help reads exactly as ``build_parser()``'s (``tests/test_cli_start.py``);
    a command's own flags are its module's, shown by ``mokka COMMAND --help``.
    """
    parser = build_parser(())
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, summary in COMMAND_SUMMARIES.items():
        subparsers.add_parser(name, help=summary, add_help=False)
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
    if first == "--version":
        # answered before any parser is built: ``mokka --version`` is what a
        # person or an install check runs first, and must be instant
        print(f"mokka {package_version()}")
        return 0
    if first in COMMAND_MODULES:
        parser = build_parser([COMMAND_MODULES[first]])
    elif first in _TOP_LEVEL_FLAGS:
        parser = help_parser()
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
