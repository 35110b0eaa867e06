"""The probes' HTTP server: hypercorn's HTTP protocol on connections this module bounds.

The health port faces whoever can reach it (the chart binds ``0.0.0.0``),
and a probe server that a client can take down takes the daemon with it:
it is the outer nursery's first task (``mokka.daemon.runner``).  hypercorn
speaks HTTP here (h11, h2, its ``TCPServer`` per connection); what hypercorn's
own ``worker_serve`` leaves to a friendlier network is done here instead:

* **No connection's error reaches the server.**  hypercorn lets anything but
  ``OSError`` out of a connection's task, and ``trio.serve_listeners`` then
  ends the whole server: malformed HTTP did that (a 400 sent while the other
  task of the connection was half-way through its ``send_eof`` raised
  ``BusyResourceError``).  Each connection runs in a guard that drops it with
  one rate-limited line, and its stream (``_GuardedStream``) serialises
  ``send_all`` with ``send_eof``, which removes that race at its root.
* **A client that never reads** cannot hold a connection (or the shutdown)
  forever: hypercorn shields every send from cancellation, so each send has
  its own deadline (``SEND_TIMEOUT``) inside the shield, after which the
  connection is closed; a connection lives at most ``LIFETIME`` (an h2
  client can hold streams open without ever finishing one); on shutdown,
  connections left after ``graceful_timeout`` are closed under their tasks.
* **A flood** is held to ``MAX_CONNECTIONS`` connections at once (fewer when
  the open file limit is low: a quarter of it, so the passes keep their
  descriptors); the rest wait in the listen backlog.  When ``accept`` finds
  no descriptor left (``EMFILE``: other sockets took them) the server waits
  ``ACCEPT_RETRY`` and tries again instead of ending.
* **Logs stay short**: connection failures and accept failures each go
  through a ``LogLimit`` (the first as it is, then a line per interval with
  the count), never a traceback.
"""

from __future__ import annotations

import errno
import logging
import resource
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
import trio_util
from hypercorn.config import Config
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState

from mokka.loglimit import LogLimit

logger = logging.getLogger(__name__)

