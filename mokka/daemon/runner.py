"""The daemon's nursery tree; its nesting is its shutdown order (ARCHITECTURE §5).

```
signal receiver (open for the whole run: a second signal during teardown is ignored)
outer nursery
├── health server (hypercorn, a bare ASGI app)          ← stops last
├── signal watcher (until teardown starts)
└── run scope (cancel scope: SIGTERM/SIGINT/SIGQUIT cancel it, with a reason)
    ├── wait for the node root's lock (the probes say whose it is)
    └── inner nursery
        ├── supervisor (its nursery owns the daemons)
        ├── reconcile loop (a nursery per wave, per pass)
        └── state source → newest SourceUpdate into an AsyncValue
        finally, shielded and bounded: teardown (revoke, discard)
```

The probes answer from the start, also while a second daemon on the same
root waits for the first one's lock.  The inner nursery ends on a signal
(normal exit, code 0) or because one of its tasks raised (the error is
logged, code 1).  Either way its tasks, daemons included, are gone when
teardown starts, and teardown runs while the probes still answer
(``/readyz`` reports the stopped daemons); only then does the health server
get its shutdown trigger.  A daemon stopped while it still waited for the
lock staged nothing and has nothing to tear down.

Signals: every catchable signal that would otherwise end the process
without a teardown is handled (docs/daemon.md has the table).  The stop
signals tear down; SIGHUP (what a closed terminal sends) re-reads every
input and runs a repair pass; the ignored ones are logged, at most one line
per signal a minute, so a flood of them cannot flood the log.  SIGPIPE and
SIGXFSZ stay ignored (Python's own setting: a closed pipe, a file over its
size limit, are an ``OSError`` where they happen).  The hardware-fault
signals, sent, tear down too, through ``mokka.daemon.faultsignals``.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections import Counter
from collections.abc import AsyncIterable, Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING

import attrs
import trio
import trio_util

from mokka.daemon.faultsignals import FAULT_SIGNALS, open_fault_signal_receiver
from mokka.daemon.health import DaemonView, create_app, serve_health
from mokka.daemon.nodelock import HeldRoot, hold_node_root
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.supervisor import Supervisor
from mokka.daemon.teardown import TeardownReport, teardown
from mokka.errors import SpecError
from mokka.noderoot import Host
from mokka.simulators.base import Simulator

if TYPE_CHECKING:
    from mokka.state.sources.base import SourceUpdate, StateSource

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

#: Signals that tear the node down: the kubelet's SIGTERM, a user's Ctrl-C
#: and Ctrl-\ (which would otherwise dump core with the node still staged),
#: and the ones that say the process must end: ``kill -ABRT``, init's SIGPWR
#: (the power is failing), the CPU-time limit's SIGXCPU (SIGKILL follows at
#: the hard limit), a seccomp filter's SIGSYS.  (A real ``abort()`` still
#: ends the process: the C library resets SIGABRT and raises it again.)
STOP_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGABRT,
    signal.SIGPWR,
    signal.SIGXCPU,
    signal.SIGSYS,
)
#: The signal that re-reads every input now (what ``kill -HUP`` means to a daemon).
RESYNC_SIGNAL = signal.SIGHUP
#: Signals whose default action is to end the process, with no meaning here:
#: logged and ignored, so a stray ``kill -USR1`` (or a profiler's timer, an
#: async-I/O notice, an application's real-time signal) cannot leave a
#: staged node.
IGNORED_SIGNALS = (
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGTRAP,
    signal.SIGSTKFLT,
    signal.SIGVTALRM,
    signal.SIGPROF,
    signal.SIGIO,
    *range(signal.SIGRTMIN, signal.SIGRTMAX + 1),
)
#: Everything the runner receives while it runs (the fault signals aside:
#: ``mokka.daemon.faultsignals``).
HANDLED_SIGNALS = (*STOP_SIGNALS, RESYNC_SIGNAL, *IGNORED_SIGNALS)
#: Seconds between two log lines about one ignored signal; the next line
#: counts the ones not logged.
IGNORED_LOG_INTERVAL = 60.0


def signal_name(signum: int) -> str:
    """``SIGTERM``; a real-time signal as ``SIGRTMIN+3`` (the enum names only both ends)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"


def ignore_signals_until_handled() -> None:
    """Ignore the non-stop signals before the runner's receiver exists.

    Called first thing by ``mokka daemon``: importing and compiling take a
    while, and a SIGHUP (or SIGUSR1) then would end the process by its
    default action.  SIGPIPE and SIGXFSZ are ignored by Python already.
    (The fault signals are blocked meanwhile: ``faultsignals``.)
    """
    for signum in (RESYNC_SIGNAL, *IGNORED_SIGNALS):
        signal.signal(signum, signal.SIG_IGN)


