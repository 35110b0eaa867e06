"""kernellog: announces injected Xids on the node's kernel log, exactly once each.

Node-problem-detector, gpud and NVSentinel learn about GPU faults by reading
the kernel log, so an injected Xid (``State.xids``, from the profile's
failure blocks and the runtime overrides) is written to ``/dev/kmsg`` under
the node root the way the driver prints it (record formats in ``kmsg``).

Exactly once, also across restarts: the ids already announced (and the GPUs
whose ``GPU at PCI:…`` line was printed) are persisted after every batch of
writes, through ``Host.converge`` (owner ``kernellog``), in
``/var/lib/nvml-mock/kernellog/announced.json``; a new process reads it
before writing anything.  A crash between a write and its persistence
repeats that batch rather than losing it: a duplicate Xid is harmless to
consumers, a missing one is not.  ``discard`` removes the file, so a
teardown (which also resets the overrides) starts the next pod afresh.

The ``Daemon.run`` loop waits for new states from ``reload`` (a
``trio_util.AsyncValue``; states coalesce, and each one lists every Xid in
force, so the newest is enough).  Writes respect the kernel's per-file rate
limit (``kmsg.WindowLimiter``): records over the burst wait for the next
window instead of being silently dropped by the kernel.

``/dev/kmsg`` is opened ``O_WRONLY | O_APPEND``.  On a real host it is the
kernel's device and is never created.  A root that is not a real host (a
laptop run on ``./mokka-node``, recognised by having no character device at
``/dev/null``) has no kernel log at all; there, with ``--kmsg-fallback-file
auto`` (the default), stage creates ``/dev/kmsg`` as a regular file (owner
``kernellog-kmsg``, removed by discard) so the records can be read with
``cat`` and the embedded default becomes ready.  Otherwise a missing
``/dev/kmsg`` makes the simulator not ready, with the reason, and it retries
periodically.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import stat

import attrs
import trio
import trio_util

from mokka import layout
from mokka.errors import SpecError
from mokka.noderoot import File, Host
from mokka.simulators import kmsg
from mokka.simulators.base import Readiness
from mokka.simulators.registry import SimulatorPlugin
from mokka.state.model import State, Xid

logger = logging.getLogger(__name__)

OWNER = "kernellog"
#: Owner of the regular-file stand-in for ``/dev/kmsg`` on a non-host root.
KMSG_OWNER = "kernellog-kmsg"
FALLBACK_MODES = ("auto", "off")
#: Ids already announced, persisted across restarts (see the module docstring).
ANNOUNCED = f"{layout.STATE_ROOT}/kernellog/announced.json"


@attrs.frozen(kw_only=True)
class KernelLogSettings:
    """Knobs of the kernel log announcer."""

    #: ``journald`` doubles the ``NVRM:`` prefix so journald keeps one in
    #: MESSAGE; ``raw`` writes it once, exactly as the driver does.
    style: str = "journald"
    #: Records per rate-limit window and the window's length in seconds: the
    #: kernel's ``/dev/kmsg`` defaults (10 per 5 s); over it records are dropped.
    burst: int = 10
    interval: float = 5.0
    #: Seconds between attempts to open a missing or unwritable ``/dev/kmsg``.
    #: 10 s: the file appears rarely (a test creating it), checks are cheap.
    retry_interval: float = 10.0
    #: ``auto``: on a root that is not a real host (no char device at
    #: ``/dev/null``) create ``/dev/kmsg`` as a regular file when missing;
    #: ``off``: never create it.  A real host's kernel log is never created.
    fallback_file: str = "auto"

    def __attrs_post_init__(self) -> None:
        problems = []
        if self.fallback_file not in FALLBACK_MODES:
            problems.append(
                f"--kmsg-fallback-file: {self.fallback_file!r}, expected one of "
                + ", ".join(FALLBACK_MODES)
            )
        if self.style not in kmsg.STYLES:
            styles = ", ".join(kmsg.STYLES)
            problems.append(f"--kmsg-style: {self.style!r}, expected one of {styles}")
        if self.burst < 1:
            problems.append(f"kmsg burst: {self.burst}, expected at least 1 record")
        for what, value in (("kmsg interval", self.interval), ("kmsg retry", self.retry_interval)):
            if not (math.isfinite(value) and value > 0):
                problems.append(f"{what}: {value!r}, expected seconds > 0")
        if problems:
            raise SpecError(problems)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KernelLogSettings:
        """Build from the parsed daemon flags; the limits stay the kernel's defaults.

        The burst and window are not flags: they mirror the kernel's fixed
        ``/dev/kmsg`` limits, and a user who raised them would only get
        records dropped silently.
        """
        return cls(style=args.kmsg_style, fallback_file=args.kmsg_fallback_file)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the kernellog flag, in its own argument group."""
    group = parser.add_argument_group("kernellog", "injected Xids on the node's kernel log")
    default = KernelLogSettings().style
    group.add_argument("--kmsg-style", choices=kmsg.STYLES, default=default, help=(
        "journald doubles the NVRM: prefix so journald readers see it in MESSAGE; raw writes "
        "it once, as the driver does (default: %(default)s)"))
    group.add_argument("--kmsg-fallback-file", choices=FALLBACK_MODES,
                       default=KernelLogSettings().fallback_file, help=(
        "auto: on a root that is not a real host (no /dev/null device), create /dev/kmsg as "
        "a regular file so Xid records can be read there; off: never (default: %(default)s)"))


