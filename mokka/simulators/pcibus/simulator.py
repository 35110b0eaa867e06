"""The pcibus simulator: mock PCI sysfs tree + ``libmockfs.so`` (Stage), NFD file (Apply).

Stage writes, in one ``Host.converge`` batch under the owner ``pcibus``,
the PCI tree the state calls for (``sysfs.py``, laid out by
``hierarchy.py``), the system's DMI identity (``dmi.py``) and a copy of the built shim at
``mokka.layout.DRIVER_LOCAL_LIB/libmockfs.so``.  Converging means a state
with fewer GPUs removes the others' entries; a second stage of the same
state rewrites nothing.  Apply writes NFD's feature file under the separate
owner ``pcibus-nfd``, so Revoke removes exactly that file and Discard
exactly the staged tree.

The order is the point of the split: NFD's label is what schedules GPU
workloads (the GPU Operator selects on it), so it is published only in the
Apply wave, after every simulator staged, and withdrawn first at teardown,
while the tree it advertises still exists.
"""

from __future__ import annotations

import logging

import attrs
import trio

from mokka import layout, native
from mokka.noderoot import ConvergeReport, CopyOf, Host
from mokka.simulators.base import Readiness
from mokka.simulators.pcibus.dmi import dmi_artifacts, system_identity
from mokka.simulators.pcibus.hierarchy import PciTree, plan_tree
from mokka.simulators.pcibus.nfd import feature_artifacts
from mokka.simulators.pcibus.settings import PcibusSettings
from mokka.simulators.pcibus.sysfs import tree_artifacts
from mokka.state.model import State

logger = logging.getLogger(__name__)

#: Manifest owners: the staged tree + shim, and the published feature file.
#: Two owners because their lifetimes differ: Revoke must drop the file while
#: the tree stays until Discard.
STAGE_OWNER = "pcibus"
NFD_OWNER = "pcibus-nfd"

#: Where the shim is staged, for pods that preload it from the driver root.
MOCKFS_STAGED = f"{layout.DRIVER_LOCAL_LIB}/{native.MOCKFS_LIBRARY}"


@attrs.define(eq=False)
class PcibusSimulator:
    """See the module docstring; implements ``Simulator`` and ``Applier``.

    Keeps no state besides its readiness: what exists on the node is in the
    ``Host`` manifests, so a restarted daemon converges and discards from
    there, including what a crashed predecessor left.
    """

    settings: PcibusSettings = attrs.field(factory=PcibusSettings)
    name: str = attrs.field(default="pcibus", init=False)
    _readiness: Readiness = attrs.field(
        factory=lambda: Readiness.not_ready("the PCI tree is not staged yet"), init=False
    )

    @property
    def readiness(self) -> Readiness:
        """Ready once a Stage succeeded, until the next failed Stage or a Discard."""
        return self._readiness

    async def stage(self, host: Host, state: State) -> None:
        """Converge the PCI tree and the shim onto ``state``, in one batch and one thread hop.

        A bad profile value the tree needs (a link width, a cpulist, two
        functions on one address) raises ``SpecError`` from ``plan_tree``
        before anything is written; any failure marks the simulator not
        ready and propagates, so the Stage wave reports it.
        """
        try:
            # Planning looks the shim up on disk: in the same thread hop as
            # the converge, never on the event loop.
            tree, report = await trio.to_thread.run_sync(self._stage_sync, host, state)
        except Exception as exc:
            self._readiness = Readiness.not_ready(f"stage failed: {exc}")
            raise
        gpus, bridges, switches = (len(tree.by_role(r)) for r in ("gpu", "bridge", "nvswitch"))
        self._readiness = Readiness.ok(
            f"{gpus} GPU(s), {bridges} bridge(s), {switches} NVSwitch(es) on the mock PCI bus"
        )
        logger.info(
            "pcibus staged generation %d: %d GPU(s), %d bridge(s), %d NVSwitch(es); "
            "%d created, %d updated, %d removed",
            state.generation,
            gpus,
            bridges,
            switches,
            len(report.created),
            len(report.updated),
            len(report.removed),
        )

    def _stage_sync(self, host: Host, state: State) -> tuple[PciTree, ConvergeReport]:
        """Plan the tree and converge it with the shim (blocking; a worker thread)."""
        # Missing shim → NativeArtifactMissing before anything is written:
        # a tree without the shim that exposes it would be half a surface.
        library = native.artifact(native.MOCKFS_LIBRARY)
        tree = plan_tree(state, fallback_cpus=self.settings.fallback_cpus)
        artifacts = [
            *tree_artifacts(tree),
            *dmi_artifacts(system_identity(state)),
            CopyOf(MOCKFS_STAGED, library, mode=0o755),
        ]
        return tree, host.converge(STAGE_OWNER, artifacts)

    async def discard(self, host: Host) -> None:
        """Remove exactly what Stage created, as the manifest records it."""
        report = await trio.to_thread.run_sync(host.discard, STAGE_OWNER)
        self._readiness = Readiness.not_ready("the PCI tree was discarded")
        logger.info("pcibus discarded: %d path(s) removed", len(report.removed))

    async def apply(self, host: Host, state: State) -> None:
        """Publish the NFD feature file (converged: a state without GPUs removes it)."""
        artifacts = feature_artifacts(state, self.settings.nfd_features_dir)
        report = await trio.to_thread.run_sync(host.converge, NFD_OWNER, artifacts)
        if report.changed:
            logger.info(
                "pcibus published the NFD feature file in %s",
                self.settings.nfd_features_dir,
            )

    async def revoke(self, host: Host) -> None:
        """Withdraw the feature file; NFD drops the label on its next pass."""
        # Only our own file goes: the directory is shared with other writers.
        report = await trio.to_thread.run_sync(host.discard, NFD_OWNER)
        if report.removed:
            logger.info("pcibus revoked the NFD feature file")
