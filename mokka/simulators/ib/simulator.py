"""The ib simulator: mock InfiniBand HCAs for the tools that read sysfs (and verbs).

Stage converges, in one ``Host.converge`` batch under the owner ``ib``:

* the tree under ``mokka.layout.IB_ROOT`` (``sysfs.py``, values from
  ``hca.py``): the three sysfs classes and ``/dev/infiniband``, one HCA per
  ``State.infiniband.hca_count``;
* the wrappers ``ibstat`` and ``ibstatus`` in the driver tree's ``usr/bin``
  (``tools.py``);
* in ``full`` mode also the verbs shim ``libibshim.so`` beside
  ``libmockfs.so`` and the ``ibv_devinfo`` and ``ibv_devices`` wrappers;
* in every mode but ``off``: the management-datagram shim
  ``libumadshim.so``, the directory of the ``mock-ib`` daemon's socket, and
  wrappers for the MAD tools (``sminfo``, ``smpquery``, ``perfquery``,
  ``ibping``, ``ibnetdiscover``, ``iblinkinfo``, ...);
* when the image has its IB tools bundle (``--ib-tools-dir``, see
  ``bundle.py``), copies of its ``bin/`` and ``lib/`` in the driver tree,
  which the wrappers run instead of the machine's tools.  Readiness says
  which tools the wrappers run.

When the effective mode is ``off`` (``--ib-mode off``, or ``auto`` on a
profile without an enabled ``infiniband`` block) Stage converges the owner
to nothing, so switching IB off at run time removes the tree.  Converging
means fewer GPUs remove the surplus HCAs (``hca_count`` follows the GPU
count); a second stage of the same state rewrites nothing.  Nothing is
published outside the state root, so there is no Apply.

The simulator is also a ``Daemon`` (``mockib.py``): the ``mock-ib`` daemon
answers those tools' MADs from the staged HCAs and relays them to the
daemons of the other nodes of the fabric (``docs/ib.md``); the socket it
binds is recorded under its own owner (``mockib.RUN_OWNER``), which discard
removes first.  Verbs queries
(``ibv_devinfo``) stay in-process: ``libibshim.so`` answers them from the
staged tree, with no socket.
"""

from __future__ import annotations

import logging

import attrs
import trio

from mokka import layout, native
from mokka.noderoot import Artifact, ConvergeReport, CopyOf, Directory, Host
from mokka.simulators.base import Readiness
from mokka.simulators.ib import mad
from mokka.simulators.ib.bundle import STAGED_DIR, bundle_artifacts, find_bundle
from mokka.simulators.ib.hca import plan_hcas
from mokka.simulators.ib.mockib import RUN_OWNER, SOCKET_DIR, MockIb, remove_stale_socket
from mokka.simulators.ib.settings import IbSettings
from mokka.simulators.ib.sysfs import COUNTERS, saturated, tree_artifacts
from mokka.simulators.ib.tools import FULL_TOOLS, MAD_TOOLS, SYSFS_TOOLS, wrapper_artifacts
from mokka.state.model import State

logger = logging.getLogger(__name__)

#: Manifest owner of everything staged.
OWNER = "ib"

#: Where the verbs shim is staged in ``full`` mode (beside ``libmockfs.so``).
IBSHIM_STAGED = f"{layout.DRIVER_LOCAL_LIB}/{native.IBSHIM_LIBRARY}"
#: Where the management-datagram shim is staged (every mode but ``off``).
UMADSHIM_STAGED = f"{layout.DRIVER_LOCAL_LIB}/{native.UMADSHIM_LIBRARY}"


@attrs.frozen(kw_only=True)
class IbPlan:
    """What one stage converges, and what readiness and the log say about it."""

    #: effective mode: ``off``, ``sysfs`` or ``full``
    mode: str
    #: everything the owner ``ib`` holds after the converge
    artifacts: list[Artifact]
    #: HCAs in the tree (0: empty classes, or mode ``off``)
    hca_count: int
    #: which tools the wrappers run, for readiness and the log ("" when off)
    tools: str


