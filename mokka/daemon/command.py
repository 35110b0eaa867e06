"""The ``daemon`` and ``cleanup`` subcommands.

``mokka daemon`` (also plain ``mokka`` and ``mokka-node-agent``) parses the
daemon's settings plus every simulator plugin's flags, builds the
simulators, and runs either

* the daemon (``DaemonRunner``): resets the runtime overrides file (a pod
  start resets runtime state), reconciles until SIGTERM/SIGINT, tears down,
  exits 0 (1 if something failed); or
* ``--once``: one pass (stage, apply; daemons skipped), a summary on stdout,
  exit 0/1, files left in place (``mokka cleanup`` removes them).

``mokka cleanup --root DIR`` is the manual recovery after a killed daemon:
every owner's manifest is discarded, restoring what was overwritten.

Invalid flags print one line and exit 2, like argparse's own errors.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

import trio
import trio_util

from mokka import layout
from mokka.daemon.nodelock import hold_node_root, try_hold_node_root
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.runner import EXIT_FAILED, EXIT_OK, EXIT_USAGE, DaemonRunner
from mokka.errors import MokkaError, SpecError
from mokka.host import Host
from mokka.logs import setup_logging
from mokka.settings import LOCAL_ROOT, Settings
from mokka.simulators.base import Simulator
from mokka.simulators.registry import load_plugins

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``daemon`` (the daemon's flags plus every simulator plugin's) and ``cleanup``."""
    daemon = subparsers.add_parser(
        "daemon",
        help="run the node daemon (the default command)",
        description="Converge this node onto the desired state and keep it there; "
        "SIGTERM/Ctrl-C tears everything down again.",
    )
    Settings.add_arguments(daemon)
    for plugin in load_plugins():
        plugin.add_arguments(daemon)
    daemon.set_defaults(func=run_daemon_command)

    cleanup = subparsers.add_parser(
        "cleanup",
        help="remove everything a (killed) daemon left under a node root",
        description="Discard every simulator's recorded artifacts under the node root and "
        "restore the files they replaced; the manual recovery after a killed pod.",
    )
    cleanup.add_argument(
        "--root", metavar="DIR", help=("node root (env MOKKA_ROOT; default ./mokka-node)")
    )
    cleanup.set_defaults(func=run_cleanup_command)


