"""``mokka ctl``: which files of the node a call reads and writes.

The node root (``--root``, env ``MOKKA_ROOT``, the daemon's default) and,
beneath it, the overrides file every verb edits and the engine config a
target is checked against; or ``--file``, a file named directly.  Apart
from ``command`` so that the verbs' edits (``edits``) find the engine config
the same way without importing the command that runs them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mokka import layout
from mokka.errors import CtlError
from mokka.noderoot import NodeRoot
from mokka.state.checks import found


def node_root(args: argparse.Namespace) -> Path | None:
    """The node root (``--root``, env ``MOKKA_ROOT``, the daemon's default), made
    absolute as ``Host`` makes it; ``None`` with ``--file`` (a file named directly)."""
    if args.file:
        return None
    return Path(_path_arg("--root", args.root or os.environ.get("MOKKA_ROOT")
                          or str(layout.LOCAL_ROOT))).absolute()


def overrides_path(args: argparse.Namespace) -> Path:
    """The overrides file: ``--file`` as given, else its place under the node root.

    The root is mapped through ``NodeRoot.resolve``, the mapping ``Host``
    uses, so ctl and the daemon agree on the path and a layout path can
    never escape the root.
    """
    root = node_root(args)
    if root is None:
        return Path(_path_arg("--file", args.file))
    return NodeRoot(root).resolve(layout.OVERRIDES)


def engine_config_path(args: argparse.Namespace) -> Path:
    """The engine config beside the overrides file (``--file``'s directory, else
    the node root's config directory, mapped as ``overrides_path`` maps)."""
    root = node_root(args)
    if root is None:
        return Path(_path_arg("--file", args.file)).with_name("config.yaml")
    return NodeRoot(root).resolve(layout.ENGINE_CONFIG)


def _path_arg(flag: str, text: str) -> str:
    """``text``, a path given on the command line; ``CtlError`` for one no file can have.

    A NUL byte ends a path for the kernel, so every call taking it would
    raise ``ValueError``: refused here, once, naming the flag.
    """
    if "\0" in text:
        raise CtlError(f"{flag}: {found(text)} holds a NUL byte, expected a path")
    return text
