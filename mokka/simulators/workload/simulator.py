"""The workload simulator: GPUs that pods hold look busy.

A ``Daemon`` (its own simulator rather than part of ``gpudriver``: it
follows the kubelet, not the profile, on its own clock, and a node without a
kubelet must not be affected by it at all).  ``run`` polls the kubelet's
pod-resources API every ``poll_interval`` seconds and rewrites the workload
file (``layout.WORKLOAD_CONFIG``) when the set of holders changed; the
library derives the readings from it.

* Level-triggered: each poll recomputes the whole allocation from the whole
  answer (``allocation_for``); nothing is accumulated across polls.
* No socket (a local run, a node whose kubelet has none): no file, every GPU
  idle, ready, and the reason says why.  The way to the socket is then
  watched (inotify), and the next look is made when something on it changes,
  so a kubelet that starts later is picked up at once, and a node without
  one costs no timer at all (without inotify: a look at every poll).  With
  ``--workload=off`` only a reload wakes the loop.
* A failed, slow or malformed answer: the last good file stays, readiness
  is false with the error, the next good poll recovers.
* ``reload`` (a new profile or GPU count) re-polls at once, so positions in
  the file always follow the State in force.
* Cancellation never waits for the kubelet: the blocking call runs in a
  worker thread that a cancelled poll abandons.  An abandoned call does not
  run on unseen: its decode stops at its next checkpoint
  (``trio.from_thread.check_cancelled``), and until the thread has ended no
  new call starts (one call in flight, abandoned or not: its own capacity
  limiter, so it never holds a token that teardown's threads wait for).
* The first failed poll after a good one is logged, later ones at most once
  per ``LOG_INTERVAL`` with a count: a hostile or broken kubelet cannot fill
  the log at the poll rate (readiness always says the newest failure).
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Callable
from pathlib import Path

import attrs
import trio
import trio_util

from mokka import layout
from mokka.errors import HostPathError
from mokka.noderoot import File, Host
from mokka.simulators.base import Readiness
from mokka.simulators.gpudriver import notice
from mokka.simulators.workload.allocation import Shares, allocation_for, render_workload
from mokka.simulators.workload.podresources import (
    AnswerError,
    Grant,
    Holder,
    PodResourcesClient,
)
from mokka.simulators.workload.settings import WorkloadSettings
from mokka.state.model import State
from mokka.state.sources.watch import WatchSet

logger = logging.getLogger(__name__)

#: Owner of the workload file.
OWNER = "workload"
#: Stands for the kubelet when allocatable devices are matched like grants.
_KUBELET = Holder("", "", "")
#: Seconds between two log lines of a run of failed polls.
LOG_INTERVAL = 60.0


class PollError(Exception):
    """One poll of the kubelet failed (unreachable, slow, malformed)."""


@attrs.define(eq=False)
class WorkloadSimulator:
    """Simulator and Daemon that turns the kubelet's allocation into a workload file."""

    settings: WorkloadSettings = attrs.field(factory=WorkloadSettings)
    #: Makes the client for a socket (tests pass a fake with the same methods).
    connect: Callable[[Path, float], PodResourcesClient] = PodResourcesClient
    name: str = attrs.field(default="workload", init=False)
    _state: State | None = attrs.field(default=None, init=False)
    _readiness: Readiness = attrs.field(
        factory=lambda: Readiness.not_ready("not started yet"), init=False
    )
    #: Set by ``reload``: poll again now rather than at the next interval.
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _client: PodResourcesClient | None = attrs.field(default=None, init=False)
    #: Watches the way to the socket while there is none (``None``: no inotify).
    _socket_watch: WatchSet | None = attrs.field(default=None, init=False)
    #: The last poll found nothing to poll until something changes: no socket
    #: (with its way watched), or ``--workload=off``.
    _until_changed: bool = attrs.field(default=False, init=False)
    #: The text last written (None: no file): an unchanged poll writes nothing.
    _written: str | None = attrs.field(default=None, init=False)
    #: One call in flight, abandoned or not (see the module docstring).
    _caller: trio.CapacityLimiter = attrs.field(
        factory=lambda: trio.CapacityLimiter(1), init=False
    )
    #: When (trio time) the last failed poll was logged; None once a poll succeeds.
    _logged_at: float | None = attrs.field(default=None, init=False)
    #: Failed polls not logged since then.
    _unlogged: int = attrs.field(default=0, init=False)
    #: Completed polls (successful or not), observable: tests wait on it.
    polls: trio_util.AsyncValue[int] = attrs.field(
        factory=lambda: trio_util.AsyncValue(0), init=False
    )

    @property
    def readiness(self) -> Readiness:
        return self._readiness

    async def stage(self, host: Host, state: State) -> None:
        # Nothing to write before the barrier: the file follows the kubelet,
        # and ``run``/``reload`` get every state that passed the barrier.
        if self._state is None:
            self._readiness = Readiness.not_ready("staged, not running yet")

    async def discard(self, host: Host) -> None:
        self._close()
        self._written = None
        await trio.to_thread.run_sync(host.discard, OWNER)

    async def reload(self, state: State) -> None:
        self._state = state
        self._wake.set()

    async def run(self, host: Host, state: State, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._state = state
        task_status.started()
        with trio.CancelScope(shield=True):  # a descriptor is never lost half way
            self._socket_watch = await trio.to_thread.run_sync(WatchSet.open)
        try:
            while True:
                self._wake = trio.Event()
                await self._poll_once(host)
                self.polls.value += 1
                if self._until_changed:
                    await self._wake_or_socket_change()
                else:
                    with trio.move_on_after(self.settings.poll_interval):
                        await self._wake.wait()
        finally:
            self._close()
            if self._socket_watch is not None:
                self._socket_watch.close()
                self._socket_watch = None

    async def _wake_or_socket_change(self) -> None:
        """Until a reload, or (with no socket) a change on the way to the socket."""
        with trio.CancelScope() as scope:

            async def woken() -> None:
                await self._wake.wait()
                scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(woken)
                if self.settings.mode == "off" or self._socket_watch is None:
                    await trio.sleep_forever()
                await self._socket_watch.changed()
                scope.cancel()

    async def _poll_once(self, host: Host) -> None:
        state = self._state
        assert state is not None
        self._until_changed = self.settings.mode == "off"
        if self.settings.mode == "off":
            await self._write(host, None)
            self._readiness = Readiness.ok("off (--workload=off): GPUs show no workload")
            return
        socket = await trio.to_thread.run_sync(self._find_socket, host)
        if socket is None:
            self._until_changed = self._socket_watch is not None and bool(
                self._socket_watch.watches
            )
            await self._write(host, None)
            self._readiness = Readiness.ok(
                f"no pod-resources socket at {self.settings.socket}: "
                "GPUs show no workload (no kubelet on this node root)"
            )
            return
        try:
            grants, allocatable = await self._call(socket)
        except PollError as exc:
            kept = "keeping the last good allocation" if self._written else "GPUs stay idle"
            self._readiness = Readiness.not_ready(
                f"pod-resources socket {self.settings.socket}: {exc}; {kept}"
            )
            self._log_failure(self._readiness.reason)
            return
        self._logged_at, self._unlogged = None, 0
        allocation = allocation_for(grants, state, resources=self.settings.resources)
        shares = Shares(memory=self.settings.memory_share, utilization=self.settings.utilization)
        await self._write(host, render_workload(state, allocation, shares))
        busy = len(allocation.processes)
        reason = f"{allocation.holders} container(s) hold {busy} of {len(state.gpus)} GPU(s)"
        offered = allocation_for(
            (Grant(_KUBELET, resource, device) for resource, device in allocatable),
            state, resources=self.settings.resources,
        )
        reason += f"; the kubelet can allocate {len(offered.processes)} of them"
        if allocation.unresolved:
            shown = ", ".join(allocation.unresolved[:3])
            reason += f"; {len(allocation.unresolved)} granted device(s) are no GPU here ({shown})"
        self._readiness = Readiness.ok(reason)

    def _socket_path(self, host: Host):
        """The socket under the root, or None when there is none (blocking)."""
        try:
            path = host.resolve(self.settings.socket, follow_last=True)
            return path if stat.S_ISSOCK(path.stat().st_mode) else None
        except (OSError, HostPathError):
            return None

    def _find_socket(self, host: Host):
        """``_socket_path``; when there is none, its way is watched and it is looked for again.

        Watched *before* the second look: a socket made after that look is
        an event waiting to be read, one made before it is found; none is
        missed.  Blocking.
        """
        socket = self._socket_path(host)
        if self._socket_watch is None:
            return socket
        if socket is not None:
            if self._socket_watch.watches:
                self._socket_watch.plan([])  # found: polled on the interval again
            return socket
        try:
            way = host.resolve(self.settings.socket, follow_last=True)
        except HostPathError:
            self._socket_watch.plan([])
            return None
        self._socket_watch.plan([way], why="; looking for the socket at every poll instead")
        return self._socket_path(host)

    def _log_failure(self, reason: str) -> None:
        """Log a failed poll, unless one was logged less than ``LOG_INTERVAL`` ago."""
        now = trio.current_time()
        if self._logged_at is not None and now - self._logged_at < LOG_INTERVAL:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more failed poll(s) since the last line)"
        logger.warning("workload: %s%s", reason, more if self._unlogged else "")
        self._logged_at, self._unlogged = now, 0

    async def _call(self, socket) -> tuple[tuple[Grant, ...], tuple[tuple[str, str], ...]]:
        if self._caller.borrowed_tokens:
            # An abandoned call has not ended yet (a client that ignores its
            # deadline): a second one would only add a thread and a decode.
            raise PollError("the previous call, abandoned, is still running; "
                            "no new call until it ends")
        if self._client is None or self._client.socket != socket:
            self._close()
            self._client = self.connect(socket, self.settings.call_timeout)
        client = self._client
        # The gRPC deadline bounds the call; the outer bound (twice it) only
        # guards against a client that ignores its deadline.  Either way a
        # cancelled poll abandons the thread instead of waiting for it.
        with trio.move_on_after(2 * self.settings.call_timeout) as scope:
            try:
                return await trio.to_thread.run_sync(
                    client.poll, trio.from_thread.check_cancelled,
                    abandon_on_cancel=True, limiter=self._caller,
                )
            except AnswerError as exc:
                raise PollError(str(exc)) from None
            except Exception as exc:  # grpc.RpcError and friends: the kubelet's side
                raise PollError(_rpc_problem(exc)) from None
        assert scope.cancelled_caught
        self._close()  # a stuck channel is not reused
        raise PollError(f"no answer within {2 * self.settings.call_timeout:g} s")

    async def _write(self, host: Host, text: str | None) -> None:
        if text == self._written:
            return
        files = [] if text is None else [File(layout.WORKLOAD_CONFIG, text, 0o644)]
        await trio.to_thread.run_sync(host.converge, OWNER, files)
        # Renamed into place (or removed) first, announced second: running
        # clients re-read at their next call (docs/engine-config.md).
        await trio.to_thread.run_sync(notice.bump, host)
        self._written = text
        logger.info("workload: %s", "file written" if text else "no workload file")

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _rpc_problem(exc: Exception) -> str:
    """One line for a failed call: gRPC's status and details, never a traceback."""
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if callable(code) and callable(details):
        return f"{code().name}: {details()}"[:200]
    return f"{type(exc).__name__}: {exc}"[:200]