@attrs.define(eq=False)
class IbSimulator:
    """See the module docstring; implements ``Simulator``."""

    settings: IbSettings = attrs.field(factory=IbSettings)
    name: str = attrs.field(default="ib", init=False)
    _readiness: Readiness = attrs.field(
        factory=lambda: Readiness.not_ready("the InfiniBand tree is not staged yet"), init=False
    )
    _daemon: MockIb | None = attrs.field(default=None, init=False)
    #: Port counters raised at run time (``mokka ctl ib-counter``): HCA name →
    #: counter → value.  In memory only: a restarted node daemon starts from
    #: zero, as a reloaded driver does.
    counters: dict[str, dict[str, int]] = attrs.field(factory=dict, init=False)
    #: The last state staged and the host it went to: a counter change
    #: re-stages it with the new value.
    _staged: tuple[Host, State] | None = attrs.field(default=None, init=False)
    #: Serialises the converges of the stage wave and of counter changes.
    _converging: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    @property
    def readiness(self) -> Readiness:
        ready = self._readiness
        if ready.ready and self._daemon is not None:
            return Readiness.ok(f"{ready.reason}; mock-ib: {self._daemon.summary}")
        return ready

    async def run(
        self,
        host: Host,
        state: State,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The ``mock-ib`` daemon (``mockib.py``), until cancelled."""
        daemon = MockIb(self.settings, on_counter=self.change_counter)
        self._daemon = daemon
        try:
            await daemon.run(host, state, task_status=task_status)
        finally:
            self._daemon = None

    async def reload(self, state: State) -> None:
        if self._daemon is not None:
            await self._daemon.reload(state)

    async def change_counter(self, hca_index: int, change: mad.CounterChange) -> int:
        """Raise (or set) a port counter and re-stage the tree; its new value."""
        if change.name not in COUNTERS or self._staged is None:
            raise ValueError(f"no counter {change.name!r} to change")
        if change.mode not in mad.COUNTER_MODES:
            raise ValueError(f"counter mode {change.mode}, expected add or set")
        host, state = self._staged
        counters = self.counters.setdefault(f"mlx5_{hca_index}", {})
        old = counters.get(change.name, 0)
        # a port counter stops at its width, as the hardware's does
        value = saturated(
            change.name, change.value if change.mode == mad.COUNTER_SET else old + change.value)
        counters[change.name] = value
        try:
            async with self._converging:
                await trio.to_thread.run_sync(self._stage_sync, host, state)
        except Exception:
            counters[change.name] = old  # the files still say the old value
            raise
        logger.info("ib: mlx5_%d port 1 %s %d -> %d", hca_index, change.name, old, value)
        return value

    def plan(self, state: State) -> IbPlan:
        """What to converge for ``state``; raises ``SpecError``.

        Pure with respect to the node: nothing is read from or written to
        it, so a bad profile, a missing shim or a broken tools bundle fails
        before the tree is touched.  (The shim and the bundle are read from
        the daemon's own filesystem.)
        """
        mode = self.settings.effective_mode(state.infiniband is not None)
        if mode == "off":
            return IbPlan(mode=mode, artifacts=[], hca_count=0, tools="")
        hcas = plan_hcas(state)
        tools = FULL_TOOLS if mode == "full" else SYSFS_TOOLS
        artifacts = tree_artifacts(hcas, self.counters)
        if mode == "full":
            library = native.artifact(native.IBSHIM_LIBRARY)
            artifacts.append(CopyOf(IBSHIM_STAGED, library, mode=0o755))
        umadshim = native.artifact(native.UMADSHIM_LIBRARY)
        artifacts += [CopyOf(UMADSHIM_STAGED, umadshim, mode=0o755), Directory(SOCKET_DIR)]
        bundle = find_bundle(self.settings.tools_dir, tuple(t.name for t in tools))
        if bundle is None:
            used = (
                f"the machine's own {', '.join(t.real for t in tools)} "
                f"(no {self.settings.tools_dir})"
            )
        else:
            artifacts += bundle_artifacts(bundle)
            used = f"the image's tools from {bundle.directory}, staged in {STAGED_DIR}"
        artifacts += wrapper_artifacts(tools, staged=bundle is not None)
        # The MAD tools run the image's copies only when its bundle has them.
        mad_staged = bundle is not None and all(t.name in bundle.binaries for t in MAD_TOOLS)
        artifacts += wrapper_artifacts(MAD_TOOLS, staged=mad_staged)
        return IbPlan(mode=mode, artifacts=artifacts, hca_count=len(hcas), tools=used)

    async def stage(self, host: Host, state: State) -> None:
        daemon = self._daemon
        if daemon is not None and daemon.serves_socket and not daemon.serving(state).socket:
            # The socket lives in a directory this stage removes: stop
            # serving first ("before them on the way down"), as reload would.
            await daemon.reload(state)
        try:
            # One thread hop for the plan too: it reads the shim and the
            # image's tools directory, which must not block the event loop.
            async with self._converging:
                plan, report = await trio.to_thread.run_sync(self._stage_sync, host, state)
        except Exception as exc:
            self._readiness = Readiness.not_ready(f"stage failed: {exc}")
            raise
        mode, count = plan.mode, plan.hca_count
        if mode == "off":
            why = "--ib-mode off" if self.settings.mode == "off" else (
                "the profile has no enabled infiniband block"
            )
            summary = f"no InfiniBand HCAs ({why})"
        elif count == 0:
            summary = f"{mode}: empty InfiniBand classes (the profile has no infiniband block)"
        else:
            ib = state.infiniband
            assert ib is not None
            summary = (
                f"{mode}: {count} HCA(s) mlx5_0..mlx5_{count - 1}, {ib.hca_type}, "
                f"{ib.rate_gbps} Gb/s, port {ib.port_state}"
            )
        if plan.tools:
            summary = f"{summary}; wrappers run {plan.tools}"
        if report.degraded:
            # Placeholder device nodes (no CAP_MKNOD): sysfs readers work, but
            # nothing can open /dev/infiniband/*.
            self._readiness = Readiness.not_ready("; ".join(report.degraded))
        else:
            self._readiness = Readiness.ok(summary)
        if report.changed:
            logger.info(
                "ib staged generation %d: %s; %d created, %d updated, %d removed",
                state.generation,
                summary,
                len(report.created),
                len(report.updated),
                len(report.removed),
            )

    def _stage_sync(self, host: Host, state: State) -> tuple[IbPlan, ConvergeReport]:
        """Plan, then converge (blocking; a worker thread)."""
        plan = self.plan(state)
        report = host.converge(OWNER, plan.artifacts)
        self._staged = (host, state)
        return plan, report

    async def discard(self, host: Host) -> None:
        report = await trio.to_thread.run_sync(_discard_sync, host)
        self._readiness = Readiness.not_ready("the InfiniBand tree was discarded")
        logger.info("ib discarded: %d path(s) removed", len(report.removed))


def _discard_sync(host: Host) -> ConvergeReport:
    """Remove the daemon's socket and its record, then the staged tree (blocking)."""
    # A socket left by a release that did not record it would keep the
    # socket's directory from going.
    remove_stale_socket(host)
    run = host.discard(RUN_OWNER)
    staged = host.discard(OWNER)
    return ConvergeReport(removed=run.removed + staged.removed)
