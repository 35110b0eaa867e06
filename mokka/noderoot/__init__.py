"""The node root: everything Mokka writes on a node goes through this package.

Owns where a node path lies beneath the node root (``paths``), the converge
that creates, compares, backs up and removes artifacts (``host``,
``convergence``, ``removal``, ``writebatch``, ``fsops``), and the bookkeeping
that lets teardown leave the node as it was found (``manifest``, ``backups``,
``statedir``, ``private_files``, ``shared_dirs``), with the fast paths of a
pass that changes nothing (``settled``, ``recording``, ``driftwatch``,
``filememo``).  May use ``mokka.errors``, ``mokka.layout``, the logging
helpers and ``mokka.state``; never the daemon, the simulators or ``mokka ctl``.

Its face is the names below: the simulators, the daemon and ``mokka ctl``
import those from ``mokka.noderoot`` and no module of it
(``tests/test_layers.py`` holds that).  Each is loaded when first asked for:
``mokka ctl status`` needs ``NodeRoot`` without the converge machinery, and
a recorded ``mokka ctl`` call needs ``read_private`` without ``Host``
(``tests/test_startup_imports.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

#: Each name of the face, and the module of this package that defines it.
FACE: dict[str, str] = {
    # the host and its converge
    "Host": "host",
    "GIVE_WAY": "host",
    # what a simulator asks for, and what a converge reports
    "Artifact": "artifacts",
    "File": "artifacts",
    "CopyOf": "artifacts",
    "Symlink": "artifacts",
    "CharDevice": "artifacts",
    "Directory": "artifacts",
    "ConvergeReport": "artifacts",
    # node paths beneath the root, without a host
    "NodeRoot": "paths",
    # a pass's activity, for the daemon's repair waves
    "Activity": "settled",
    # an owner's fault as one line for the operator
    "owner_line": "faults",
    # a root that ``mokka daemon --once`` made, removed by the last one out
    "mark_made": "rootmarker",
    "remove_if_emptied": "rootmarker",
    # private bookkeeping files, trusted only while still private
    "check_private": "private_files",
    "read_private": "private_files",
    # whether a path is a mount point (the driver root's bind mount)
    "MOUNTINFO": "fsops",
    "mounted_on": "fsops",
}

__all__ = [  # the keys of ``FACE`` (``tests/test_layers.py`` checks)
    "GIVE_WAY",
    "MOUNTINFO",
    "Activity",
    "Artifact",
    "CharDevice",
    "ConvergeReport",
    "CopyOf",
    "Directory",
    "File",
    "Host",
    "NodeRoot",
    "Symlink",
    "check_private",
    "mark_made",
    "mounted_on",
    "owner_line",
    "read_private",
    "remove_if_emptied",
]

if TYPE_CHECKING:
    from mokka.noderoot.artifacts import (
        Artifact,
        CharDevice,
        ConvergeReport,
        CopyOf,
        Directory,
        File,
        Symlink,
    )
    from mokka.noderoot.faults import owner_line
    from mokka.noderoot.fsops import MOUNTINFO, mounted_on
    from mokka.noderoot.host import GIVE_WAY, Host
    from mokka.noderoot.paths import NodeRoot
    from mokka.noderoot.private_files import check_private, read_private
    from mokka.noderoot.rootmarker import mark_made, remove_if_emptied
    from mokka.noderoot.settled import Activity


def __getattr__(name: str) -> object:
    """A name of the face, loaded from its module on first use (PEP 562)."""
    module = FACE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
