"""The cri simulator: publishes the CDI specs and sets up containerd.

Everything it does is visible to containerd the moment it lands, so all of
it happens in the Apply wave, after every surface staged (the specs name
device nodes and files the other simulators write), and is withdrawn first
at teardown, in Revoke, before Discard removes those files
(ARCHITECTURE §3 and §4).  Stage only builds and validates the spec contents.

One apply is one worker-thread hop, in this order:

1. the toolkit install (when the runtime setup applies), so the spec may
   name the installed ``nvidia-cdi-hook``;
2. the two CDI specs, checked against the node, then written;
3. containerd's drop-in and the restart.
"""

from __future__ import annotations

import logging

import attrs
import trio

from mokka.noderoot import Host
from mokka.simulators.base import Readiness
from mokka.simulators.cri import cdi
from mokka.simulators.cri.runtime import RuntimeSetup
from mokka.simulators.cri.settings import CriSettings
from mokka.state.model import State

logger = logging.getLogger(__name__)


@attrs.define(eq=False)
class CriSimulator:
    """Simulator + Applier; see the module docstring."""

    settings: CriSettings = attrs.field(factory=CriSettings)
    name: str = attrs.field(default="cri", init=False)
    _runtime: RuntimeSetup = attrs.field(init=False)
    _readiness: Readiness = attrs.field(
        default=Readiness.not_ready("CDI specs not published yet"), init=False
    )
    #: Content hash of the state the specs were last published for.
    _applied_hash: str | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._runtime = RuntimeSetup(self.settings)

    @property
    def readiness(self) -> Readiness:
        return self._readiness

    async def stage(self, host: Host, state: State) -> None:
        """Validate the spec contents; nothing is written before Apply."""
        cdi.validate(state)
        cdi.build_specs(state, cdi.NodeExtras(), nri=self.settings.nri)

    async def retract(self, host: Host, state: State) -> None:
        """Before the Stage wave: stop naming what staging ``state`` will remove.

        Skipped for the state already applied (a repair pass): nothing it
        names goes away, and narrowing would drop the optional mounts until
        Apply puts them back.
        """
        if state.content_hash == self._applied_hash:
            return
        await trio.to_thread.run_sync(
            lambda: cdi.narrow(host, state, nri=self.settings.nri)
        )

    async def discard(self, host: Host) -> None:
        """Nothing to remove: stage wrote nothing, and the toolkit install stays.

        The specs and the drop-in are Revoke's; the toolkit binaries must
        outlive the daemon (running containers call them), see ``toolkit.py``.
        """

    async def apply(self, host: Host, state: State) -> None:
        """Publish the specs and set up the runtime; raise only when the specs fail.

        Runtime problems (containerd down, ``nvidia-ctk`` failing, a broken
        image) make the simulator not ready without failing the Apply wave:
        the specs alone serve CDI-aware runtimes, and the wave's other
        appliers should not be cancelled for them.
        """
        try:
            self._readiness = await trio.to_thread.run_sync(self._apply, host, state)
            self._applied_hash = state.content_hash
        except Exception as exc:
            self._readiness = Readiness.not_ready(f"apply failed: {exc}")
            raise

    def _apply(self, host: Host, state: State) -> Readiness:
        runtime = self._runtime.install(host)
        unpublished = cdi.publish(host, state, nri=self.settings.nri)
        if runtime is None:
            runtime = self._runtime.configure(host)
        if unpublished is not None:
            return Readiness.not_ready(f"{unpublished}; {runtime.reason}")
        specs = f"CDI specs published for {len(state.gpus)} GPU(s)"
        return Readiness(runtime.ready, f"{specs}; {runtime.reason}")

    async def revoke(self, host: Host) -> None:
        """Withdraw the specs, then the drop-in (with a queued containerd restart)."""
        self._readiness = Readiness.not_ready("revoked: CDI specs withdrawn")
        self._applied_hash = None
        await trio.to_thread.run_sync(self._revoke, host)

    def _revoke(self, host: Host) -> None:
        # Specs first: a container created after this point must not be
        # promised devices that Discard is about to remove.
        try:
            cdi.withdraw(host)
            logger.info("CDI specs withdrawn")
        finally:
            self._runtime.revoke(host)
