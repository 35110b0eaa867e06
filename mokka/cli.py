"""Command line: ``mokka [daemon|ctl|cleanup|...]``.

A thin dispatcher.  Each subcommand lives in its own module, which exposes
``register(subparsers)``; registration adds a parser whose ``func`` default
takes the parsed arguments and returns the process exit code.  ``mokka``
with no subcommand is ``mokka daemon``, and ``mokka-node-agent`` (the name
the chart's container runs) is ``mokka daemon`` too.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Modules providing subcommands, in the order ``--help`` lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "mokka.daemon.command",
    "mokka.ctl",
    "mokka.fabricmanager_ctl",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mokka",
        description="Makes a Kubernetes node look like it has NVIDIA GPUs.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    known = set(parser._subparsers._group_actions[0].choices) if parser._subparsers else set()
    if not args_list or (args_list[0] not in known and args_list[0] not in ("-h", "--help")):
        args_list.insert(0, "daemon")
    args = parser.parse_args(args_list)
    return int(args.func(args))


def node_agent_main() -> int:
    """Entry point of ``mokka-node-agent``: always the daemon."""
    return main(["daemon", *sys.argv[1:]])
