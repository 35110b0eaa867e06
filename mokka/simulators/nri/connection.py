"""The plugin's connection to the runtime's NRI socket: register, serve, come back.

``run_plugin`` connects to the socket, calls the runtime's
``RegisterPlugin``, then answers the runtime's calls of the ``Plugin``
service until the runtime closes the connection; then it connects again,
with a capped backoff, so a restarted containerd gets the plugin back
(NRI forgets an external plugin with its connection).

What the plugin answers must never hold a container back: the runtime
waits for it on every ``CreateContainer`` (2 s by default, then it fails the
plugin, not the container).  So ``on_create`` gets three quarters of the
runtime's deadline; when it raises or runs out of time the container is
answered with an empty adjustment and starts as it would without the
plugin, and ``PluginStatus`` says what failed (for ``/readyz``).  A
malformed frame is a peer the plugin cannot talk to: the connection is
dropped with one rate-limited log line, and the next one starts clean.

Leaving is closing the socket: NRI has no unregister call, and the runtime
drops a plugin whose connection closes.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

from mokka.loglimit import LogLimit
from mokka.simulators.nri import model, ttrpc, wire
from mokka.simulators.protowire import WireError

logger = logging.getLogger(__name__)

#: NRI's default plugin request timeout (``DefaultPluginRequestTimeout``), s:
#: used until the runtime's ``Configure`` names its own.
REQUEST_TIMEOUT = 2.0
#: Share of the runtime's deadline ``on_create`` may use; the rest is for the
#: answer to travel and for a runtime clock that started before ours.
CREATE_SHARE = 0.75
#: NRI's default registration timeout, s: the runtime's own deadline to hear
#: ``RegisterPlugin`` after accepting; the answer comes well within it.
REGISTER_TIMEOUT = 5.0
#: Reconnection backoff, s: first delay and cap.  The cap keeps a restarted
#: containerd without the plugin for at most a few seconds.
BACKOFF_MIN, BACKOFF_MAX = 0.2, 3.0
#: Bytes asked of the socket per read.
READ_SIZE = 65536

OnCreate = Callable[[model.Container], Awaitable[model.Adjustment]]


class RegistrationError(Exception):
    """The runtime refused ``RegisterPlugin`` (bad name or index, duplicate)."""


@attrs.define(eq=False)
class PluginStatus:
    """What the plugin's connection has done so far (mutable; read, don't write)."""

    #: Successful ``RegisterPlugin`` calls: one more after each reconnection.
    registrations: int = 0
    #: ``Configure`` calls answered (the runtime accepted the registration).
    configured: int = 0
    connected: bool = False
    #: Why the last connection ended or failed ("" while none did).
    last_error: str = ""
    #: ``on_create`` calls that raised or ran out of time (answered empty).
    create_failures: int = 0
    last_create_error: str = ""


async def run_plugin(
    socket_path: Path,
    name: str,
    index: str,
    on_create: OnCreate,
    *,
    task_status: trio.TaskStatus[PluginStatus] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Be NRI plugin ``index-name`` on ``socket_path`` until cancelled.

    ``task_status.started(status)`` comes after the first attempt, registered
    or not: the daemon does not wait on a runtime that is not up yet.
    """
    status = PluginStatus()
    connect_log = LogLimit(logger)
    started = False
    backoff = BACKOFF_MIN

    def first_attempt_done() -> None:
        nonlocal started
        if not started:
            started = True
            task_status.started(status)

    while True:
        before = status.registrations
        try:
            await _session(socket_path, name, index, on_create, status, first_attempt_done)
            status.last_error = "the runtime closed the connection"
        except* Exception as group:
            # Whatever ended it (a refused connect, a broken pipe, a malformed
            # frame, a refused registration, a bug of ours), the runtime goes
            # on without the plugin and the next attempt starts clean.
            status.last_error = "; ".join(str(exc) for exc in group.exceptions)
            connect_log.warning("NRI plugin %s-%s: %s", index, name, status.last_error)
        finally:
            status.connected = False
        first_attempt_done()
        backoff = BACKOFF_MIN if status.registrations > before else min(backoff * 2, BACKOFF_MAX)
        await trio.sleep(backoff)


#: ``sun_path`` holds 108 bytes, the terminating NUL included.
_SUN_PATH_MAX = 107


