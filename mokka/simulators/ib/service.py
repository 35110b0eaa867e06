"""The MAD service: what comes over the node's umad socket, and where MADs go.

The tools' connections are ``umadsocket``'s (accepted within limits, each
with a bounded queue); on each come control frames (HELLO naming the umad
index, agent registrations, ``mokka ctl ib-counter`` changes) and MAD
frames (``mad.Umad``).  Each request a tool sends waits as a
``pending.Pending`` entry here, on the origin daemon, until its answer or
its timeout.  No request, no task: an idle service sleeps in ``accept`` and
``recv``.  Past a bound the service refuses and logs it through a
``LogLimit``, so a flood costs a few lines.

Routing (``_route``), the same on the origin and on a peer the relay
brought the request to (``request.Request``):

* directed-route SMPs walk the fabric (``fabric.Fabric.walk``) from the
  sending HCA; the end of the route answers (the SMA), or the walk goes on
  at the daemon that owns the next entity;
* LID-routed MADs go to the entity with that LID: SMPs to its SMA,
  PerfMgt to its PMA (counters as sysfs shows them), SA to the SM on the
  spine, and any other class to a tool on that HCA that registered for it
  (``ibping -S``: vendor class 0x32).  Its response frame finds the
  request again by (requester LID, TID).

A MAD for a LID nothing answers, a route over a down link, or a peer that
is not live is dropped: the requester sees a timeout, as on a real fabric.
"""

from __future__ import annotations

import errno
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from mokka.loglimit import LogLimit
from mokka.simulators import unixsocket
from mokka.simulators.ib import mad, smp
from mokka.simulators.ib.fabric import SPINE, Fabric, Walked
from mokka.simulators.ib.pending import Pending, over_limit, wait_seconds
from mokka.simulators.ib.relay import Relay
from mokka.simulators.ib.request import Request, checked_int
from mokka.simulators.ib.sysfs import COUNTER_BITS, saturated
from mokka.simulators.ib.umadsocket import MAX_AGENTS, Connection, Tools, listen

logger = logging.getLogger(__name__)

#: Requests delivered to a local agent (``ibping -S``) waiting for its
#: response; bounded so a tool that never answers cannot grow it forever.
MAX_SERVED = 1024


