"""The MAD service: the node's umad socket, the SMA, the PMA, the SM, and routing.

Every tool run under ``libumadshim.so`` holds one ``SOCK_SEQPACKET``
connection per opened umad port (see ``native/umadshim``).  On it come
control frames (HELLO naming the umad index, agent registrations) and MAD
frames (``mad.Umad``).  Each request a tool sends becomes a ``Pending``
entry here, on the origin daemon, with one task that waits at most the
request's own timeout (``timeout_ms`` times (retries + 1), capped as the
kernel caps it) and then hands the request back with status ``ETIMEDOUT``,
as the kernel does; an answer before that cancels it.  No request, no task:
an idle service sleeps in ``accept`` and ``recv``.

Whoever can open the socket decides how much it is asked to hold, so every
amount is bounded (``MAX_CONNECTIONS``, ``MAX_PENDING_PER_CONNECTION``,
``MAX_PENDING``, ``MAX_OUTBOX``, ``MAX_AGENTS``): past a bound the service
refuses, as the kernel does when it runs out (a connection closed at once, a
request handed back with ``ENOMEM``, a tool that does not read its answers
dropped), and logs it through a ``LogLimit``, so a flood costs a few lines.
Running out of file descriptors in ``accept`` is waited out, not fatal: the
tools already connected go on being served.

Routing (``_route``), the same on the origin and on a peer the relay
brought the request to:

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

import contextlib
import errno
import logging
import os
import resource
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from mokka.loglimit import LogLimit
from mokka.simulators.ib import mad, smp
from mokka.simulators.ib.fabric import SPINE, UPLINK, Fabric, Walked
from mokka.simulators.ib.relay import Relay
from mokka.simulators.ib.sysfs import COUNTER_BITS, UMAD_MODE, saturated

logger = logging.getLogger(__name__)

#: Largest frame a tool writes: the header and a 256-byte MAD (RMPP
#: segments are never sent by the tools served).
MAX_FRAME = mad.UMAD_HEADER_SIZE + 2048
#: ``timeout_ms`` 0 means the kernel's default of one second.
DEFAULT_TIMEOUT_MS = 1000
#: The kernel's bounds on how long a request waits: one wait for an answer
#: (``IB_MAD_MAX_TIMEOUT_MS``, a minute) and the request with all its retries
#: (``IB_MAD_MAX_DEADLINE``, five minutes).  A tool asking for 2**32-1 ms
#: would otherwise hold its entry for 49 days.
MAX_TIMEOUT_MS = 60_000
MAX_DEADLINE_MS = 300_000
#: Connections one umad socket serves at once (at most a quarter of the
#: open file limit, so tools alone never take every descriptor): a tool
#: holds one per opened port, and a node runs a handful of tools at a time.
MAX_CONNECTIONS = 512
#: Requests of one connection waiting for their answers (libibmad waits for
#: each answer; ``ibnetdiscover`` keeps a few outstanding), and of all
#: connections together; past either, a request comes back at once with
#: ``ENOMEM``, as a write to a kernel out of memory fails.
MAX_PENDING_PER_CONNECTION = 256
MAX_PENDING = 4096
#: Frames queued for one tool: past it the tool is not reading its answers
#: and is dropped (its socket closed), rather than queued for without end.
MAX_OUTBOX = 256
#: Agents one connection may register (the kernel's ``IB_UMAD_MAX_AGENTS``).
MAX_AGENTS = 32
#: Seconds ``accept`` waits after running out of descriptors (doubling up to
#: the second figure): the connected tools are served meanwhile.
ACCEPT_RETRY = (0.1, 1.0)
#: Requests delivered to a local agent (``ibping -S``) waiting for its
#: response; bounded so a tool that never answers cannot grow it forever.
MAX_SERVED = 1024


@attrs.define(eq=False)
class Connection:
    """One opened umad port of one tool process.

    Frames for the tool go through a bounded queue that one task writes out
    (``write_out``), so no answer waits on a tool that does not read; a
    full queue drops the tool (``scope`` cancels its tasks).
    """

    sock: trio.socket.SocketType
    #: umad index = local HCA index (``None`` until the HELLO)
    index: int | None = None
    agents: dict[int, mad.Registration] = attrs.field(factory=dict)
    #: ids (in ``MadService._pending``) of this tool's requests still waiting
    pending: set[int] = attrs.field(factory=set)
    #: cancels the connection's reader and writer (``MadService._serve_connection``)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: why the service dropped the tool (``None``: it was not dropped)
    dropped: str | None = None
    #: the malformed frames this tool sent, a line now and then
    junk: LogLimit = attrs.field(factory=lambda: LogLimit(logger))
    _outbox: tuple[trio.MemorySendChannel[bytes], trio.MemoryReceiveChannel[bytes]] = (
        attrs.field(factory=lambda: trio.open_memory_channel[bytes](MAX_OUTBOX)))

    async def send(self, frame: bytes) -> None:
        """Queue ``frame`` for the tool (never waits on the tool)."""
        self.post(frame)
        await trio.lowlevel.checkpoint()

    def post(self, frame: bytes) -> None:
        """Queue ``frame``; a tool whose queue is full is dropped."""
        try:
            self._outbox[0].send_nowait(frame)
        except trio.WouldBlock:
            self.drop(f"it left {MAX_OUTBOX} answers unread")
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the tool has gone; its pending requests went with it

    def drop(self, reason: str) -> None:
        if self.dropped is None:
            self.dropped = reason
        self.scope.cancel()

    async def write_out(self) -> None:
        """Write the queued frames to the tool until it goes."""
        async for frame in self._outbox[1]:
            try:
                await self.sock.send(frame)
            except OSError:
                return  # the tool has gone; the reader sees it too


@attrs.define(eq=False)
class Pending:
    """A request a local tool sent, waiting for its answer."""

    conn: Connection
    request: mad.Umad
    done: trio.Event = attrs.field(factory=trio.Event)
    #: the peer the relay carried it to: the one node whose answer (or
    #: hand-back, see ``MadService._forward``) is taken for it
    peer: int | None = None


@attrs.frozen(kw_only=True)
class Request:
    """A MAD on its way, wherever it is being routed."""

    id: int
    #: node index of the daemon whose tool sent it
    origin: int
    slid: int
    mad: bytes
    #: LID-routed destination, or ``None`` for a directed route
    dlid: int | None = None
    #: directed route: where the walk stands
    walk: Walked | None = None

    def to_message(self) -> dict[str, Any]:
        walk = None
        if self.walk is not None:
            walk = [list(self.walk.entity), self.walk.arrival, list(self.walk.hops)]
        return {"t": "req", "id": self.id, "origin": self.origin, "slid": self.slid,
                "dlid": self.dlid, "walk": walk, "mad": self.mad.hex()}

    @classmethod
    def from_message(cls, message: dict[str, Any], nodes: int) -> Request:
        """A ``req`` from a peer of a fabric of ``nodes`` nodes; ``ValueError``
        for anything a daemon of this fabric would not send."""
        try:
            walk = None
            if message.get("walk") is not None:
                entity, arrival, hops = message["walk"]
                walk = Walked(entity=_entity(entity, nodes), arrival=_arrival(arrival),
                              hops=_hops(hops))
            raw = bytes.fromhex(message["mad"])
            dlid = message.get("dlid")
            request = cls(id=_int(message["id"], 1 << 63), origin=_int(message["origin"], nodes),
                          slid=_int(message["slid"], 0x10000), mad=raw,
                          dlid=None if dlid is None else _int(dlid, 0x10000), walk=walk)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed relay request: {exc!r}") from exc
        if len(raw) != mad.MAD_SIZE or (walk is None) == (request.dlid is None):
            raise ValueError("malformed relay request: a 256-byte MAD with a LID or a route")
        return request


def _int(value: Any, bound: int) -> int:
    if type(value) is not int or not 0 <= value < bound:
        raise ValueError(f"{value!r} is not an integer below {bound}")
    return value


def _entity(value: Any, nodes: int) -> tuple[str | int, ...]:
    entity = tuple(value)
    if entity == SPINE:
        return entity
    if len(entity) == 2 and entity[0] == "leaf":
        return ("leaf", _int(entity[1], nodes))
    if len(entity) == 3 and entity[0] == "hca":
        return ("hca", _int(entity[1], nodes), _int(entity[2], 256))
    raise ValueError(f"{value!r} is no entity of the fabric")


def _arrival(value: Any) -> int | str:
    return UPLINK if value == UPLINK else _int(value, 256)


def _hops(value: Any) -> tuple[int, ...]:
    hops = tuple(_int(h, 256) for h in value)
    if len(hops) > 63:
        raise ValueError("a directed route has at most 63 hops")
    return hops


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
    _conns: set[Connection] = attrs.field(factory=set, init=False)
    _next_id: int = attrs.field(default=1, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    #: one counter change at a time: an addition reads the value it adds to
    _counting: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    #: what a flood of tools can provoke, logged now and then
    _refused_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    _accept_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    _overflow_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    _dropped_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)

    @property
    def connections(self) -> int:
        """Tools connected now."""
        return len(self._conns)

    @property
    def pending(self) -> int:
        """Requests of local tools waiting for their answers."""
        return len(self._pending)

    # ---- the unix socket --------------------------------------------------

    async def serve(self, path: Path, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen at ``path`` until cancelled; the socket file goes with it."""
        listener, dirfd, address = await trio.to_thread.run_sync(_listen, path)
        sock = trio.socket.from_stdlib_socket(listener)
        cap = connection_cap()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                retry = ACCEPT_RETRY[0]
                while True:
                    try:
                        client, _ = await sock.accept()
                    except OSError as exc:
                        if exc.errno not in _ACCEPT_LATER:
                            raise
                        # Out of descriptors (or memory): the connected tools
                        # are served meanwhile; the new one waits in the backlog.
                        self._accept_log.warning(
                            "ib: cannot accept a tool's connection (%s); %d connected are "
                            "served, accepting again in %.1f s", os.strerror(exc.errno),
                            len(self._conns), retry)
                        await trio.sleep(retry)
                        retry = min(retry * 2, ACCEPT_RETRY[1])
                        continue
                    retry = ACCEPT_RETRY[0]
                    if len(self._conns) >= cap:
                        client.close()
                        self._refused_log.warning(
                            "ib: refused a tool's connection: %d are connected, the most served",
                            len(self._conns))
                        continue
                    conn = Connection(client)
                    self._conns.add(conn)
                    nursery.start_soon(self._serve_connection, conn)
        finally:
            self._nursery = None
            sock.close()
            for log in (self._refused_log, self._accept_log, self._overflow_log,
                        self._dropped_log):
                log.flush()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_unlisten, dirfd, address)

    async def _serve_connection(self, conn: Connection) -> None:
        try:
            with conn.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(conn.write_out)
                    await self._read(conn)
                    nursery.cancel_scope.cancel()
        finally:
            self._conns.discard(conn)
            # Its requests go with it: nobody is left to hand the answers to.
            for request_id in conn.pending:
                pending = self._pending.pop(request_id, None)
                if pending is not None:
                    pending.done.set()
            conn.pending.clear()
            conn.sock.close()
            conn.junk.flush()
            if conn.dropped is not None:
                self._dropped_log.warning("ib: dropped a tool's connection: %s", conn.dropped)

    async def _read(self, conn: Connection) -> None:
        """Handle the tool's frames, one at a time, until it goes."""
        while True:
            try:
                frame = await conn.sock.recv(MAX_FRAME)
            except OSError:
                return
            if not frame:
                return
            try:
                if len(frame) < mad.UMAD_HEADER_SIZE:
                    await self._control(conn, mad.Control.unpack(frame))
                elif conn.index is not None:
                    await self._from_tool(conn, mad.Umad.unpack(frame))
            except ValueError as exc:
                conn.junk.warning("ib: dropped a malformed frame from a tool: %s", exc)

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
        if len(conn.pending) >= MAX_PENDING_PER_CONNECTION or len(self._pending) >= MAX_PENDING:
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
        for conn in list(self._conns):
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
                request_id, lid = _int(message["id"], 1 << 63), _int(message["lid"], 0x10000)
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


