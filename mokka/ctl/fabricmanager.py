"""``mokka fabricmanager-ctl -q``: is the (simulated) NVLink fabric ready?

The counterpart of ``nv-fabricmanager-ctl``'s status query for scripts and
probes: prints ``READY`` and exits 0 when the fabric manager stand-in has
written its readiness marker under the node root, else prints ``NOT READY``
and exits 1.  It only looks at the marker, so it answers the same whether
the daemon runs in this process's pod or elsewhere on the node.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mokka import layout
from mokka.errors import HostPathError
from mokka.noderoot import NodeRoot


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fabricmanager-ctl``; ``-q`` is required, like the real tool's query."""
    parser = subparsers.add_parser(
        "fabricmanager-ctl",
        help="query the fabric manager stand-in (READY / NOT READY)",
        description="Query the fabric manager stand-in's readiness: prints READY and exits 0, "
        "or prints NOT READY and exits 1.",
    )
    parser.add_argument("-q", "--query", action="store_true", required=True, help=(
        "print the fabric manager's state"))
    parser.add_argument("--root", metavar="DIR", help=(
        "node root the daemon writes under (env MOKKA_ROOT; default ./mokka-node)"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The root as the daemon finds it: ``--root``, ``MOKKA_ROOT``, then ``./mokka-node``."""
    root = Path(args.root or os.environ.get("MOKKA_ROOT") or layout.LOCAL_ROOT).absolute()
    # The marker's path itself: importing the simulator module would bring
    # the daemon's stack (trio, every simulator's registry) into a query that
    # only looks at one file.  Mapped by ``NodeRoot``, as ``Host`` maps it,
    # without ``Host``'s bookkeeping (and attrs) for a query that writes nothing.
    try:
        ready = os.path.lexists(NodeRoot(root).resolve(layout.FABRIC_READY_MARKER))
    except HostPathError:  # the path would climb out of the root: no marker of ours
        ready = False
    if ready:
        print("READY")
        return 0
    print("NOT READY")
    return 1