@attrs.frozen
class _Announced:
    """What has been written already: Xid ids, and GPU UUIDs whose ``GPU at`` line was printed."""

    xids: frozenset[str] = frozenset()
    gpus: frozenset[str] = frozenset()

    def render(self) -> str:
        """Sorted, so an unchanged set renders identically and converge rewrites nothing."""
        return json.dumps({"version": 1, "xids": sorted(self.xids), "gpus": sorted(self.gpus)},
                          indent=1) + "\n"

    @classmethod
    def parse(cls, text: str, source: str) -> _Announced:
        """From the persisted file; a damaged file counts as empty (repeat rather than lose)."""
        try:
            doc = json.loads(text)
            xids, gpus = doc["xids"], doc["gpus"]
            if not all(isinstance(v, str) for v in [*xids, *gpus]):
                raise TypeError("ids must be strings")
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("%s: unreadable (%s), expected the announced-ids JSON; "
                           "announcing every injected Xid again", source, exc)
            return cls()
        return cls(frozenset(xids), frozenset(gpus))


@attrs.frozen
class _Line:
    """One record to write, and what writing it announces."""

    data: bytes
    xid: str | None = None
    gpu: str | None = None


@attrs.define(eq=False)
class KernelLogSimulator:
    """Simulator and Daemon announcing Xids; see the module docstring."""

    settings: KernelLogSettings = attrs.field(factory=KernelLogSettings)
    name: str = attrs.field(default="kernellog", init=False)
    _state: trio_util.AsyncValue[State | None] = attrs.field(
        factory=lambda: trio_util.AsyncValue(None), init=False
    )
    #: Xid records written by this instance (observable: tests wait on it
    #: instead of polling, so virtual times are exact).
    written: trio_util.AsyncValue[int] = attrs.field(
        factory=lambda: trio_util.AsyncValue(0), init=False
    )
    _limiter: kmsg.WindowLimiter = attrs.field(init=False)
    _announced: _Announced = attrs.field(factory=_Announced, init=False)
    _kmsg_problem: str | None = attrs.field(default=None, init=False)
    _staged: bool = attrs.field(default=False, init=False)
    _running: bool = attrs.field(default=False, init=False)
    #: Xid ids whose GPU is not in the state, logged once each.
    _orphans_logged: set[str] = attrs.field(factory=set, init=False)

    @_limiter.default
    def _make_limiter(self) -> kmsg.WindowLimiter:
        return kmsg.WindowLimiter(burst=self.settings.burst, interval=self.settings.interval)

    # ---- Simulator -----------------------------------------------------

    async def stage(self, host: Host, state: State) -> None:
        """Notes whether ``/dev/kmsg`` exists (creating the stand-in file if due)."""
        exists = await trio.to_thread.run_sync(
            _ensure_kmsg, host, self.settings.fallback_file == "auto"
        )
        if not self._running:
            self._kmsg_problem = None if exists else _missing(host)
        self._staged = True
        # The state is *not* handed to ``run`` here: the Stage wave may still
        # fail at the barrier, and an Xid on the kernel log is acted on at
        # once (node-problem-detector), so it waits for ``reload``, which
        # only a pass past the barrier calls, like NVML's events.

    async def discard(self, host: Host) -> None:
        """Forget what was announced: the next start announces the Xids then in force."""
        await trio.to_thread.run_sync(host.discard, OWNER)
        await trio.to_thread.run_sync(host.discard, KMSG_OWNER)
        self._announced = _Announced()
        self._staged = False

    @property
    def readiness(self) -> Readiness:
        """Not ready while ``/dev/kmsg`` cannot be opened: Xids would go nowhere.

        Records waiting for the rate limit do not make it unready: they are
        queued, not lost, and the kernel would be just as slow.
        """
        if not self._staged:
            return Readiness.not_ready("kernellog not staged yet")
        if self._kmsg_problem is not None:
            return Readiness.not_ready(self._kmsg_problem)
        if not self._running:
            return Readiness.not_ready("kernellog announcer not running")
        return Readiness.ok(f"{len(self._announced.xids)} Xid(s) announced ({self.settings.style})")

    # ---- Daemon --------------------------------------------------------

    async def reload(self, state: State) -> None:
        """Hand ``run`` the newest state; never blocks (an AsyncValue, not a queue)."""
        self._state.value = state

    async def run(
        self,
        host: Host,
        state: State,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Announce every Xid in the newest state not announced yet; see the module docstring."""
        self._state.value = state
        self._announced = await trio.to_thread.run_sync(_load, host)
        # Opened before ``started`` so readiness is settled when the supervisor
        # sees the daemon up.
        fd, self._kmsg_problem = await trio.to_thread.run_sync(_open_kmsg, host)
        self._running = True
        task_status.started()
        try:
            while True:
                current = self._state.value
                if fd is not None:
                    await self._announce(host, fd, current)
                    await self._state.wait_value(lambda s, seen=current: s is not seen)
                else:
                    # Retry on a timer, and at once when a new state arrives.
                    with trio.move_on_after(self.settings.retry_interval):
                        await self._state.wait_value(lambda s, seen=current: s is not seen)
                    fd, self._kmsg_problem = await trio.to_thread.run_sync(_open_kmsg, host)
        finally:
            self._running = False
            if fd is not None:
                os.close(fd)

    async def _announce(self, host: Host, fd: int, state: State) -> None:
        """Write the records ``state`` still calls for, window by window, persisting each batch."""
        current_ids = {x.id for x in state.xids}
        lines = self._lines(state)
        pruned = _Announced(self._announced.xids & current_ids, self._announced.gpus)
        if not lines:
            if pruned != self._announced:  # Xids withdrawn: a re-injection announces again
                self._announced = pruned
                await trio.to_thread.run_sync(_persist, host, pruned)
            return
        self._announced = pruned
        while lines:
            granted = self._limiter.grant(len(lines))
            if granted == 0:
                logger.info("kernellog: rate limit reached, %d record(s) wait for the next window",
                            len(lines))
                await self._limiter.wait()
                continue
            batch, lines = lines[:granted], lines[granted:]
            self._announced, error = await trio.to_thread.run_sync(
                _write_batch, host, fd, batch, self._announced
            )
            done = sum(1 for line in batch if line.xid in self._announced.xids)
            self.written.value += done
            if error is not None:
                raise error

    def _lines(self, state: State) -> list[_Line]:
        """The records still owed, in the state's Xid order, each GPU's header first."""
        lines: list[_Line] = []
        headed = set(self._announced.gpus)
        for xid in state.xids:
            if xid.id in self._announced.xids:
                continue
            try:
                gpu = state.gpu(xid.gpu_index)
            except KeyError:
                self._log_orphan(xid)
                continue
            if gpu.uuid not in headed:
                lines.append(_Line(kmsg.gpu_record(gpu, self.settings.style), gpu=gpu.uuid))
                headed.add(gpu.uuid)
            lines.append(_Line(kmsg.xid_record(gpu, xid.code, self.settings.style), xid=xid.id))
        return lines

    def _log_orphan(self, xid: Xid) -> None:
        if xid.id not in self._orphans_logged:
            self._orphans_logged.add(xid.id)
            logger.warning("kernellog: Xid %s names GPU %d, which this state does not have; "
                           "not announcing it", xid.id, xid.gpu_index)


# ---- blocking parts (worker threads) -----------------------------------


def _ensure_kmsg(host: Host, fallback: bool) -> bool:
    """Whether ``/dev/kmsg`` exists, after creating the stand-in file where allowed.

    Only when it is missing: once created, its content is the log, and
    converging it again would empty it.
    """
    if host.exists(layout.KMSG):
        return True
    if not fallback or _is_real_host(host):
        return False
    host.converge(KMSG_OWNER, [File(layout.KMSG, b"", 0o644)])
    return True


def _is_real_host(host: Host) -> bool:
    """A real host's root has device nodes; a local or test root has none at ``/dev/null``."""
    try:
        return stat.S_ISCHR(os.stat(host.resolve("/dev/null", follow_last=True)).st_mode)
    except OSError:
        return False


def _missing(host: Host) -> str:
    return f"{host.root}{layout.KMSG} does not exist: Xids cannot reach the kernel log"


def _open_kmsg(host: Host) -> tuple[int | None, str | None]:
    """Open the kernel log for appending, never creating it; (fd, None) or (None, reason)."""
    path = host.resolve(layout.KMSG, follow_last=True)
    try:
        # O_NONBLOCK only for the open: a FIFO without a reader fails (ENXIO)
        # instead of hanging the thread; writes block normally afterwards.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, _missing(host)
    except OSError as exc:
        reason = "no reader on the FIFO" if exc.errno == errno.ENXIO else exc.strerror
        return None, f"{path}: cannot open for writing: {reason}"
    os.set_blocking(fd, True)
    return fd, None


def _write_batch(
    host: Host, fd: int, batch: list[_Line], announced: _Announced
) -> tuple[_Announced, OSError | None]:
    """One ``write`` per record, then persist what was written (also after a failed write)."""
    xids, gpus = set(announced.xids), set(announced.gpus)
    error: OSError | None = None
    for line in batch:
        try:
            os.write(fd, line.data)
        except OSError as exc:
            error = exc
            break
        if line.xid is not None:
            xids.add(line.xid)
        if line.gpu is not None:
            gpus.add(line.gpu)
    result = _Announced(frozenset(xids), frozenset(gpus))
    if result != announced:
        _persist(host, result)
    return result, error


def _persist(host: Host, announced: _Announced) -> None:
    # Through converge: written atomically, recorded in the manifest, so
    # discard (also from a fresh process) removes it.
    host.converge(OWNER, [File(ANNOUNCED, announced.render(), 0o644)])


def _load(host: Host) -> _Announced:
    """What an earlier process announced (nothing when the file is absent)."""
    path = host.resolve(ANNOUNCED, follow_last=True)
    try:
        # Undecodable bytes become U+FFFD, which no JSON string of ids holds:
        # a file damaged that way is refused by ``parse`` like any other.
        text = path.read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return _Announced()
    return _Announced.parse(text, str(path))


def _build(args: argparse.Namespace) -> KernelLogSimulator:
    """The plugin's factory: one simulator per daemon, settings from its flags."""
    return KernelLogSimulator(settings=KernelLogSettings.from_args(args))


PLUGIN = SimulatorPlugin(name="kernellog", add_arguments=add_arguments, build=_build)
