"""The daemon's nursery tree; its nesting is its shutdown order (ARCHITECTURE §5).

```
signal receiver (open for the whole run: a second signal during teardown is ignored)
outer nursery
├── health server (hypercorn, quart-trio app)          ← stops last
└── inner nursery (cancel scope: SIGTERM/SIGINT cancel it, with a reason)
    ├── signal watcher
    ├── supervisor (its nursery owns the daemons)
    ├── reconcile loop (a nursery per wave, per pass)
    └── state source → newest SourceUpdate into an AsyncValue
    finally, shielded and bounded: teardown (revoke, discard)
```

The inner nursery ends on a signal (normal exit, code 0) or because one of
its tasks raised (the error is logged, code 1).  Either way its tasks,
daemons included, are gone when teardown starts, and teardown runs while
the probes still answer (``/readyz`` reports the stopped daemons); only
then does the health server get its shutdown trigger.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING

import attrs
import trio
import trio_util

from mokka.daemon.health import DaemonView, create_app, serve_health
from mokka.daemon.reconciler import Reconciler
from mokka.daemon.supervisor import Supervisor
from mokka.daemon.teardown import TeardownReport, teardown
from mokka.errors import SpecError
from mokka.host import Host
from mokka.simulators.base import Simulator

if TYPE_CHECKING:
    from mokka.state.sources.base import SourceUpdate, StateSource

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

#: Signals that tear the node down: the kubelet's SIGTERM and a user's Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
    #: Install SIGTERM/SIGINT handlers (the process does; embedding code may not).
    handle_signals: bool = True
    #: Seconds after which an unchanged state is reconciled again to repair
    #: drift (``--resync-interval``; see ``Reconciler.repair_interval``).
    repair_interval: float = 0.0
    #: Called between revoke and discard (see ``teardown``): drops runtime
    #: state such as the overrides file that lives in a staged directory.
    release_runtime_state: Callable[[], object] | None = None
    supervisor: Supervisor = attrs.field(init=False)
    reconciler: Reconciler = attrs.field(init=False)
    #: What teardown reported, once it ran.
    teardown_report: TeardownReport | None = attrs.field(default=None, init=False)
    _inner: trio.CancelScope | None = attrs.field(default=None, init=False)
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

    @property
    def view(self) -> DaemonView:
        return DaemonView(self.reconciler, self.simulators, self.supervisor)

    def stop(self, reason: str) -> None:
        """Begin an orderly shutdown (what SIGTERM does)."""
        self._stop_reason = self._stop_reason or reason
        if self._inner is not None:
            self._inner.cancel(reason=reason)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> int:
        """Run until stopped; ``started(health_port)`` once the source delivered its first read.

        Returns 0 after a signal (or ``stop``) and a clean teardown, 1 when
        something failed (a task of the inner nursery, or a teardown step),
        2 when a ``SpecError`` ended it (an input no retry can fix).
        """
        updates: trio_util.AsyncValue[SourceUpdate | None] = trio_util.AsyncValue(None)
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
                try:
                    try:
                        async with trio.open_nursery() as inner:
                            self._inner = inner.cancel_scope
                            if self._stop_reason is not None:
                                inner.cancel_scope.cancel(reason=self._stop_reason)
                            if signals is not None:
                                inner.start_soon(self._watch_signals, signals)
                            await inner.start(self.supervisor.run)
                            await inner.start(self.reconciler.run, updates)
                            await inner.start(self.source.run, updates)
                            task_status.started(port)
                    except* SpecError as group:
                        # A flag the source cannot serve (``--source control-plane``):
                        # the message says it all, a traceback would only hide it.
                        codes.add(EXIT_USAGE)
                        for exc in group.exceptions:
                            logger.error("invalid input; tearing down: %s", exc)
                    except* Exception as group:
                        codes.add(EXIT_FAILED)
                        logger.error("the daemon failed; tearing down", exc_info=group)
                finally:
                    self._inner = None
                    self.teardown_report = await teardown(
                        self.host,
                        self.simulators,
                        timeout=self.shutdown_timeout,
                        supervisor=self.supervisor,
                        release_runtime_state=self.release_runtime_state,
                    )
                    shutdown.set()
        if not self.teardown_report.clean:
            codes.add(EXIT_FAILED)
        # A plain failure outranks a usage error: it needs a human more.
        code = EXIT_FAILED if EXIT_FAILED in codes else max(codes, default=EXIT_OK)
        logger.info("daemon exiting", extra={"exit_code": code, "reason": self._stop_reason})
        return code

    @contextlib.contextmanager
    def _signals(self) -> Iterator[trio.abc.ReceiveChannel | None]:
        """SIGTERM/SIGINT as a channel, held for the whole run.

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
        originals = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        try:
            with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
                yield signals
        finally:
            for signum, handler in originals.items():
                signal.signal(signum, handler)

    async def _watch_signals(self, signals) -> None:
        """Turn a signal into ``stop``: a cancelled scope with a reason, not an exception."""
        async for signum in signals:
            name = signal.Signals(signum).name
            logger.info("received %s; tearing down", name, extra={"signal": name})
            self.stop(f"received {name}")