def _usage_error(command: str, message: str) -> int:
    """One line on stderr, exit 2: what argparse does for its own errors."""
    print(f"mokka {command}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def build_simulators(args: argparse.Namespace) -> list[Simulator]:
    """Every registered simulator, built from its own flags (registry order)."""
    return [plugin.build(args) for plugin in load_plugins()]


def run_daemon_command(args: argparse.Namespace) -> int:
    """``mokka daemon``: validate, set up logging, make the root, run; the exit code.

    A root this command had to create (the local default ``./mokka-node``)
    is removed again on exit when teardown left it empty, so a local run
    leaves the working directory as it found it.
    """
    try:
        settings = Settings.from_args(args)
        simulators = build_simulators(args)
    except SpecError as exc:
        return _usage_error("daemon", str(exc))
    setup_logging(level=settings.log_level, fmt=settings.log_format)
    root = settings.root.absolute()
    created_root = not root.exists()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _usage_error("daemon", f"--root: cannot create {root}: {exc.strerror}")
    host = Host(root)
    code = EXIT_FAILED
    try:
        code = trio.run(run_once if settings.once else run_daemon, settings, host, simulators)
    except* SpecError as group:
        # An input no retry can fix, raised before the daemon got going.
        code = _usage_error("daemon", "; ".join(str(e) for e in group.exceptions))
    except* MokkaError as group:
        for exc in group.exceptions:
            logger.error("%s", exc)
    finally:
        if created_root and not settings.once:
            # ``mokka`` with no flags made ./mokka-node; leave the directory as found.
            with contextlib.suppress(OSError):  # not empty: left on purpose or by a failure
                root.rmdir()
    return code


def _source(settings: Settings, host: Host):
    # Imported here: the state package's file source pulls in inotify
    # machinery that ``mokka cleanup`` and ``--help`` never need.
    from mokka.state.sources import make_source

    return make_source(settings, host)


def overrides_path(settings: Settings, host: Host) -> Path:
    """The overrides file the daemon reads: ``--overrides`` or the node path under the root.

    Resolved the way the file source resolves it (the last component is not
    followed), so the reset below and the source agree on the file.
    """
    if settings.overrides is not None:
        return settings.overrides
    return host.resolve(layout.OVERRIDES)


def _reset_overrides(path: Path) -> None:
    from mokka.state.overrides import reset_file

    try:
        reset_file(path)
    except OSError as exc:
        # A read-only mount (an overrides file given by a ConfigMap): it is
        # not runtime state then, and the daemon can serve it as it is.
        logger.warning("could not reset the overrides file %s: %s", path, exc.strerror)


async def run_daemon(settings: Settings, host: Host, simulators: list[Simulator]) -> int:
    """The long-lived daemon (``DaemonRunner``) over the file source."""
    path = overrides_path(settings, host)
    logger.info(
        "daemon starting: profile %s, node %s, root %s",
        settings.profile,
        settings.node_name,
        host.root,
        extra={"health_addr": "{}:{}".format(*settings.health_addr)},
    )
    runner = DaemonRunner(
        host=host,
        simulators=simulators,
        source=_source(settings, host),
        health_addr=settings.health_addr,
        shutdown_timeout=settings.shutdown_timeout,
        repair_interval=settings.resync_interval,
        # ...nor the pod: teardown drops them before discarding the directory they live in.
        release_runtime_state=lambda: _reset_overrides(path),
    )
    code = EXIT_FAILED
    try:
        async with hold_node_root(host.root):
            # A pod (re)start resets runtime state: injected failures do not
            # survive it.  Only once the root is ours: a daemon still waiting
            # for it must not wipe the failures injected into the one holding it.
            _reset_overrides(path)
            code = await runner.run()
    except* OSError as group:
        # Raised only before anything was staged: the probes could not listen.
        logger.error(
            "cannot serve probes on %s:%d: %s",
            *settings.health_addr,
            "; ".join(str(e) for e in group.exceptions),
        )
    return code


async def run_once(settings: Settings, host: Host, simulators: list[Simulator]) -> int:
    """One pass over the first state the source produces; prints a summary.

    The state comes from the same source the daemon uses (not straight from
    the compiler), so ``--once`` reads the topology and overrides files
    exactly like the daemon would.  No supervisor: daemons are skipped, and
    nothing is torn down (``mokka cleanup`` does that on request).
    """
    updates = trio_util.AsyncValue(None)
    async with trio.open_nursery() as nursery:
        await nursery.start(_source(settings, host).run, updates)
        update = updates.value
        nursery.cancel_scope.cancel(reason="--once has its state")
    if update is None or update.state is None:
        error = getattr(update, "error", None) or "the state source produced no state"
        print(f"no state to reconcile: {error}")
        return EXIT_FAILED
    reconciler = Reconciler(host, simulators, supervisor=None)
    async with hold_node_root(host.root):
        result = await reconciler.reconcile_once(update.state)
    print(result.summary())
    print(f"node root: {host.root} (remove with: mokka cleanup --root {host.root})")
    return EXIT_OK if result.ok else EXIT_FAILED


def run_cleanup_command(args: argparse.Namespace) -> int:
    """``mokka cleanup``: discard every owner's manifest under the root; lists what went."""
    root_text = args.root or os.environ.get("MOKKA_ROOT") or str(LOCAL_ROOT)
    root = Path(root_text).absolute()
    if not root.is_dir():
        return _usage_error("cleanup", f"--root: {root} is not a directory")
    with try_hold_node_root(root) as held:
        if not held:
            print(
                f"mokka cleanup: error: a Mokka daemon is running on {root}; stop it "
                "(its teardown removes what it staged) instead of cleaning up under it",
                file=sys.stderr,
            )
            return EXIT_FAILED
        try:
            report = Host(root).discard_all()
        except MokkaError as exc:
            # Every owner was tried; what could not go stays recorded for another run.
            print(f"mokka cleanup: error: {exc}", file=sys.stderr)
            return EXIT_FAILED
    for path in report.removed:
        print(f"removed {path}")
    print(f"{len(report.removed)} path(s) removed under {root}")
    return EXIT_OK