#: Most connections served at once.  A kubelet opens one per probe, a
#: Prometheus scraper keeps one; 512 leaves room for a benchmark's 500
#: concurrent clients while a flood holds a bounded amount of memory (about
#: 30 kB per connection: hypercorn's buffers are capped at 16 KiB).
MAX_CONNECTIONS = 512
#: Seconds one send may wait for a client to read before its connection is
#: closed.  A probe's answer is a few kB, which the kernel's buffer takes at
#: once; only a client that stopped reading waits here.
SEND_TIMEOUT = 10.0
#: Seconds one connection may live.  Probes and scrapes are a request or a
#: few on a keep-alive connection (hypercorn closes one idle for 5 s); only
#: a client holding streams open without finishing them gets near this.
LIFETIME = 120.0
#: Seconds between two tries of ``accept`` while no descriptor is left.
ACCEPT_RETRY = 0.1
#: What ``accept`` raises when the process or the system is out of
#: descriptors or buffers: wait for some to come back.
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def connection_cap() -> int:
    """``MAX_CONNECTIONS``, or a quarter of the open file limit when that is lower."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft // 4))


@attrs.define(eq=False)
class _GuardedStream:
    """A connection's ``SocketStream`` as hypercorn's ``TCPServer`` uses it, made safe.

    ``send_all`` and ``send_eof`` take turns (a lock): trio refuses two
    senders at once, and hypercorn's ``_close`` sends the EOF without its
    own send lock.  No ``do_handshake``: ``TCPServer`` takes that as plain
    TCP.
    """

    stream: trio.SocketStream
    #: Where a client that stopped reading is reported (the server's limit).
    log: LogLimit
    _sending: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    @property
    def socket(self) -> trio.socket.SocketType:
        return self.stream.socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async with self._sending:
            # Inside hypercorn's shield: this deadline still applies.
            with trio.move_on_after(SEND_TIMEOUT) as scope:
                await self.stream.send_all(data)
        if scope.cancelled_caught:
            self.log.warning("health probes: closed a connection whose client read nothing "
                             "for %g s", SEND_TIMEOUT)
            self.close()
            raise trio.BrokenResourceError(f"the client read nothing for {SEND_TIMEOUT:g} s")

    async def send_eof(self) -> None:
        if self._sending.locked():
            # A send is in progress (a client not reading): the close that
            # follows ends it; waiting for it would only delay that.
            return
        async with self._sending:
            await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()

    def close(self) -> None:
        """Close now, from any task: whatever waits on the socket wakes with an error."""
        self.stream.socket.close()


@attrs.define(eq=False)
class ProbeServer:
    """Accepts connections on one listening socket and serves each with hypercorn."""

    app: AppWrapper
    config: Config
    #: Most connections at once (``connection_cap()``).
    cap: int = attrs.field(factory=connection_cap)
    _context: WorkerContext = attrs.field(factory=lambda: WorkerContext(None), init=False)
    _open: set[_GuardedStream] = attrs.field(factory=set, init=False)
    #: ``len(_open)``, observable: shutdown waits for it to reach 0.
    _count: trio_util.AsyncValue[int] = attrs.field(
        factory=lambda: trio_util.AsyncValue(0), init=False
    )
    _accept_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)
    _connection_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger), init=False)

    async def serve(
        self,
        listener: trio.SocketListener,
        *,
        shutdown_trigger: Callable[[], Awaitable[Any]],
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until ``shutdown_trigger`` returns, then let connections finish, briefly."""
        slots = trio.Semaphore(self.cap)
        try:
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as accepting:
                    accepting.start_soon(self._accept, listener, slots, connections)
                    task_status.started()
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
                await listener.aclose()
                # Idle keep-alive connections close, answers in flight finish.
                await self._context.terminated.set()
                with trio.move_on_after(self.config.graceful_timeout):
                    await self._count.wait_value(0)
                for stream in list(self._open):
                    stream.close()
                connections.cancel_scope.cancel()
        finally:
            # Also when the caller's scope is cancelled before the shutdown
            # trigger fires: the listening socket is closed, never left to GC.
            listener.socket.close()
            self._accept_log.flush()
            self._connection_log.flush()

    async def _accept(self, listener: trio.SocketListener, slots: trio.Semaphore,
                      connections: trio.Nursery) -> None:
        while True:
            await slots.acquire()
            try:
                stream = await listener.accept()
            except OSError as exc:
                slots.release()
                if exc.errno not in _EXHAUSTED:
                    raise
                self._accept_log.warning(
                    "health probes: cannot accept a connection (%s); %d open, retrying",
                    (exc.strerror or str(exc)).lower(), len(self._open),
                )
                await trio.sleep(ACCEPT_RETRY)
                continue
            connections.start_soon(
                self._connection, _GuardedStream(stream, self._connection_log), slots
            )

    async def _connection(self, stream: _GuardedStream, slots: trio.Semaphore) -> None:
        self._open.add(stream)
        self._count.value = len(self._open)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._close_after, stream, LIFETIME)
                try:
                    await TCPServer(self.app, self.config, self._context,
                                    ConnectionState({}), stream)  # type: ignore[arg-type]
                except* Exception as group:
                    # Dropped, never raised: one client's input must not end the server.
                    first = group.exceptions[0]
                    self._connection_log.warning(
                        "health probes: dropped a connection after %s: %s",
                        type(first).__name__, str(first)[:200],
                    )
                    logger.debug("the dropped connection's error", exc_info=group)
                nursery.cancel_scope.cancel()
        finally:
            stream.close()
            self._open.discard(stream)
            self._count.value = len(self._open)
            slots.release()

    @staticmethod
    async def _close_after(stream: _GuardedStream, seconds: float) -> None:
        await trio.sleep(seconds)
        stream.close()
