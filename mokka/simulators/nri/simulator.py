"""The nri simulator: Mokka's NRI plugin as a ``Daemon`` of the node daemon.

* ``stage`` validates (the view of the state must be buildable: the PCI
  plan); everything the plugin mounts is staged by other simulators, but
  for ``--nri-sys-devices``'s link directories (``pci_links``), which it
  converges under its own owner (nothing at all with the option off).
  ``discard`` removes those.
* ``run`` builds the ``NodeView`` of its start state, then runs the
  connection (``connection.run_plugin``), which registers with containerd
  over the NRI socket, re-registers after containerd restarts, and calls
  ``_on_create`` for every container created.  ``started`` is signalled at
  once: containerd may be down or its NRI off, and that must neither fail
  the pass nor hold up the other daemons (readiness says it instead).
* Readiness: not ready while a socket is there but the plugin is not
  registered on it (containerd refuses or restarts); ready, idle, when
  there is no socket at all (a local run, CRI-O, NRI off), since then no
  container is created that the plugin would have to see.
* ``reload`` swaps the view: one attribute assignment, so a creation being
  decided uses one whole view, old or new.
* Cancelling ``run`` cancels the connection, which closes the socket:
  containerd drops a plugin whose connection is gone (NRI has no
  unregister call).

A plugin failure never blocks a container: the connection answers an empty
adjustment when ``_on_create`` fails or is slow, and the policy itself
never raises.
"""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import trio

from mokka.noderoot import Host
from mokka.simulators.base import Readiness
from mokka.simulators.nri import connection, pci_links
from mokka.simulators.nri.inject import NodeView, adjustment
from mokka.simulators.nri.model import Adjustment, Container
from mokka.simulators.nri.settings import PLUGIN_INDEX, PLUGIN_NAME, NriSettings
from mokka.simulators.nri.view import build_view, plan_gpus, read_node_devices
from mokka.simulators.pcibus.hierarchy import plan_tree
from mokka.state.model import State

logger = logging.getLogger(__name__)

#: How the connection's ``last_error`` says the socket is not there (ENOENT).
_NO_SOCKET = "[Errno 2]"


@attrs.define(eq=False)
class NriSimulator:
    """Simulator and Daemon for the NRI plugin; see the module docstring."""

    settings: NriSettings = attrs.field(factory=NriSettings)
    name: str = attrs.field(default="nri", init=False)
    #: The view ``_on_create`` decides with; swapped whole by ``reload``.
    view: NodeView | None = attrs.field(default=None, init=False)
    #: The connection's ``PluginStatus`` (``connected``, ``registrations``,
    #: ``last_error``, ``create_failures``...), read by readiness.
    status: connection.PluginStatus | None = attrs.field(default=None, init=False)
    #: Containers decided, and how many of them got something.
    decided: int = attrs.field(default=0, init=False)
    injected: int = attrs.field(default=0, init=False)
    _host: Host | None = attrs.field(default=None, init=False)
    _staged: bool = attrs.field(default=False, init=False)
    _running: bool = attrs.field(default=False, init=False)
    _socket_path: Path | None = attrs.field(default=None, init=False)

    # ---- Simulator -----------------------------------------------------

    async def stage(self, host: Host, state: State) -> None:
        """The GPUs' sysfs paths must be plannable (``SpecError`` if not); the link
        directories converge (none with ``--nri-sys-devices`` off)."""
        plan_gpus(state)
        artifacts = []
        if self.settings.enabled and self.settings.sys_devices:
            artifacts = pci_links.link_artifacts(plan_tree(state, fallback_cpus=1))
        # With none, an owner without bookkeeping writes nothing at all.
        await trio.to_thread.run_sync(host.converge, pci_links.OWNER, artifacts)
        self._staged = True

    async def discard(self, host: Host) -> None:
        """Remove the link directories, if any were staged."""
        await trio.to_thread.run_sync(host.discard, pci_links.OWNER)
        self._staged = False

    @property
    def readiness(self) -> Readiness:
        if not self.settings.enabled:
            return Readiness.ok("NRI plugin off (--nri-plugin off)")
        if not self._staged:
            return Readiness.not_ready("nri not staged yet")
        status = self.status
        if not self._running or status is None:
            return Readiness.not_ready("NRI plugin not running")
        if not (status.connected and status.registrations):
            error = status.last_error
            if _NO_SOCKET in error:
                # No containerd with NRI here (a local run, CRI-O, NRI off):
                # nothing can be created that the plugin would miss.
                return Readiness.ok(f"NRI plugin idle: no NRI socket at {self._socket_path}")
            why = f": {error}" if error else ""
            return Readiness.not_ready(
                f"NRI plugin not registered with containerd at {self._socket_path}{why}"
            )
        failures = status.create_failures
        if failures:
            # Containers were created without injection: say so, but keep the
            # node ready (the plugin is up; the next container may be fine).
            return Readiness.ok(
                f"NRI plugin registered; {failures} containers started without injection "
                f"(last: {status.last_create_error})"
            )
        return Readiness.ok(
            f"NRI plugin registered ({self.injected} of {self.decided} containers injected)"
        )

    # ---- Daemon --------------------------------------------------------

    async def reload(self, state: State) -> None:
        """Swap the view for ``state``'s (built in a thread; the old one serves meanwhile)."""
        if self._host is None or not self.settings.enabled:
            return
        self.view = await trio.to_thread.run_sync(build_view, state, self._host, self.settings)

    async def run(
        self,
        host: Host,
        state: State,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve containerd until cancelled; see the module docstring."""
        self._host = host
        if not self.settings.enabled:
            task_status.started()
            await trio.sleep_forever()
        self.view, socket = await trio.to_thread.run_sync(self._prepare, host, state)
        self._socket_path = socket
        run_plugin = self.settings.run_plugin or connection.run_plugin
        try:
            async with trio.open_nursery() as nursery:
                # The connection starts after its first attempt, registered
                # or not: a containerd that is down must not fail the pass.
                self.status = await nursery.start(
                    run_plugin, socket, PLUGIN_NAME, PLUGIN_INDEX, self._on_create
                )
                self._running = True
                task_status.started()
        finally:
            self._running = False
            self.status = None

    def _prepare(self, host: Host, state: State) -> tuple[NodeView, Path]:
        """The view and the socket's path (blocking: both look at the node)."""
        socket = self.settings.socket or host.resolve(self.settings.node_socket)
        return build_view(state, host, self.settings), socket

    async def _on_create(self, container: Container) -> Adjustment:
        """The policy on the current view (nothing before there is one)."""
        view = self.view
        if view is None:
            return Adjustment()
        devices = None
        if view.sys_devices is not None:
            # Read now, not with the view: a bind of an entry gone since would
            # fail the container.  An OSError reaches the connection, which
            # answers empty and counts it for readiness.
            devices = read_node_devices(self.settings.sysfs, view.sys_devices.roots)
        result = adjustment(container, view, devices)
        self.decided += 1
        if result:
            self.injected += 1
            logger.info("nri: %s/%s %s: %d mounts", container.pod_namespace,
                        container.pod_name, container.name, len(result.mounts))
        return result

