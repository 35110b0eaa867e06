"""nvlink: the ComputeDomain topology document on the node (SURFACES §8).

When the desired state carries a topology document, Stage places it,
verbatim, at two node paths:

* ``/var/lib/nvml-mock/topology/topology.yaml``: the overlay the NRI plugin
  injects into containers, so tools inside a pod see the same document the
  node was configured with;
* ``/var/lib/nvml-mock/driver/config/topology.yaml``: beside the engine
  config, so a process that mounts only the driver root finds it too.

This node's clique is already folded into the engine config by the
gpudriver simulator (Decision 7); these copies are for humans and tools
that read the document itself.  When the document goes away, Stage removes
both copies (convergence downward); Discard removes them too.
"""

from __future__ import annotations

import argparse
import logging

import attrs
import trio

from mokka import layout
from mokka.noderoot import Artifact, File, Host
from mokka.simulators.base import Readiness
from mokka.simulators.registry import SimulatorPlugin
from mokka.state.model import State

logger = logging.getLogger(__name__)

__all__ = ["OWNER", "PLUGIN", "NvlinkSettings", "NvlinkSimulator"]

#: Manifest owner of both copies: they always change together, one batch.
OWNER = "nvlink"
#: A configuration document: readable by every consumer, written by rename.
DOCUMENT_MODE = 0o644


@attrs.frozen(kw_only=True)
class NvlinkSettings:
    """Settings of the nvlink simulator.

    It has no knobs of its own: where the document comes from is the state
    source's concern (``--topology``), and where it goes is fixed by the
    node layout that consumers are configured with.  The class exists so the
    simulator is built like every other one and can grow settings without
    changing its constructor.
    """

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NvlinkSettings:
        """Build from the parsed daemon flags (none are read yet)."""
        return cls()


def topology_artifacts(state: State) -> list[Artifact]:
    """Both copies of the document, or nothing when no topology is configured."""
    if state.topology is None:
        return []
    text = state.topology.text
    return [
        File(layout.TOPOLOGY_OVERLAY, text, DOCUMENT_MODE),
        File(layout.DRIVER_TOPOLOGY, text, DOCUMENT_MODE),
    ]


@attrs.define(eq=False)
class NvlinkSimulator:
    """Stages the topology document; see the module docstring."""

    settings: NvlinkSettings = attrs.field(factory=NvlinkSettings)
    name: str = attrs.field(default="nvlink", init=False)
    # Set by stage/discard, read by ``/readyz``: ready means "what the state
    # asks for is staged", which includes "no document, nothing staged".
    _readiness: Readiness = attrs.field(
        default=Readiness.not_ready("topology not staged"), init=False
    )

    async def stage(self, host: Host, state: State) -> None:
        """Converge the two copies onto ``state.topology`` (one thread hop)."""
        artifacts = topology_artifacts(state)
        try:
            report = await trio.to_thread.run_sync(host.converge, OWNER, artifacts)
        except Exception as exc:
            self._readiness = Readiness.not_ready(f"stage failed: {exc}")
            raise
        if state.topology is None:
            self._readiness = Readiness.ok("no topology document configured")
        else:
            placement = state.topology.placement(state.node_name)
            where = (
                f"node {state.node_name} in domain {placement[0]} clique {placement[1]}"
                if placement
                else f"node {state.node_name} is in no clique"
            )
            self._readiness = Readiness.ok(f"topology staged ({where})")
        if report.changed:
            logger.info(
                "nvlink staged generation %d: %s (+%d ~%d -%d)",
                state.generation,
                self._readiness.reason,
                len(report.created),
                len(report.updated),
                len(report.removed),
            )

    async def discard(self, host: Host) -> None:
        """Remove both copies (also ones an earlier process staged)."""
        await trio.to_thread.run_sync(host.discard, OWNER)
        self._readiness = Readiness.not_ready("topology discarded")

    @property
    def readiness(self) -> Readiness:
        """Ready once the last stage converged; names this node's clique."""
        return self._readiness


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    # No flags: see NvlinkSettings.  The document path is a state-source flag.
    return None


def _build(args: argparse.Namespace) -> NvlinkSimulator:
    """The registry's factory: one simulator per daemon, from its flags."""
    return NvlinkSimulator(settings=NvlinkSettings.from_args(args))


PLUGIN = SimulatorPlugin(name="nvlink", add_arguments=_add_arguments, build=_build)