async def _open_unix(path: Path) -> trio.SocketStream:
    """Connect to the socket at ``path``, also when its path is too long for ``sun_path``.

    A node root under a deep directory (a local run, a test's temporary
    root) puts the NRI socket past 107 bytes, which ``connect`` refuses
    ("AF_UNIX path too long"): the directory is opened instead (in a worker
    thread: no filesystem wait on the event loop) and the socket named
    through its descriptor.  A missing directory or socket is ``ENOENT``
    either way, which readiness reads as "no NRI here".
    """
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        return await trio.open_unix_socket(str(path))
    directory = await trio.to_thread.run_sync(
        os.open, path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return await trio.open_unix_socket(f"/proc/self/fd/{directory}/{path.name}")
    finally:
        os.close(directory)


async def _session(
    socket_path: Path,
    name: str,
    index: str,
    on_create: OnCreate,
    status: PluginStatus,
    registered: Callable[[], None],
) -> None:
    stream = await _open_unix(socket_path)
    async with stream, trio.open_nursery() as nursery:
        peer = _Peer(stream, on_create, status, nursery)
        nursery.start_soon(peer.read)
        status.connected = True
        await peer.call(wire.RUNTIME_SERVICE, "RegisterPlugin", wire.register_request(name, index))
        status.registrations += 1
        logger.info("NRI plugin %s-%s registered at %s", index, name, socket_path)
        registered()
        await peer.closed.wait()
        nursery.cancel_scope.cancel(reason="the runtime closed the NRI connection")


@attrs.define(eq=False)
class _Slot:
    done: trio.Event = attrs.field(factory=trio.Event)
    response: ttrpc.Response | None = None


@attrs.define(eq=False)
class _Peer:
    """One connection: the reader, the calls waiting for answers, the answers sent."""

    stream: trio.SocketStream
    on_create: OnCreate
    status: PluginStatus
    nursery: trio.Nursery
    closed: trio.Event = attrs.field(factory=trio.Event)
    _deframer: ttrpc.Deframer = attrs.field(factory=ttrpc.Deframer)
    _send_lock: trio.Lock = attrs.field(factory=trio.Lock)
    _calls: dict[int, _Slot] = attrs.field(factory=dict)
    _stream_ids: itertools.count = attrs.field(factory=lambda: itertools.count(1, 2))
    _request_timeout: float = REQUEST_TIMEOUT
    _create_log: LogLimit = attrs.field(factory=lambda: LogLimit(logger))

    async def read(self) -> None:
        while data := await self.stream.receive_some(READ_SIZE):
            for message in self._deframer.feed(data):
                self._dispatch(message)
        for slot in self._calls.values():
            if not slot.done.is_set():  # an answer that came before the end stands
                slot.response = ttrpc.Response(
                    ttrpc.UNAVAILABLE, "the runtime closed the connection", b""
                )
                slot.done.set()
        self.closed.set()

    def _dispatch(self, message: ttrpc.Message) -> None:
        if message.conn == ttrpc.PLUGIN_CONN and message.type == ttrpc.REQUEST:
            self.nursery.start_soon(self._serve, message.stream, message.body)
        elif message.conn == ttrpc.RUNTIME_CONN and message.type == ttrpc.RESPONSE:
            slot = self._calls.get(message.stream)
            if slot is None:
                raise WireError(f"an answer to stream {message.stream}, which nobody called")
            slot.response = ttrpc.decode_response(message.body)
            slot.done.set()
        else:
            raise WireError(f"ttrpc message type {message.type} on connection {message.conn}")

    async def call(self, service: str, method: str, payload: bytes) -> bytes:
        sid = next(self._stream_ids)
        slot = self._calls[sid] = _Slot()
        request = ttrpc.Request(service, method, payload, int(REGISTER_TIMEOUT * 1e9))
        try:
            await self._send(ttrpc.RUNTIME_CONN, sid, ttrpc.REQUEST, ttrpc.encode_request(request))
            with trio.fail_after(REGISTER_TIMEOUT):
                await slot.done.wait()
        except trio.TooSlowError:
            raise RegistrationError(f"{method}: no answer within {REGISTER_TIMEOUT}s") from None
        finally:
            del self._calls[sid]
        assert slot.response is not None
        if slot.response.code:
            raise RegistrationError(
                f"{method}: {slot.response.message} (code {slot.response.code})"
            )
        return slot.response.payload

    async def _serve(self, sid: int, body: bytes) -> None:
        request = ttrpc.decode_request(body)
        code, message, payload = 0, "", b""
        if request.service != wire.PLUGIN_SERVICE:
            code, message = ttrpc.UNIMPLEMENTED, f"service {request.service!r} not implemented"
        elif request.method == "Configure":
            configure = wire.decode_configure(request.payload)
            if configure.request_timeout_ms > 0:
                self._request_timeout = configure.request_timeout_ms / 1000
            self.status.configured += 1
            logger.info(
                "NRI plugin configured by %s %s (request timeout %.1fs)",
                configure.runtime,
                configure.version,
                self._request_timeout,
            )
            payload = wire.configure_response()
        elif request.method == "Synchronize":
            payload = wire.synchronize_response(request.payload)
        elif request.method == "CreateContainer":
            container = wire.decode_create_container(request.payload)
            limit = self._request_timeout
            if request.timeout_ns:
                limit = min(limit, request.timeout_ns / 1e9)
            payload = wire.create_container_response(
                await self._adjustment(container, limit * CREATE_SHARE)
            )
        elif request.method == "Shutdown":
            logger.info("NRI plugin: the runtime is shutting down")
        else:
            code, message = ttrpc.UNIMPLEMENTED, f"method {request.method!r} not implemented"
        response = ttrpc.encode_response(ttrpc.Response(code, message, payload))
        await self._send(ttrpc.PLUGIN_CONN, sid, ttrpc.RESPONSE, response)

    async def _adjustment(self, container: model.Container, deadline: float) -> model.Adjustment:
        """``on_create``'s answer, or an empty one when it fails or is late."""
        error = ""
        with trio.move_on_after(deadline) as scope:
            try:
                return await self.on_create(container)
            except Exception as exc:  # a policy bug must not block containers
                error = f"{type(exc).__name__}: {exc}"
        if scope.cancelled_caught:
            error = f"no answer within {deadline:.2f}s"
        self.status.create_failures += 1
        self.status.last_create_error = f"container {container.name} ({container.id}): {error}"
        self._create_log.warning(
            "NRI plugin: %s; the container starts unadjusted", self.status.last_create_error
        )
        return model.Adjustment()

    async def _send(self, conn: int, sid: int, type_: int, body: bytes) -> None:
        data = ttrpc.frame(conn, sid, type_, body)
        async with self._send_lock:
            await self.stream.send_all(data)
