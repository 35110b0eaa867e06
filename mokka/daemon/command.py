"""The ``daemon`` and ``cleanup`` subcommands.

``mokka daemon`` (also plain ``mokka`` and ``mokka-node-agent``) parses the
daemon's settings plus every simulator plugin's flags, builds the
simulators, and runs either

* the daemon (``DaemonRunner``): resets the runtime overrides file (a pod
  start resets runtime state), reconciles until SIGTERM/SIGINT, tears down,
  exits 0 (1 if something failed); or
* ``--once``: one pass (stage, apply; daemons skipped), a summary on stdout
  (one JSON object with ``--log-format json``), exit 0 for a ready node, 1
  for a failed pass, 3 for a pass that left the node not ready
  (``mokka.daemon.oncesummary``); files left in place (``mokka cleanup``
  removes them, and the root when ``--once`` made it: ``mokka.noderoot.rootmarker``).

``mokka cleanup --root DIR`` is the manual recovery after a killed daemon:
every owner's manifest is discarded, restoring what was overwritten.

Invalid flags print one line and exit 2, like argparse's own errors; so
does everything wrong that no retry can fix and that can be known before
the daemon starts (an unknown built-in profile, the control-plane source,
a probe address already in use), before anything is created or served.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import attrs
import trio
import trio_util

from mokka import layout
from mokka.daemon import oncesummary
from mokka.daemon.faultsignals import fault_signals_blocked
from mokka.daemon.limits import raise_fd_limit
from mokka.daemon.memory import limit_malloc_arenas
from mokka.daemon.nodelock import hold_node_root, try_hold_node_root
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.runner import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    HANDLED_SIGNALS,
    DaemonRunner,
    ignore_signals_until_handled,
)
from mokka.errors import HostFaultError, MokkaError, SpecError
from mokka.logs import setup_logging
from mokka.noderoot import ConvergeReport, Host, mark_made, remove_if_emptied
from mokka.settings import LOCAL_ROOT, Settings
from mokka.simulators.base import Simulator
from mokka.simulators.registry import add_plugin_arguments, build_simulators

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
    add_plugin_arguments(daemon)
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
    cleanup.add_argument(
        "-v", "--verbose", action="store_true", help="list every removed path, not only the counts"
    )
    cleanup.set_defaults(func=run_cleanup_command)


def _usage_error(command: str, message: str) -> int:
    """One line on stderr, exit 2: what argparse does for its own errors."""
    print(f"mokka {command}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def check_before_start(settings: Settings) -> None:
    """Refuse, with a ``SpecError``, what no retry can fix and needs no running daemon to see.

    A ``--profile`` that is neither a built-in name nor a file and does not
    look like a path (no ``/``, no ``.yaml``) is a misspelt built-in name:
    waiting for it would leave the daemon not ready forever.  A missing
    file *path* is left to the daemon, which serves the error and picks the
    file up once it appears (a ConfigMap mounted late).
    """
    from mokka.state.profile import BUILTIN_PROFILES, is_builtin
    from mokka.state.sources.controlplane import MESSAGE

    if settings.source == "control-plane":
        raise SpecError(MESSAGE)
    profile = settings.profile
    looks_like_path = "/" in profile or profile.endswith((".yaml", ".yml"))
    if not is_builtin(profile) and not looks_like_path and not Path(profile).exists():
        raise SpecError(
            f"--profile: {profile[:200]!r} is not a built-in profile (expected one of: "
            f"{', '.join(BUILTIN_PROFILES)}) nor an existing profile file"
        )


def run_daemon_command(args: argparse.Namespace) -> int:
    """``mokka daemon``: validate, set up logging, make the root, run; the exit code.

    A root this command had to create (the local default ``./mokka-node``)
    is removed again on exit when teardown left it empty, so a local run
    leaves the working directory as it found it.
    """
    try:
        settings = Settings.from_args(args)
        check_before_start(settings)
        simulators = build_simulators(args)
    except SpecError as exc:
        return _usage_error("daemon", str(exc))
    setup_logging(level=settings.log_level, fmt=settings.log_format)
    # before trio starts its first worker thread (``mokka.daemon.memory``)
    limit_malloc_arenas()
    raise_fd_limit()  # many clients, and files for the passes (``mokka.daemon.limits``)
    root = settings.root.absolute()
    created_root = not root.exists()
    try:
        root.mkdir(parents=True, exist_ok=True)
        if created_root and settings.once:
            # ``--once`` leaves its files for ``mokka cleanup``, which then
            # removes the root too (``mokka.noderoot.rootmarker``)
            mark_made(root)
    except OSError as exc:
        return _usage_error("daemon", f"--root: cannot create {root}: {exc.strerror}")
    if (unwritable := _unwritable(root)) is not None:
        # Said once, naming the root as given: every simulator would
        # otherwise fail on the same first write, each pass, each naming it
        # by its node path (``/.mokka-created-parents.json``, which reads
        # like the machine's own ``/``).
        logger.error("%s", unwritable, extra={"root": str(root)})
        return EXIT_FAILED
    host = Host(root)
    code = EXIT_FAILED
    held = _HeldRootRecord()
    with _signals_ignored_until_handled():
        try:
            daemon = partial(run_daemon, held=held, made_root=created_root)
            code = trio.run(
                run_once if settings.once else daemon,
                settings,
                host,
                simulators,
            )
        except* SpecError as group:
            # An input no retry can fix (the probe address in use, ...),
            # raised before the daemon got going.
            code = _usage_error("daemon", "; ".join(str(e) for e in _leaves(group)))
        except* MokkaError as group:
            for exc in _leaves(group):
                logger.error("%s", exc)
        finally:
            if created_root and settings.once:
                # nothing staged (no state, a failure before the pass): the
                # root goes now; else with ``mokka cleanup``
                remove_if_emptied(root)
            elif created_root and not held.taken:
                # ``mokka`` with no flags made ./mokka-node and stopped before
                # holding it (the runner removes it itself otherwise, before
                # letting go of the lock); leave it as found.
                with contextlib.suppress(OSError):  # not empty: left on purpose or by a failure
                    root.rmdir()
    return code


def _unwritable(root: Path) -> str | None:
    """Why this user may not create anything in ``root``; ``None`` when it may.

    Like a root this user may not even enter (the node lock says so and
    exits 1, ``nodelock``), one it may enter but not write is the user's
    mistake, not a fault a retry outlives.  A read-only mount is not
    refused here: it is a fault of the node, reported per pass and retried
    (a remount read-write heals it).
    """
    if not os.access(root, os.X_OK) or os.access(root, os.W_OK):
        return None
    with contextlib.suppress(OSError):
        if os.statvfs(root).f_flag & os.ST_RDONLY:
            return None
    return (f"cannot write to the node root {root}: Permission denied (EACCES): "
            f"uid {os.geteuid()} may not create files there")


@attrs.define
class _HeldRootRecord:
    """Whether the run got to hold the root (and so removed a root it made itself)."""

    taken: bool = False


@contextlib.contextmanager
def _signals_ignored_until_handled():
    """See ``ignore_signals_until_handled``; the handlers come back afterwards.

    The fault signals are blocked here too, before trio starts a thread:
    each thread keeps the mask it started with (``faultsignals``).
    """
    saved = {signum: signal.getsignal(signum) for signum in HANDLED_SIGNALS}
    ignore_signals_until_handled()
    try:
        with fault_signals_blocked():
            yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)


def _leaves(error: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds, however deeply nested."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for sub in error.exceptions for leaf in _leaves(sub)]
    return [error]


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


def _reset_overrides(path: Path, host: Host) -> None:
    from mokka.state.overrides import (
        MANIFEST_OWNERS,
        RESET_LOCK_TIMEOUT,
        records_locked,
        reset_file,
    )

    # the root's own file: reset without following any link beneath the root
    root = host.root if path.is_relative_to(host.root) else None
    with contextlib.ExitStack() as turn:
        try:
            # A ``mokka ctl`` call in progress finishes first (or, stuck, is
            # not waited for past the timeout), so the reset and the
            # discards below never interleave with its converges.
            turn.enter_context(records_locked(path, timeout=RESET_LOCK_TIMEOUT, root=root))
            reset_file(path, root=root)
        except OSError as exc:
            # A read-only mount (an overrides file given by a ConfigMap): it is
            # not runtime state then, and the daemon can serve it as it is.
            logger.warning("could not reset the overrides file %s: %s", path, exc.strerror)
        # What ``mokka ctl`` recorded under the root (the file, its lock, the
        # directories they kept) goes with it, so the root ends as it was found.
        for owner in MANIFEST_OWNERS:
            try:
                host.discard(owner)
            except (OSError, MokkaError) as exc:
                logger.warning("could not remove the overrides file's records (%s): %s",
                               owner, exc)


async def run_daemon(
    settings: Settings,
    host: Host,
    simulators: list[Simulator],
    *,
    held: _HeldRootRecord | None = None,
    made_root: bool = False,
) -> int:
    """The long-lived daemon (``DaemonRunner``) over the file source.

    The runner holds the node root's lock (answering probes while it waits
    for it) and, when the caller ``made_root``, removes the root again
    before letting the lock go; ``held.taken`` tells the caller it did.
    """
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
        release_runtime_state=lambda: _reset_overrides(path, host),
        # A pod (re)start resets runtime state: injected failures do not
        # survive it.  Only once the root is ours: a daemon still waiting
        # for it must not wipe the failures injected into the one holding it.
        on_root_held=lambda: _reset_overrides(path, host),
        remove_root_on_exit=made_root,
    )
    # A long-lived daemon's repair passes: inotify vouches for what it placed.
    host.watch_for_drift()
    try:
        return await runner.run()
    finally:
        host.stop_watching_for_drift()
        if held is not None and runner.held_root is not None:
            held.taken = runner.held_root.taken


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
    as_json = settings.log_format == "json"
    if update is None or update.state is None:
        error = getattr(update, "error", None) or "the state source produced no state"
        print(oncesummary.no_state_json(error) if as_json else f"no state to reconcile: {error}")
        return EXIT_FAILED
    reconciler = Reconciler(host, simulators, supervisor=None)
    async with hold_node_root(host.root):
        result = await reconciler.reconcile_once(update.state)
    # ``/readyz``'s verdict over what ``--once`` ran: a CI gate must not pass
    # a node that staged but cannot serve (``mokka.daemon.oncesummary``)
    verdict = oncesummary.judge(simulators)
    print((oncesummary.summary_json if as_json else oncesummary.summary_text)(
        result, verdict, host.root))
    return oncesummary.exit_code(result, verdict)


def run_cleanup_command(args: argparse.Namespace) -> int:
    """``mokka cleanup``: discard every owner's manifest under the root; lists what went."""
    root_text = args.root or os.environ.get("MOKKA_ROOT") or str(LOCAL_ROOT)
    root = Path(root_text).absolute()
    if not root.is_dir():
        return _usage_error("cleanup", f"--root: {root} is not a directory")
    try:
        report = _cleanup_held(root)
    except HostFaultError as exc:  # a root this user may not enter
        print(f"mokka cleanup: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if report is None:
        return EXIT_FAILED
    print_cleanup_summary(report, root, verbose=getattr(args, "verbose", False))
    if remove_if_emptied(root):
        print(f"removed {root} too (made by mokka daemon --once)")
    return EXIT_OK


#: What removed paths no simulator's manifest named are counted under: the
#: bookkeeping itself, and the directories converges made for it.
BOOKKEEPING = "mokka bookkeeping"


def owners_of_paths(host: Host) -> dict[str, str]:
    """Node path → the simulator whose manifest names it (read before discarding).

    Owners are per batch (``gpudriver-dev``, ``gpudriver-lib``); a person
    asks per simulator, the part before the first ``-``.
    """
    owner_of: dict[str, str] = {}
    for owner in host.owners():
        try:
            paths = host.owned(owner)
        except (OSError, MokkaError):
            continue  # discard_all reports it
        simulator = owner.split("-", 1)[0]
        for path in paths:
            owner_of.setdefault(path, simulator)
    return owner_of


@attrs.frozen
class CleanupReport:
    """What ``discard_all`` reported, and which simulator owned each path."""

    report: ConvergeReport
    owner_of: Mapping[str, str]


def print_cleanup_summary(cleanup: CleanupReport, root: Path, *, verbose: bool) -> None:
    """One line per simulator with its count (every path too with ``-v``), then the total.

    A path removed by several owners (a shared directory) is counted once.
    """
    removed = sorted(set(cleanup.report.removed))
    owner_of = cleanup.owner_of
    by_owner: dict[str, list[str]] = {}
    for path in removed:
        by_owner.setdefault(owner_of.get(path, BOOKKEEPING), []).append(path)
    for owner in sorted(by_owner, key=lambda o: (o == BOOKKEEPING, o)):
        print(f"{owner}: {len(by_owner[owner])} path(s) removed")
        if verbose:
            for path in by_owner[owner]:
                print(f"  {path}")
    hint = "" if verbose or not removed else " (-v lists them)"
    print(f"{len(removed)} path(s) removed under {root}{hint}")


def _cleanup_held(root: Path):
    """``discard_all`` under the node lock; ``None`` (said on stderr) when it failed."""
    with try_hold_node_root(root) as held:
        if not held:
            print(
                f"mokka cleanup: error: a Mokka daemon is running on {root}; stop it "
                "(its teardown removes what it staged) instead of cleaning up under it",
                file=sys.stderr,
            )
            return None
        host = Host(root)
        try:
            owner_of = owners_of_paths(host)
            report = host.discard_all()
            return CleanupReport(report=report, owner_of=owner_of)
        except MokkaError as exc:
            # Every owner was tried; what could not go stays recorded for another run.
            print(f"mokka cleanup: error: {exc}", file=sys.stderr)
            return None