#: ``accept`` errors that are waited out: descriptors or memory ran out.
_ACCEPT_LATER = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def wait_seconds(umad: mad.Umad) -> float:
    """How long a request waits for its answer: ``timeout_ms`` (0: the default)
    times (retries + 1), each wait and the whole capped as the kernel caps them."""
    per_try = min(umad.timeout_ms or DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS)
    return min(per_try * (umad.retries + 1), MAX_DEADLINE_MS) / 1000


def connection_cap() -> int:
    """``MAX_CONNECTIONS``, or a quarter of the open file limit when that is less."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft // 4))


def _listen(path: Path) -> tuple[socket.socket, int, str]:
    """Bind and listen at ``path`` (blocking: a worker thread).

    ``sun_path`` holds 108 bytes and a node root can be deeper, so the
    socket is bound through its directory's descriptor
    (``/proc/self/fd/<fd>/<name>``), which stays open until ``_unlisten``.
    """
    dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    address = f"/proc/self/fd/{dirfd}/{path.name}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        with contextlib.suppress(FileNotFoundError):
            # The empty file that recorded the socket (``mockib.record_socket``)
            os.unlink(address)
        listener.bind(address)
        # Root's only, like the umad device nodes it stands for (rdma-core's
        # udev rules): management datagrams can reconfigure a real fabric.
        os.chmod(address, UMAD_MODE)
        listener.listen(64)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        os.close(dirfd)
        raise
    return listener, dirfd, address


def _unlisten(dirfd: int, address: str) -> None:
    """Remove the socket file and let go of its directory (blocking)."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)
    finally:
        os.close(dirfd)
