"""The ``mock-ib`` daemon: the MAD service and the relay, kept in step with the state.

Started by the Supervise wave once the first stage has succeeded (so the
socket's directory and the tree the answers come from exist), it runs until
the node daemon stops.  What it serves follows from the state:

* the umad socket at ``UMAD_SOCKET`` under the node root, when the state
  has HCAs and IB is not off;
* the relay (``relay.py``) on ``--ib-relay-address``/``--ib-relay-port``,
  when that port is given and the topology document puts this node in a
  fabric with other nodes; its peers prove the key of
  ``--ib-relay-key-file``.

``reload`` swaps in the new fabric view at once (HCAs, port states,
descriptions: the next MAD sees them); a change of what is served (socket
on or off, the node list, the relay's address) restarts the service and
the relay, which costs in-flight requests a timeout, as a re-cabled fabric
would.  Idle, the daemon waits in ``accept``/``recv`` and on the reload
event: no timers of its own.

The socket is the one file the daemon makes itself.  It is recorded in the
manifest of ``RUN_OWNER`` *before* it is bound (an empty file converged at
its path, then replaced by the socket), so ``mokka cleanup`` after a
SIGKILL removes it, and with it the directories it kept from going.  The
owner is not the simulator's ``ib``: each stage converges ``ib`` to exactly
its plan, which would put a file back over a listening socket.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from mokka import layout
from mokka.errors import MokkaError
from mokka.noderoot import Directory, File, Host
from mokka.simulators.ib import lids, mad
from mokka.simulators.ib.fabric import Fabric
from mokka.simulators.ib.hca import plan_hcas
from mokka.simulators.ib.relay import Relay
from mokka.simulators.ib.service import MadService
from mokka.simulators.ib.settings import IbSettings
from mokka.simulators.ib.sysfs import COUNTERS, IB_CLASS, UMAD_MODE
from mokka.state.model import State

logger = logging.getLogger(__name__)

#: The directory of the daemon's socket (staged with the tree) and the socket
#: ``libumadshim.so`` connects to (``<MOKKA_MOCKFS_ROOT>/run/mock-ib/umad.sock``).
SOCKET_DIR = f"{layout.IB_ROOT}/run/mock-ib"
UMAD_SOCKET = f"{SOCKET_DIR}/umad.sock"
#: Manifest owner of what the daemon creates at run time: the socket (see the
#: module docstring).  ``mokka cleanup`` reports it under ``ib``.
RUN_OWNER = "ib-run"
#: Seconds ``reload`` waits for a restarted service (binding a socket and a
#: port: milliseconds, unless something is badly wrong).
RESTART_BOUND = 10.0


@attrs.frozen
class Serving:
    """What the daemon serves for a state; a change restarts the service."""

    socket: bool
    nodes: tuple[str, ...]
    me: int
    relay: bool
    addresses: tuple[tuple[int, tuple[str, int]], ...]


@attrs.define(eq=False)
class MockIb:
    """See the module docstring."""

    settings: IbSettings
    #: carries out ``mokka ctl ib-counter`` (the simulator re-stages the files)
    on_counter: Callable[[int, mad.CounterChange], Awaitable[int]] | None = None
    #: what readiness says is served (without the relay's live count)
    _summary: str = attrs.field(default="not started", init=False)
    _state: State | None = attrs.field(default=None, init=False)
    #: set by ``reload`` when what is served changes: ``run`` restarts it
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: set by ``run`` once the service for the newest state is up
    _restarted: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: what the running service serves (``None``: not running)
    _serving: Serving | None = attrs.field(default=None, init=False)
    _service: MadService | None = attrs.field(default=None, init=False)
    _relay: Relay | None = attrs.field(default=None, init=False)
    _host: Host | None = attrs.field(default=None, init=False)

    @property
    def summary(self) -> str:
        """For readiness: what is served and, in a fabric, how many peers are live."""
        relay = self._relay
        if relay is None or self._serving is None:
            return self._summary
        peers = len(self._serving.nodes) - 1
        live = sum(relay.is_live(k) for k, _ in self._serving.addresses)
        return f"{self._summary}; relay on port {relay.port}, {live}/{peers} peer(s) live"

    @property
    def serves_socket(self) -> bool:
        return self._serving is not None and self._serving.socket

    def serving(self, state: State) -> Serving:
        on = self.settings.effective_mode(state.infiniband is not None) != "off"
        hcas = state.infiniband.hca_count if state.infiniband is not None and on else 0
        nodes = lids.fabric_nodes(state)
        me = nodes.index(state.node_name)
        relay = hcas > 0 and len(nodes) > 1 and self.settings.relay_port is not None
        addresses = tuple(
            (k, self.settings.peer_address(name)) for k, name in enumerate(nodes) if k != me
        ) if relay else ()
        return Serving(socket=hcas > 0, nodes=nodes, me=me, relay=relay, addresses=addresses)

    async def reload(self, state: State) -> None:
        """Serve ``state``: a new fabric view at once, or a restart of the
        service when what is served changes (returns once it is done)."""
        self._state = state
        if self._serving is not None and self.serving(state) != self._serving:
            restarted = self._restarted = trio.Event()
            self._changed.set()
            # Bounded: a restart that fails crashes ``run``, and the supervisor
            # restarts it on this state; the pass need not wait for that.
            with trio.move_on_after(RESTART_BOUND):
                await restarted.wait()
            return
        if self._service is not None and self._host is not None:
            self._service.fabric = self._fabric(self._host, state)
            if self._relay is not None:
                await self._relay.announce()

    async def run(self, host: Host, state: State, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._host, self._state = host, state
        started = False
        try:
            while True:
                state = self._state
                serving = self.serving(state)
                self._changed = trio.Event()
                try:
                    async with trio.open_nursery() as nursery:
                        await self._start(nursery, host, state, serving)
                        self._serving = serving
                        self._restarted.set()
                        if not started:
                            started = True
                            task_status.started()
                        await self._changed.wait()
                        nursery.cancel_scope.cancel()
                except BaseExceptionGroup as group:
                    # One failure (a port in use, a socket that cannot be
                    # bound): report it as itself, not as a group of one.
                    if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
                        raise group.exceptions[0] from None
                    raise
                finally:
                    # The socket is gone with the service (or never made):
                    # its record goes too, also on the way down.
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(self._forget_socket, host)
                self._service = self._relay = None
        finally:
            self._service = self._relay = self._serving = None

    async def _start(self, nursery: trio.Nursery, host: Host, state: State,
                     serving: Serving) -> None:
        if not serving.socket:
            self._summary = "no MAD service (no HCAs)"
            return
        relay = None
        if serving.relay:
            relay = Relay(
                nodes=serving.nodes, me=serving.me, addresses=dict(serving.addresses),
                listen=(self.settings.relay_address, self.settings.relay_port or 0),
                own_guids=self._own_guids, on_message=self._on_relay,
                key_file=self.settings.relay_key_file,
            )
        self._relay = relay
        service = MadService(fabric=self._fabric(host, state), relay=relay,
                             on_counter=self.on_counter)
        self._service = service
        if relay is not None:
            await nursery.start(relay.run)
        path = await trio.to_thread.run_sync(record_socket, host)
        await nursery.start(service.serve, path)
        self._summary = "serving MADs"
        logger.info("mock-ib: MADs served at %s; %s", UMAD_SOCKET, self.summary)

    def _forget_socket(self, host: Host) -> None:
        """Drop the socket's record once the service stopped (blocking).

        While the newest state will serve a socket again (a restart), the
        record keeps its directory, so the restart never finds it gone; a
        state with no HCA to serve drops the record whole (``ib``'s own
        stage still lists the directory while IB is staged at all).
        """
        state = self._state
        again = state is not None and self.serving(state).socket
        try:
            if host.owned(RUN_OWNER):
                host.converge(RUN_OWNER, [Directory(SOCKET_DIR)] if again else [])
        except (OSError, MokkaError) as exc:
            # Not fatal, and never in place of the cancellation on the way
            # down: the record stays, so the simulator's discard (or
            # ``mokka cleanup``) removes what is left.
            logger.warning("mock-ib: could not drop the record of %s: %s", UMAD_SOCKET, exc)

    def _own_guids(self) -> dict[int, int]:
        service = self._service
        return {h.guid: h.lid for h in service.fabric.hcas} if service is not None else {}

    async def _on_relay(self, peer: int, message: dict[str, Any]) -> None:
        if self._service is not None:
            await self._service.on_relay(peer, message)

    def _fabric(self, host: Host, state: State) -> Fabric:
        hcas = plan_hcas(state)
        nodes = lids.fabric_nodes(state)

        def read_counters(index: int) -> Mapping[str, int]:
            return read_port_counters(host.resolve(f"{IB_CLASS}/{hcas[index].name}/ports/1"))

        relay = self._relay
        return Fabric(
            nodes=nodes, me=nodes.index(state.node_name), hcas=hcas,
            is_live=(lambda k: relay.is_live(k)) if relay is not None else (lambda k: False),
            read_counters=read_counters,
            remote_guids=relay.remote_guids if relay is not None else (lambda: {}),
        )


def read_port_counters(port_dir: Path) -> dict[str, int]:
    """The counters sysfs shows for a port: what ``perfquery`` must agree with."""
    values = {}
    for name in COUNTERS:
        try:
            values[name] = int((port_dir / "counters" / name).read_text().strip() or 0)
        except (OSError, ValueError):
            values[name] = 0
    return values


def record_socket(host: Host) -> Path:
    """Record the socket under ``RUN_OWNER`` before it exists; its real path (blocking).

    An empty file stands at the path until ``MadService.serve`` binds the
    socket in its place.  A socket already there is a killed daemon's (the
    node lock keeps a second daemon off the root) and goes first: one not
    in any manifest (left by a release that did not record it) would
    otherwise be refused as something foreign in the way.
    """
    remove_stale_socket(host)
    host.converge(RUN_OWNER, [File(UMAD_SOCKET, b"", UMAD_MODE)])
    return host.resolve(UMAD_SOCKET)


def remove_stale_socket(host: Host) -> None:
    """Remove the umad socket a killed daemon left (blocking; no daemon may run)."""
    path = host.resolve(UMAD_SOCKET)
    if path.is_socket():
        path.unlink()
