"""``mokka ctl``: change the mock GPUs of a running node.

Every verb edits the node's overrides file (``mokka.state.overrides``):
under the exclusive lock, read, change, validate the whole result, write a
temp file and rename it in place.  The node agent notices the rename
(inotify) and the mock library sees the new values on its next call; a
rejected change leaves the file untouched.

Targets (``--gpu``): an index (``0``), ``all``, or a GPU UUID.  A UUID is
checked against the engine config beside the overrides file
(``config.yaml``, which lists every GPU's index and per-node UUID) when that
file is there and readable; otherwise any well-formed ``GPU-`` UUID is
accepted as a key and matches nothing until a GPU with that UUID exists.

The file is found from the node root (``--root``, env ``MOKKA_ROOT``, the
same default as the daemon) or named directly (``--file``).  Under a node
root the file and its lock are never reached through a symlink, and the
first call records both in the manifests of ``overrides.MANIFEST_OWNERS``
through ``Host`` before creating them: ``mokka cleanup`` then removes them,
and the directories they kept, after a killed daemon.  Later calls find
them recorded and rewrite the file without the host (``mokka.ctl.records``).

The file is the whole interface: ``mokka ctl`` never talks to the daemon,
so it works from ``kubectl exec`` in the pod, from the host, or from a
test, with nothing listening.  The daemon recompiles the engine config
from it, and the library re-reads that at its next call (the daemon bumps a change
counter beside the engine config).

A writing verb prints one line: what it changed, on which GPU, and
whether a daemon will apply it (``mokka.ctl.report``): the file is written
either way, but with no daemon holding the node root (``mokka.ctl.daemon_presence``)
nothing acts on it until one starts, and a drill that forgot to start one
should not pass.

Exit status: 0 done; 2 the request was wrong (a bad value, an unknown
GPU, a change the schema refuses), as for argparse's own usage errors;
1 the node could not be read or changed (e.g. no config directory under
the root: a wrong ``--root``, or an agent that has not staged yet; every
verb, ``status`` too, says so alike); 3 the change is written but no
daemon holds the node root (``--no-daemon-ok``, or env
``MOKKA_CTL_NO_DAEMON_OK=1``, makes that 0: staging a change before the
daemon starts).  A script may wait and retry on 1; on 2 it must change
its call; on 3 it must start the daemon (the change is already there).

A call imports only what its verb needs (a drill makes one per change):
nothing of the daemon, and the ``ib-counter`` verb's module only when it
is named; it builds the parser of that one verb only; a ``--gpu`` target
is checked by reading the engine config's identity lines, not by parsing
the whole file as YAML; the host's bookkeeping (and attrs) only for the
first write; PyYAML only for a file Mokka did not write as JSON.

This module runs a parsed call: it finds the file, has
``update_overrides`` change it (through the node root's ``Host`` when
there is one) and turns failures into exit codes.  The rest of
the command lives beside it, one concern each: ``mokka.ctl.verbs`` (the
verbs, their flags and help, each verb's parser built only when named),
``mokka.ctl.edits`` (what a verb changes in the document),
``mokka.ctl.status`` (what ``status`` prints) and ``mokka.ctl.targets``
(which GPU a ``--gpu`` names).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mokka import layout
from mokka.ctl.daemon_presence import holder_soon
from mokka.ctl.edits import apply, build_edit, reset
from mokka.ctl.node_files import node_root, overrides_path
from mokka.ctl.records import already_recorded
from mokka.ctl.report import report_line
from mokka.ctl.status import shown, status
from mokka.ctl.targets import engine_gpus, parse_target
from mokka.ctl.verbs import DESCRIPTION, IB_COUNTER_MODULE, IB_COUNTER_VERB, add_verbs
from mokka.errors import CtlError, MokkaError, SpecError
from mokka.state.overrides import (
    FILE_MODE,
    MANIFEST_OWNERS,
    lock_path,
    records_locked,
    require_config_dir,
    update_overrides,
)

if TYPE_CHECKING:
    from mokka.noderoot import Host

#: The change is written, but no daemon holds the node root to apply it.
EXIT_NO_DAEMON = 3
#: Set to ``1``: the same as ``--no-daemon-ok`` on every call (a script
#: that stages changes before it starts the daemon).
NO_DAEMON_OK_ENV = "MOKKA_CTL_NO_DAEMON_OK"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``mokka ctl`` to the ``mokka`` command line (``mokka.cli``)."""
    parser = subparsers.add_parser(
        "ctl", help="change the mock GPUs at runtime (failures, Xids, metrics)",
        description=DESCRIPTION,
    )
    add_verbs(parser)
    parser.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    """``mokka ctl`` as a standalone entry point (tests, scripts)."""
    # ``mokka``'s own parser class: no abbreviations, an unknown flag named
    # as such (``mokka.cli``)
    from mokka.cli import MokkaArgumentParser

    parser = MokkaArgumentParser(prog="mokka ctl", description=DESCRIPTION)
    add_verbs(parser)
    return run(parser.parse_args(argv))


