"""The MAD service: the node's umad socket, the SMA, the PMA, the SM, and routing.

Every tool run under ``libumadshim.so`` holds one ``SOCK_SEQPACKET``
connection per opened umad port (see ``native/umadshim``).  On it come
control frames (HELLO naming the umad index, agent registrations) and MAD
frames (``mad.Umad``).  Each request a tool sends becomes a ``Pending``
entry here, on the origin daemon, with one task that waits at most the
request's own timeout (``timeout_ms`` times (retries + 1)) and then hands the
request back with status ``ETIMEDOUT``, as the kernel does; an answer
before that cancels it.  No request, no task: an idle service sleeps in
``accept`` and ``recv``.

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
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from mokka.simulators.ib import mad, smp
from mokka.simulators.ib.fabric import SPINE, UPLINK, Fabric, Walked
from mokka.simulators.ib.relay import Relay
from mokka.simulators.ib.sysfs import UMAD_MODE

logger = logging.getLogger(__name__)

#: Largest frame a tool writes: the header and a 256-byte MAD (RMPP
#: segments are never sent by the tools served).
MAX_FRAME = mad.UMAD_HEADER_SIZE + 2048
#: ``timeout_ms`` 0 means the kernel's default of one second.
DEFAULT_TIMEOUT_MS = 1000
#: Requests delivered to a local agent (``ibping -S``) waiting for its
#: response; bounded so a tool that never answers cannot grow it forever.
MAX_SERVED = 1024


@attrs.define(eq=False)
class Connection:
    """One opened umad port of one tool process."""

    sock: trio.socket.SocketType
    #: umad index = local HCA index (``None`` until the HELLO)
    index: int | None = None
    agents: dict[int, mad.Registration] = attrs.field(factory=dict)
    next_agent: int = 0
    lock: trio.Lock = attrs.field(factory=trio.Lock)

    async def send(self, frame: bytes) -> None:
        try:
            async with self.lock:
                await self.sock.send(frame)
        except OSError:
            pass  # the tool has gone; its pending requests time out quietly


@attrs.define(eq=False)
class Pending:
    """A request a local tool sent, waiting for its answer."""

    conn: Connection
    request: mad.Umad
    done: trio.Event = attrs.field(factory=trio.Event)


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

    # ---- the unix socket --------------------------------------------------

    async def serve(self, path: Path, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen at ``path`` until cancelled; the socket file goes with it."""
        listener, dirfd, address = await trio.to_thread.run_sync(_listen, path)
        sock = trio.socket.from_stdlib_socket(listener)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                while True:
                    client, _ = await sock.accept()
                    conn = Connection(client)
                    self._conns.add(conn)
                    nursery.start_soon(self._serve_connection, conn)
        finally:
            self._nursery = None
            sock.close()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_unlisten, dirfd, address)

    async def _serve_connection(self, conn: Connection) -> None:
        try:
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
                    logger.warning("ib: dropped a malformed frame from a tool: %s", exc)
        finally:
            self._conns.discard(conn)
            conn.sock.close()

    async def _control(self, conn: Connection, control: mad.Control) -> None:
        if control.op == mad.CTL_HELLO:
            ok = 0 <= control.arg < len(self.fabric.hcas)
            if ok:
                conn.index = control.arg
            await conn.send(mad.control_reply(control.op, 0 if ok else -errno.ENODEV))
        elif control.op == mad.CTL_REGISTER and control.registration is not None:
            agent = conn.next_agent
            conn.next_agent += 1
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
            return mad.control_reply(mad.CTL_COUNTER, -errno.ENODEV)
        if self.on_counter is None:
            return mad.control_reply(mad.CTL_COUNTER, -errno.EOPNOTSUPP)
        try:
            value = await self.on_counter(hca, change)
        except ValueError:
            return mad.control_reply(mad.CTL_COUNTER, -errno.EINVAL)
        except Exception:
            # The re-stage failed (a full disk, a broken root): the tool hears
            # it failed; the daemon goes on serving.
            logger.exception("ib: changing %s of mlx5_%d failed", change.name, hca)
            return mad.control_reply(mad.CTL_COUNTER, -errno.EIO)
        return mad.control_reply(mad.CTL_COUNTER, 0, min(value, 0xFFFFFFFF))

    # ---- requests from local tools --------------------------------------------

    async def _from_tool(self, conn: Connection, umad: mad.Umad) -> None:
        assert conn.index is not None
        if conn.index >= len(self.fabric.hcas):
            return  # its HCA went away with a reload: the port is gone, MADs are lost
        hca = self.fabric.hcas[conn.index]
        if mad.is_response(umad.mad):
            await self._tool_responded(hca.lid, umad)
            return
        request_id = self._next_id
        self._next_id += 1
        pending = Pending(conn=conn, request=umad)
        self._pending[request_id] = pending
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
        seconds = (umad.timeout_ms or DEFAULT_TIMEOUT_MS) * (umad.retries + 1) / 1000
        with trio.move_on_after(seconds):
            await pending.done.wait()
            return
        if self._pending.pop(request_id, None) is not None:
            await pending.conn.send(attrs.evolve(umad, status=mad.ETIMEDOUT).pack())

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
        current = await trio.to_thread.run_sync(self.fabric.read_counters, hca)
        for name in smp.selected_counters(request):
            if current.get(name, 0):
                await self.on_counter(hca, mad.CounterChange(name, mad.COUNTER_SET, 0))

    async def _forward(self, owner: int, request: Request) -> None:
        if self.relay is not None:
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
                entity = request.walk.entity if request.walk is not None else SPINE
                if entity[0] == "hca" and (entity[1] != self.fabric.me
                                           or int(entity[2]) >= len(self.fabric.hcas)):
                    raise ValueError(f"no HCA {entity} here")
            except ValueError as exc:
                logger.warning("ib relay: dropped a request from %s: %s",
                               self.fabric.nodes[peer], exc)
                return
            if request.walk is not None and request.walk.arrival == UPLINK:
                # Our leaf reached from the spine: the owner knows the uplink.
                request = attrs.evolve(request, walk=attrs.evolve(
                    request.walk, arrival=len(self.fabric.hcas) + 1))
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
            await self._deliver(request_id, lid, answer)


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
