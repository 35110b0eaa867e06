"""The umad socket's tools: accepting them within limits, each one's frames and queue.

Every tool run under ``libumadshim.so`` holds one ``SOCK_SEQPACKET``
connection per opened umad port (see ``native/umadshim``).  Whoever can open
the socket decides how much it is asked to hold, so every amount a
connection holds is bounded here (``MAX_CONNECTIONS``, ``MAX_OUTBOX``,
``MAX_AGENTS``): past a bound the service refuses, as the kernel does when
it runs out (a connection closed at once, a tool that does not read its
answers dropped).  Running out of file descriptors in ``accept`` is waited
out (``ACCEPT_LATER``, ``ACCEPT_RETRY``), not fatal: the tools already
connected go on being served.  ``Tools`` hands each frame on; what the
frames mean, and where a MAD goes, is ``service.py``'s.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

from mokka.loglimit import LogLimit
from mokka.simulators import unixsocket
from mokka.simulators.ib import mad
from mokka.simulators.ib.sysfs import UMAD_MODE

logger = logging.getLogger(__name__)

#: Largest frame a tool writes: the header and a 256-byte MAD (RMPP
#: segments are never sent by the tools served).
MAX_FRAME = mad.UMAD_HEADER_SIZE + 2048
#: Connections one umad socket serves at once (at most a quarter of the
#: open file limit, so tools alone never take every descriptor): a tool
#: holds one per opened port, and a node runs a handful of tools at a time.
MAX_CONNECTIONS = 512
#: Frames queued for one tool: past it the tool is not reading its answers
#: and is dropped (its socket closed), rather than queued for without end.
MAX_OUTBOX = 256
#: Agents one connection may register (the kernel's ``IB_UMAD_MAX_AGENTS``).
MAX_AGENTS = 32
#: Seconds ``accept`` waits after running out of descriptors (doubling up to
#: the second figure): the connected tools are served meanwhile.
ACCEPT_RETRY = (0.1, 1.0)
#: ``accept`` errors that are waited out: descriptors or memory ran out.
ACCEPT_LATER = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


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
    #: ids (among ``service.MadService``'s pending requests) of this
    #: tool's requests still waiting
    pending: set[int] = attrs.field(factory=set)
    #: cancels the connection's reader and writer (``Tools``)
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
class Tools:
    """The tools connected to one umad socket.

    ``accept`` takes at most ``connection_cap()`` at once (more are closed as
    soon as they are accepted) and waits out running out of descriptors;
    each connection's frames go to ``on_frame`` one at a time, its answers
    are written out by ``Connection.write_out``, and once it goes (or is
    dropped) ``on_gone`` lets go of what it left behind.
    """

    on_frame: Callable[[Connection, bytes], Awaitable[None]]
    on_gone: Callable[[Connection], None]
    conns: set[Connection] = attrs.field(factory=set, init=False)
    #: what a flood of tools can provoke, logged now and then
    refused_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    accept_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    dropped_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)

    async def accept(self, sock: trio.socket.SocketType, nursery: trio.Nursery) -> None:
        """Accept tools at ``sock`` until cancelled, serving each in ``nursery``."""
        cap = connection_cap()
        retry = ACCEPT_RETRY[0]
        while True:
            try:
                client, _ = await sock.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_LATER:
                    raise
                # Out of descriptors (or memory): the connected tools
                # are served meanwhile; the new one waits in the backlog.
                self.accept_log.warning(
                    "ib: cannot accept a tool's connection (%s); %d connected are "
                    "served, accepting again in %.1f s", os.strerror(exc.errno),
                    len(self.conns), retry)
                await trio.sleep(retry)
                retry = min(retry * 2, ACCEPT_RETRY[1])
                continue
            retry = ACCEPT_RETRY[0]
            if len(self.conns) >= cap:
                client.close()
                self.refused_log.warning(
                    "ib: refused a tool's connection: %d are connected, the most served",
                    len(self.conns))
                continue
            conn = Connection(client)
            self.conns.add(conn)
            nursery.start_soon(self._serve, conn)

    async def _serve(self, conn: Connection) -> None:
        try:
            with conn.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(conn.write_out)
                    await self._read(conn)
                    nursery.cancel_scope.cancel()
        finally:
            self.conns.discard(conn)
            self.on_gone(conn)
            conn.sock.close()
            conn.junk.flush()
            if conn.dropped is not None:
                self.dropped_log.warning("ib: dropped a tool's connection: %s", conn.dropped)

    async def _read(self, conn: Connection) -> None:
        """Hand on the tool's frames, one at a time, until it goes."""
        while True:
            try:
                frame = await conn.sock.recv(MAX_FRAME)
            except OSError:
                return
            if not frame:
                return
            await self.on_frame(conn, frame)


def connection_cap() -> int:
    """``MAX_CONNECTIONS``, or a quarter of the open file limit when that is less."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft // 4))


def listen(path: Path) -> tuple[socket.socket, int, str]:
    """Bind and listen at ``path`` (blocking: a worker thread); see ``unixsocket``.

    The socket replaces the empty file that recorded it
    (``mockib.record_socket``).
    """
    # Root's only, like the umad device nodes it stands for (rdma-core's
    # udev rules): management datagrams can reconfigure a real fabric.
    return unixsocket.listen(path, socket.SOCK_SEQPACKET, mode=UMAD_MODE, backlog=64)
