"""The ib simulator: mock InfiniBand HCAs for the tools that read sysfs (and verbs).

Stage converges, in one ``Host.converge`` batch under the owner ``ib``:

* the tree under ``mokka.layout.IB_ROOT`` (``sysfs.py``, values from
  ``hca.py``): the three sysfs classes and ``/dev/infiniband``, one HCA per
  ``State.infiniband.hca_count``;
* the wrappers ``ibstat`` and ``ibstatus`` in the driver tree's ``usr/bin``
  (``tools.py``);
* in ``full`` mode also the verbs shim ``libibshim.so`` beside
  ``libmockfs.so`` and the ``ibv_devinfo`` and ``ibv_devices`` wrappers;
* when the image has its IB tools bundle (``--ib-tools-dir``, see
  ``bundle.py``), copies of its ``bin/`` and ``lib/`` in the driver tree,
  which the wrappers run instead of the machine's tools.  Readiness says
  which tools the wrappers run.

When the effective mode is ``off`` (``--ib-mode off``, or ``auto`` on a
profile without an enabled ``infiniband`` block) Stage converges the owner
to nothing, so switching IB off at run time removes the tree.  Converging
means fewer GPUs remove the surplus HCAs (``hca_count`` follows the GPU
count); a second stage of the same state rewrites nothing.  Nothing is
published outside the state root, so there is no Apply; and the tree is
static, so there is no daemon either.

A departure from the design, which has a ``mock-ib`` daemon answering UMAD
and verbs shims over a socket: the tools that matter here (``ibstat``,
``ibstatus``, ``ibv_devinfo``, ``ibv_devices``) read only sysfs and the
device/port queries, which preload shims answer from the staged tree in the
calling process.  No socket means no process to supervise, nothing to
restart, and no protocol to keep in step between C and Python.  What a
daemon would add (MAD traffic: ``ibping``, ``sminfo``) is not simulated.
"""

from __future__ import annotations

import logging

import attrs
import trio

from mokka import layout, native
from mokka.host import Artifact, ConvergeReport, CopyOf, Host
from mokka.simulators.base import Readiness
from mokka.simulators.ib.bundle import STAGED_DIR, bundle_artifacts, find_bundle
from mokka.simulators.ib.hca import plan_hcas
from mokka.simulators.ib.settings import IbSettings
from mokka.simulators.ib.sysfs import tree_artifacts
from mokka.simulators.ib.tools import FULL_TOOLS, SYSFS_TOOLS, wrapper_artifacts
from mokka.state.model import State

logger = logging.getLogger(__name__)

#: Manifest owner of everything staged.
OWNER = "ib"

#: Where the verbs shim is staged in ``full`` mode (beside ``libmockfs.so``).
IBSHIM_STAGED = f"{layout.DRIVER_LOCAL_LIB}/{native.IBSHIM_LIBRARY}"


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

    @property
    def readiness(self) -> Readiness:
        return self._readiness

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
        artifacts = tree_artifacts(hcas)
        if mode == "full":
            library = native.artifact(native.IBSHIM_LIBRARY)
            artifacts.append(CopyOf(IBSHIM_STAGED, library, mode=0o755))
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
        return IbPlan(mode=mode, artifacts=artifacts, hca_count=len(hcas), tools=used)

    async def stage(self, host: Host, state: State) -> None:
        try:
            # One thread hop for the plan too: it reads the shim and the
            # image's tools directory, which must not block the event loop.
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
        return plan, host.converge(OWNER, plan.artifacts)

    async def discard(self, host: Host) -> None:
        report = await trio.to_thread.run_sync(host.discard, OWNER)
        self._readiness = Readiness.not_ready("the InfiniBand tree was discarded")
        logger.info("ib discarded: %d path(s) removed", len(report.removed))