@attrs.define(eq=False)
class MadService:
    """Serves one node's umad socket; ``fabric`` may be swapped on reload."""

    fabric: Fabric
    relay: Relay | None = None
    #: ``mokka ctl ib-counter``: (HCA index, change) → the counter's new value
    #: (``ValueError``: refused)
    on_counter: Callable[[int, mad.CounterChange], Awaitable[int]] | None = None
    _pending: dict[int, Pending] = attrs.field(factory=dict, init=False)
    _served: OrderedDict[tuple[int, int], tuple[int, int]] = attrs.field(
        factory=OrderedDict, init=False
    )
    _tools: Tools = attrs.field(init=False)
    _next_id: int = attrs.field(default=1, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    #: one counter change at a time: an addition reads the value it adds to
    _counting: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    #: requests handed back with ENOMEM in a flood, logged now and then
    _overflow_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)

    def __attrs_post_init__(self) -> None:
        self._tools = Tools(on_frame=self._on_frame, on_gone=self._gone)

    @property
    def connections(self) -> int:
        """Tools connected now."""
        return len(self._tools.conns)

    @property
    def pending(self) -> int:
        """Requests of local tools waiting for their answers."""
        return len(self._pending)

    # ---- the unix socket --------------------------------------------------

    async def serve(self, path: Path, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen at ``path`` until cancelled; the socket file goes with it."""
        listener, dirfd, address = await trio.to_thread.run_sync(listen, path)
        sock = trio.socket.from_stdlib_socket(listener)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._tools.accept(sock, nursery)
        finally:
            self._nursery = None
            sock.close()
            tools = self._tools
            for log in (tools.refused_log, tools.accept_log, self._overflow_log,
                        tools.dropped_log):
                log.flush()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(unixsocket.unlisten, dirfd, address)

    async def _on_frame(self, conn: Connection, frame: bytes) -> None:
        """One frame a tool sent: a control frame or a MAD."""
        try:
            if len(frame) < mad.UMAD_HEADER_SIZE:
                await self._control(conn, mad.Control.unpack(frame))
            elif conn.index is not None:
                await self._from_tool(conn, mad.Umad.unpack(frame))
        except ValueError as exc:
            conn.junk.warning("ib: dropped a malformed frame from a tool: %s", exc)

    def _gone(self, conn: Connection) -> None:
        # Its requests go with it: nobody is left to hand the answers to.
        for request_id in conn.pending:
            pending = self._pending.pop(request_id, None)
            if pending is not None:
                pending.done.set()
        conn.pending.clear()

    async def _control(self, conn: Connection, control: mad.Control) -> None:
        if control.op == mad.CTL_HELLO:
            ok = 0 <= control.arg < len(self.fabric.hcas)
            if ok:
                conn.index = control.arg
            await conn.send(mad.control_reply(control.op, 0 if ok else -errno.ENODEV))
        elif control.op == mad.CTL_REGISTER and control.registration is not None:
            # The lowest free id, at most ``MAX_AGENTS`` of them, as the kernel does.
            agent = next((i for i in range(MAX_AGENTS) if i not in conn.agents), None)
            if agent is None:
                await conn.send(mad.control_reply(control.op, -errno.ENOMEM))
                return
            conn.agents[agent] = control.registration
            await conn.send(mad.control_reply(control.op, 0, agent))
        elif control.op == mad.CTL_COUNTER and control.counter is not None:
            await conn.send(await self._counter(control.arg, control.counter))
        elif control.op == mad.CTL_UNREGISTER:
            found = conn.agents.pop(control.arg, None) is not None
            await conn.send(mad.control_reply(control.op, 0 if found else -errno.EINVAL))
        else:
            await conn.send(mad.control_reply(control.op, -errno.EINVAL))

    async def _counter(self, hca: int, change: mad.CounterChange) -> bytes:
        if not 0 <= hca < len(self.fabric.hcas):
            return mad.counter_reply(-errno.ENODEV)
        if self.on_counter is None:
            return mad.counter_reply(-errno.EOPNOTSUPP)
        if change.mode not in mad.COUNTER_MODES or change.name not in COUNTER_BITS:
            return mad.counter_reply(-errno.EINVAL)
        try:
            async with self._counting:
                value = await self.on_counter(hca, await self._saturating(hca, change))
        except ValueError:
            return mad.counter_reply(-errno.EINVAL)
        except Exception:
            # The re-stage failed (a full disk, a broken root): the tool hears
            # it failed; the daemon goes on serving.
            logger.exception("ib: changing %s of mlx5_%d failed", change.name, hca)
            return mad.counter_reply(-errno.EIO)
        return mad.counter_reply(0, value)

    async def _saturating(self, hca: int, change: mad.CounterChange) -> mad.CounterChange:
        """``change`` as the setting of a value the counter can hold: an
        addition from the value sysfs shows, held at the counter's width."""
        value = change.value
        if change.mode == mad.COUNTER_ADD:
            current = await trio.to_thread.run_sync(self.fabric.read_counters, hca)
            value += current.get(change.name, 0)
        return mad.CounterChange(change.name, mad.COUNTER_SET, saturated(change.name, value))

    # ---- requests from local tools --------------------------------------------

    async def _from_tool(self, conn: Connection, umad: mad.Umad) -> None:
        assert conn.index is not None
        if conn.index >= len(self.fabric.hcas):
            return  # its HCA went away with a reload: the port is gone, MADs are lost
        hca = self.fabric.hcas[conn.index]
        if mad.is_response(umad.mad):
            await self._tool_responded(hca.lid, umad)
            return
        if over_limit(len(conn.pending), len(self._pending)):
            self._overflow_log.warning(
                "ib: a request handed back with ENOMEM: %d of the tool's and %d in all wait "
                "for answers", len(conn.pending), len(self._pending))
            await conn.send(attrs.evolve(umad, status=mad.ENOMEM).pack())
            return
        request_id = self._next_id
        self._next_id += 1
        pending = Pending(conn=conn, request=umad)
        self._pending[request_id] = pending
        conn.pending.add(request_id)
        assert self._nursery is not None
        self._nursery.start_soon(self._expire, request_id, pending)
        walk = None
        if mad.mgmt_class(umad.mad) == mad.CLASS_SMP_DR:
            walk = Walked(entity=("hca", self.fabric.me, conn.index), arrival=1,
                          hops=tuple(mad.dr_initial_path(umad.mad)))
        await self._route(Request(
            id=request_id, origin=self.fabric.me, slid=hca.lid, mad=umad.mad,
            dlid=None if walk is not None else umad.lid, walk=walk,
        ))

    async def _expire(self, request_id: int, pending: Pending) -> None:
        umad = pending.request
        try:
            with trio.move_on_after(wait_seconds(umad)):
                await pending.done.wait()
                return
            if self._pending.pop(request_id, None) is not None:
                await pending.conn.send(attrs.evolve(umad, status=mad.ETIMEDOUT).pack())
        finally:
            pending.conn.pending.discard(request_id)

    async def _deliver(self, request_id: int, responder_lid: int, answer: bytes) -> None:
        """An answer for a request of a local tool."""
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return  # timed out already
        pending.done.set()
        request = pending.request
        gsi = mad.mgmt_class(answer) not in (mad.CLASS_SMP_LID, mad.CLASS_SMP_DR)
        await pending.conn.send(mad.Umad(
            agent_id=request.agent_id, lid=responder_lid,
            qpn=mad.GSI_QPN if gsi else 0, qkey=mad.GSI_QKEY if gsi else 0,
            sl=request.sl, pkey_index=request.pkey_index, mad=answer,
        ).pack())

    async def _complete(self, request: Request, responder_lid: int, answer: bytes) -> None:
        if request.origin == self.fabric.me:
            await self._deliver(request.id, responder_lid, answer)
        elif self.relay is not None:
            await self.relay.send(request.origin, {
                "t": "resp", "id": request.id, "lid": responder_lid, "mad": answer.hex(),
            })

    # ---- routing ----------------------------------------------------------

    async def _route(self, request: Request) -> None:
        fabric = self.fabric
        if request.walk is not None:
            walked = fabric.walk(request.walk)
            if walked is None:
                return
            owner = fabric.owner(walked.entity)
            if owner is not None and owner != fabric.me:
                await self._forward(owner, attrs.evolve(request, walk=walked))
                return
            arrival = walked.arrival if isinstance(walked.arrival, int) else 0
            answer = fabric.answer_smp(walked.entity, arrival, request.mad)
            await self._complete(request, mad.PERMISSIVE_LID, answer)
            return
        entity = fabric.entity_at(request.dlid or 0)
        if entity is None:
            return
        owner = fabric.owner(entity)
        if owner is not None and owner != fabric.me:
            await self._forward(owner, request)
            return
        lid = fabric.lid_of(entity)
        cls = mad.mgmt_class(request.mad)
        if cls == mad.CLASS_SMP_LID:
            local_port = 1 if entity[0] == "hca" else 0
            await self._complete(request, lid, fabric.answer_smp(entity, local_port, request.mad))
        elif cls == mad.CLASS_PERF:
            if entity[0] == "hca" and smp.is_counter_reset(request.mad):
                await self._reset_counters(int(entity[2]), request.mad)
            # The counters are read from the staged sysfs files: a thread hop.
            answer = await trio.to_thread.run_sync(fabric.answer_perf, entity, request.mad)
            await self._complete(request, lid, answer)
        elif cls == mad.CLASS_SA and entity == SPINE:
            await self._complete(request, lid, fabric.answer_sa(request.mad, request.slid))
        elif entity[0] == "hca" and not mad.is_response(request.mad):
            await self._to_local_agent(int(entity[2]), request)

    async def _reset_counters(self, hca: int, request: bytes) -> None:
        """``perfquery -R``: a Set of PortCounters clears the selected counters
        (through the simulator, so sysfs shows the reset too)."""
        if self.on_counter is None:
            return
        async with self._counting:
            current = await trio.to_thread.run_sync(self.fabric.read_counters, hca)
            for name in smp.selected_counters(request):
                if current.get(name, 0):
                    await self.on_counter(hca, mad.CounterChange(name, mad.COUNTER_SET, 0))

    async def _forward(self, owner: int, request: Request) -> None:
        """Hand ``request`` to the daemon of ``owner``.

        Only the origin hands a request to another daemon, so it knows whose
        answer to take: a directed route that leaves this node for a third
        one goes back to its origin (which sends it on and waits for that
        node's answer), never straight to the third node."""
        if self.relay is None:
            return
        if request.origin != self.fabric.me:
            await self.relay.send(request.origin, request.to_message())
            return
        pending = self._pending.get(request.id)
        if pending is None:
            return  # timed out already
        pending.peer = owner
        await self.relay.send(owner, request.to_message())

    async def _to_local_agent(self, hca_index: int, request: Request) -> None:
        """An unsolicited request for a tool on local HCA ``hca_index``."""
        for conn in list(self._tools.conns):
            if conn.index != hca_index:
                continue
            for agent, registration in conn.agents.items():
                if registration.accepts(request.mad):
                    key = (request.slid, mad.tid(request.mad))
                    self._served[key] = (request.origin, request.id)
                    while len(self._served) > MAX_SERVED:
                        self._served.popitem(last=False)
                    await conn.send(mad.Umad(
                        agent_id=agent, lid=request.slid, qpn=mad.GSI_QPN,
                        qkey=mad.GSI_QKEY, mad=request.mad,
                    ).pack())
                    return

    async def _tool_responded(self, responder_lid: int, umad: mad.Umad) -> None:
        """A local tool (``ibping -S``) answered a request delivered to it."""
        key = (umad.lid, mad.tid(umad.mad))
        where = self._served.pop(key, None)
        if where is None:
            return
        origin, request_id = where
        request = Request(id=request_id, origin=origin, slid=umad.lid, mad=umad.mad)
        await self._complete(request, responder_lid, umad.mad)

    # ---- the relay's messages ------------------------------------------

    async def on_relay(self, peer: int, message: dict[str, Any]) -> None:
        kind = message.get("t")
        if kind == "req":
            try:
                request = Request.from_message(message, len(self.fabric.nodes))
                self._check_relayed(peer, request)
            except ValueError as exc:
                logger.warning("ib relay: dropped a request from %s: %s",
                               self.fabric.nodes[peer], exc)
                return
            # (A walk that reached our leaf from the spine arrives on
            # ``UPLINK``: ``Fabric.walk`` resolves it, we know the port.)
            await self._route(request)
        elif kind == "resp":
            try:
                request_id = checked_int(message["id"], 1 << 63)
                lid = checked_int(message["lid"], 0x10000)
                answer = bytes.fromhex(message["mad"])
                if len(answer) != mad.MAD_SIZE:
                    raise ValueError("the answer is not a 256-byte MAD")
            except (KeyError, TypeError, ValueError) as exc:
                logger.warning("ib relay: dropped an answer from %s: %s",
                               self.fabric.nodes[peer], exc)
                return
            pending = self._pending.get(request_id)
            if pending is None:
                return  # timed out already
            if pending.peer != peer:
                # Request ids are sequential: matching on the id alone would
                # take any peer's word for any request.
                logger.warning("ib relay: dropped an answer from %s to request %d, which "
                               "went to %s", self.fabric.nodes[peer], request_id,
                               "no peer" if pending.peer is None
                               else self.fabric.nodes[pending.peer])
                return
            await self._deliver(request_id, lid, answer)

    def _check_relayed(self, peer: int, request: Request) -> None:
        """``ValueError`` unless ``peer`` may send ``request``: a request of its
        own for an entity of ours, or one of ours it hands back (``_forward``)."""
        fabric = self.fabric
        if request.origin == fabric.me:
            pending = self._pending.get(request.id)
            if request.walk is None or pending is None or pending.peer != peer:
                raise ValueError(f"request {request.id} of ours was not with that peer")
            return
        if request.origin != peer:
            raise ValueError(f"it speaks for {fabric.nodes[request.origin]}")
        entity = (request.walk.entity if request.walk is not None
                  else fabric.entity_at(request.dlid or 0))
        if entity is None or fabric.owner(entity) != fabric.me or (
            entity[0] == "hca" and int(entity[2]) >= len(fabric.hcas)
        ):
            raise ValueError(f"no {entity or f'LID {request.dlid}'} here")