# ---- running ---------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Carry out a parsed ``mokka ctl`` command; returns the exit status (see the module).

    The verb's change is built before the lock is taken, so a bad flag
    fails without touching the file; the change then runs inside
    ``update_overrides``, which validates the whole result before writing.
    Without ``--gpu`` a change goes to ``all``.
    """
    try:
        if args.verb == IB_COUNTER_VERB:
            return importlib.import_module(IB_COUNTER_MODULE).run(args, node_host(args))
        path = overrides_path(args)
        if args.verb == "status":
            # read-only and lock-free: a rename never shows a half-written file
            return status(path, args, root=node_root(args))
        root = node_root(args)
        # whether a daemon holds the root, read while the call does its work
        holder = None if root is None else holder_soon(root)
        # read once: it checks the target and names its GPU in the report
        known = None if args.gpu is None else engine_gpus(path.with_name("config.yaml"))
        target = None if args.gpu is None else parse_target(args.gpu, path, known=known)
        if args.verb == "mig" and target is not None and known:
            # nvidia-smi mig and NVML record a layout under the GPU's UUID, and a
            # UUID's section wins over an index's: so does this one.
            target = next((uuid for uuid, index in known.items() if str(index) == target),
                          target)
        if args.verb == "reset":
            change(path, root, lambda doc: reset(doc, target))
        else:
            edit = build_edit(args)
            change(path, root, lambda doc: apply(doc, target or "all", edit))
        return reported(args, target, known, root, None if holder is None else holder())
    except (CtlError, SpecError) as exc:
        # one line per problem, each already naming the flag or the field
        problems = exc.problems if isinstance(exc, SpecError) else (str(exc),)
        for problem in problems:
            _error(problem)
        return 2
    except MokkaError as exc:
        _error(str(exc))
        return 1
    except OSError as exc:
        # The node could not be changed (the lock or the file cannot be
        # written): exit 1 with the file and the reason, not a traceback.
        _error(f"{exc.filename or 'overrides file'}: {exc.strerror or exc}")
        return 1


def reported(args: argparse.Namespace, target: str | None, known: dict[str, int] | None,
             root: Path | None, holder: int | OSError | None) -> int:
    """Print what the call changed and who applies it; 0, or ``EXIT_NO_DAEMON``.

    ``holder``: ``ctl_daemon.root_holder``'s answer.  With ``--file`` there
    is no node root to ask about: the line says so, and the call succeeds
    (the file may be any daemon's ``--overrides``).
    """
    print(shown(report_line(args, target, known, root, holder)))
    if root is None or isinstance(holder, int):
        return 0
    if getattr(args, "no_daemon_ok", False) or os.environ.get(NO_DAEMON_OK_ENV) == "1":
        return 0
    _error(f"no daemon applies this change (exit {EXIT_NO_DAEMON}; --no-daemon-ok makes it 0)")
    return EXIT_NO_DAEMON


def _error(problem: str) -> None:
    """Print one problem, escaped where a path or value from the command line was not UTF-8."""
    print(shown(f"mokka ctl: error: {problem}"), file=sys.stderr)


def node_host(args: argparse.Namespace) -> Host | None:
    """The node root's ``Host``; ``None`` with ``--file``.

    Imported here, not with the module: only a write records anything, and
    ``status`` (and ``--help``) then skip the host's bookkeeping code.
    """
    root = node_root(args)
    if root is None:
        return None
    from mokka.noderoot import Host

    return Host(root)


def change(path: Path, root: Path | None,
           edit: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """``update_overrides``, recording the file and its lock first when under a node root.

    Under a root, the lock is converged through ``Host`` first (owner
    ``MANIFEST_OWNERS[1]``, an empty file) so it is recorded before it
    exists, and the new text is converged as the file (owner
    ``MANIFEST_OWNERS[0]``) in place of the plain write: two owners,
    because each converge names the whole set of its owner's paths and the
    lock is made before the file's text is known.  Once an earlier call has
    recorded both (``ctl_records.already_recorded``), the text is rewritten
    in place without loading the host (``overrides.replace_text``).  All of it
    runs under ``records_locked`` (the config directory's ``flock``): calls
    at once take turns, and the daemon's reset at start never interleaves
    with them.  Nothing is created while the config directory is missing:
    ``require_config_dir`` reports that (a wrong ``--root``).
    """
    if root is None:
        update_overrides(path, edit)
        return
    require_config_dir(path)
    with records_locked(path, root=root):
        if already_recorded(root):
            update_overrides(path, edit, root=root)  # ``replace_text``, no host
            return
        from mokka.noderoot import File, Host

        host = Host(root)
        file_owner, lock_owner = MANIFEST_OWNERS
        lock = lock_path(Path(layout.OVERRIDES)).as_posix()
        host.converge(lock_owner, [File(lock, b"", FILE_MODE)])
        update_overrides(
            path, edit, root=root,
            store=lambda text: host.converge(file_owner, [File(layout.OVERRIDES, text, FILE_MODE)]),
        )