@attrs.define(eq=False)
class DaemonRunner:
    """One daemon run: build with the parts, ``await run()``, get an exit code."""

    host: Host
    simulators: Sequence[Simulator] = attrs.field(converter=tuple)
    source: StateSource
    #: ``(host, port)`` of the probes; port 0 picks a free one (reported by ``run``).
    health_addr: tuple[str, int] = ("127.0.0.1", 9091)
    #: Seconds teardown may take (``--shutdown-timeout``).
    shutdown_timeout: float = 25.0
    #: Install the signal handlers (the process does; embedding code may not).
    handle_signals: bool = True
    #: Seconds after which an unchanged state is reconciled again to repair
    #: drift (``--resync-interval``; see ``Reconciler.repair_interval``).
    repair_interval: float = 0.0
    #: Called between revoke and discard (see ``teardown``): drops runtime
    #: state such as the overrides file that lives in a staged directory.
    release_runtime_state: Callable[[], object] | None = None
    #: Hold the node root's lock (``nodelock``) for the run; the probes
    #: answer while it is waited for.
    lock_root: bool = True
    #: Called once the root is this daemon's, before anything is read or
    #: staged (a pod start resets the overrides file there).
    on_root_held: Callable[[], object] | None = None
    #: The root was made for this run: removed (when empty) before the lock
    #: goes, so a daemon waiting for it never starts on a vanishing root.
    remove_root_on_exit: bool = False
    supervisor: Supervisor = attrs.field(init=False)
    reconciler: Reconciler = attrs.field(init=False)
    view: DaemonView = attrs.field(init=False)
    #: What teardown reported, once it ran.
    teardown_report: TeardownReport | None = attrs.field(default=None, init=False)
    #: What holding the root found (``recreated``: this run made the root again).
    held_root: HeldRoot | None = attrs.field(default=None, init=False)
    _run_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _stop_reason: str | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        # Built here, not passed in: their lifetimes are this run's.
        self.supervisor = Supervisor(self.host)
        self.reconciler = Reconciler(
            self.host,
            self.simulators,
            supervisor=self.supervisor,
            repair_interval=self.repair_interval,
        )
        self.view = DaemonView(self.reconciler, self.simulators, self.supervisor)

    def stop(self, reason: str) -> None:
        """Begin an orderly shutdown (what SIGTERM does)."""
        self._stop_reason = self._stop_reason or reason
        self._run_scope.cancel(reason=reason)

    def resync(self) -> None:
        """Re-read every input now and repair the node even if nothing changed (SIGHUP)."""
        self.reconciler.request_repair()
        request = getattr(self.source, "request_resync", None)
        if request is not None:
            request()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> int:
        """Run until stopped; ``started(health_port)`` once the source delivered its first read.

        Returns 0 after a signal (or ``stop``) and a clean teardown, 1 when
        something failed (a task of the inner nursery, or a teardown step),
        2 when a ``SpecError`` ended it (an input no retry can fix).
        """
        shutdown = trio.Event()
        codes: set[int] = set()  # exit codes of what failed, if anything
        logger.info(
            "node root %s; simulators: %s",
            self.host.root,
            ", ".join(s.name for s in self.simulators) or "(none)",
            extra={"root": str(self.host.root)},
        )
        with self._signals() as signals:
            async with trio.open_nursery() as outer:
                port = await outer.start(
                    partial(
                        serve_health,
                        create_app(self.view),
                        self.health_addr,
                        shutdown_trigger=shutdown.wait,
                    )
                )
                watcher = trio.CancelScope()
                if signals is not None:
                    outer.start_soon(self._watch_signals, signals, watcher)
                try:
                    with self._run_scope:
                        async with self._hold_root():
                            codes |= await self._converge(task_status, port)
                finally:
                    # Signals from here on land in the channel unread.
                    watcher.cancel()
                    shutdown.set()
        if self.teardown_report is not None and not self.teardown_report.clean:
            codes.add(EXIT_FAILED)
        # A plain failure outranks a usage error: it needs a human more.
        code = EXIT_FAILED if EXIT_FAILED in codes else max(codes, default=EXIT_OK)
        logger.info("daemon exiting", extra={"exit_code": code, "reason": self._stop_reason})
        return code

    @contextlib.asynccontextmanager
    async def _hold_root(self):
        """The node root's lock for the body (when ``lock_root``); the wait shows in ``/readyz``."""
        if not self.lock_root:
            yield
            return
        async with hold_node_root(
            self.host.root, on_wait=self.view.set_holdup, remove_on_exit=self.remove_root_on_exit
        ) as held:
            self.held_root = held
            self.view.set_holdup(None)
            if self.on_root_held is not None:
                self.on_root_held()
            yield

    async def _converge(self, task_status: trio.TaskStatus[int], port: int) -> set[int]:
        """The inner nursery, then teardown; the exit codes of what failed."""
        updates: trio_util.AsyncValue[SourceUpdate | None] = trio_util.AsyncValue(None)
        codes: set[int] = set()
        try:
            try:
                async with trio.open_nursery() as inner:
                    await inner.start(self.supervisor.run)
                    await inner.start(self.reconciler.run, updates)
                    await inner.start(self.source.run, updates)
                    task_status.started(port)
            except* SpecError as group:
                # An input no retry can fix, found only once running.
                codes.add(EXIT_USAGE)
                for exc in group.exceptions:
                    logger.error("invalid input; tearing down: %s", exc)
            except* Exception as group:
                codes.add(EXIT_FAILED)
                logger.error("the daemon failed; tearing down", exc_info=group)
        finally:
            self.teardown_report = await teardown(
                self.host,
                self.simulators,
                timeout=self.shutdown_timeout,
                supervisor=self.supervisor,
                release_runtime_state=self.release_runtime_state,
            )
        return codes

    @contextlib.contextmanager
    def _signals(self) -> Iterator[tuple[AsyncIterable[int], ...] | None]:
        """The handled signals as receivers, held for the whole run.

        Held past the inner nursery on purpose: a second Ctrl-C during
        teardown lands in the (no longer read) channel instead of killing
        the process half-way through restoring the node; the deadline
        still bounds how long that takes.

        Trio re-raises signals still queued when the receiver closes, into
        the handlers that were in place before it: a second SIGTERM would
        then kill the process (exit 143) right after a clean teardown, a
        second Ctrl-C would end in a KeyboardInterrupt traceback.  So the
        handlers "before" the receiver are SIG_IGN, set here: the leftover
        signals are delivered into nothing, and the real handlers come back
        afterwards.
        """
        if not self.handle_signals:
            yield None
            return
        originals = {signum: signal.getsignal(signum) for signum in HANDLED_SIGNALS}
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        try:
            with (
                open_fault_signal_receiver() as faults,
                trio.open_signal_receiver(*HANDLED_SIGNALS) as signals,
            ):
                yield (signals,) if faults is None else (signals, faults)
        finally:
            for signum, handler in originals.items():
                signal.signal(signum, handler)

    async def _watch_signals(
        self, receivers: tuple[AsyncIterable[int], ...], scope: trio.CancelScope
    ) -> None:
        """A stop signal becomes ``stop`` (a cancelled scope with a reason, not an
        exception), SIGHUP a resync; the rest are only logged."""
        ignored = _IgnoredSignalLog()

        async def watch(signals: AsyncIterable[int]) -> None:
            async for signum in signals:
                self._on_signal(signum, ignored)

        with scope:
            async with trio.open_nursery() as nursery:
                for signals in receivers:
                    nursery.start_soon(watch, signals)

    def _on_signal(self, signum: int, ignored: _IgnoredSignalLog) -> None:
        name = signal_name(signum)
        extra = {"signal": name}
        if signum in STOP_SIGNALS or signum in FAULT_SIGNALS:
            logger.info("received %s; tearing down", name, extra=extra)
            self.stop(f"received {name}")
        elif signum == RESYNC_SIGNAL:
            logger.info("received %s; re-reading every input", name, extra=extra)
            self.resync()
        elif (unlogged := ignored.due(signum)) is not None:
            more = f", {unlogged} more not logged since the last line" if unlogged else ""
            logger.info(
                "received %s; ignored (SIGHUP re-reads the inputs, SIGTERM tears down%s)",
                name,
                more,
                extra=extra,
            )


@attrs.define
class _IgnoredSignalLog:
    """At most one log line per ignored signal every ``IGNORED_LOG_INTERVAL`` seconds."""

    _last: dict[int, float] = attrs.field(factory=dict)
    _unlogged: Counter[int] = attrs.field(factory=Counter)

    def due(self, signum: int) -> int | None:
        """The count not logged since the last line when a line is due now, else ``None``."""
        now = trio.current_time()
        last = self._last.get(signum)
        if last is not None and now - last < IGNORED_LOG_INTERVAL:
            self._unlogged[signum] += 1
            return None
        self._last[signum] = now
        return self._unlogged.pop(signum, 0)
