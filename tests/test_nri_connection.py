"""``run_plugin`` against a scripted runtime on a real Unix socket.

The runtime side here is the test's: it reads the plugin's frames with the
same deframer and answers or misbehaves as each test says, so the paths a
real containerd never takes (a refused registration, junk on the wire, an
unknown method) are covered; ``tests/test_nri_containerd.py`` covers the
real one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import attrs
import pytest
import trio

from mokka.simulators.nri import model, ttrpc, wire
from mokka.simulators.nri.connection import PluginStatus, run_plugin

pytestmark = pytest.mark.timeout(60)


@attrs.define(eq=False)
class RuntimeEnd:
    """One accepted connection, as the runtime sees it."""

    stream: trio.SocketStream
    _deframer: ttrpc.Deframer = attrs.field(factory=ttrpc.Deframer)
    _queue: list[ttrpc.Message] = attrs.field(factory=list)

    async def receive(self) -> ttrpc.Message | None:
        while not self._queue:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self._queue += self._deframer.feed(data)
        return self._queue.pop(0)

    async def accept_registration(self, code: int = 0) -> ttrpc.Request:
        message = await self.receive()
        assert message is not None
        assert (message.conn, message.type) == (ttrpc.RUNTIME_CONN, ttrpc.REQUEST)
        request = ttrpc.decode_request(message.body)
        response = ttrpc.encode_response(ttrpc.Response(code, "refused" if code else "", b""))
        await self.stream.send_all(
            ttrpc.frame(ttrpc.RUNTIME_CONN, message.stream, ttrpc.RESPONSE, response)
        )
        return request

    async def call(self, method: str, payload: bytes, sid: int = 1) -> ttrpc.Response:
        request = ttrpc.encode_request(ttrpc.Request(wire.PLUGIN_SERVICE, method, payload))
        await self.stream.send_all(ttrpc.frame(ttrpc.PLUGIN_CONN, sid, ttrpc.REQUEST, request))
        message = await self.receive()
        assert message is not None
        assert (message.conn, message.stream, message.type) == (
            ttrpc.PLUGIN_CONN, sid, ttrpc.RESPONSE,
        )
        return ttrpc.decode_response(message.body)


Script = Callable[[RuntimeEnd], Awaitable[None]]


@attrs.define(eq=False)
class Runtime:
    """A listening socket that runs ``script`` on each connection in turn."""

    path: Path
    scripts: list[Script]
    connections: int = 0


async def serve(runtime: Runtime, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    # Through the directory's descriptor: a path past sun_path's 108 bytes binds too.
    directory = os.open(runtime.path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        await sock.bind(f"/proc/self/fd/{directory}/{runtime.path.name}")
    finally:
        os.close(directory)
    sock.listen()
    listener = trio.SocketListener(sock)
    task_status.started()
    async with listener:
        while True:
            stream = await listener.accept()
            script = runtime.scripts[min(runtime.connections, len(runtime.scripts) - 1)]
            runtime.connections += 1
            async with stream:
                await script(RuntimeEnd(stream))


async def no_adjustment(container: model.Container) -> model.Adjustment:
    return model.Adjustment(env=("SEEN=" + container.name,))


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as nursery:
        yield nursery
        nursery.cancel_scope.cancel()


async def start(nursery: trio.Nursery, tmp_path: Path, *scripts: Script) -> tuple[
    Runtime, PluginStatus
]:
    runtime = Runtime(tmp_path / "nri.sock", list(scripts))
    await nursery.start(serve, runtime)
    status = await nursery.start(run_plugin, runtime.path, "mokka", "10", no_adjustment)
    return runtime, status


async def test_registers_and_answers_unknown_methods_with_an_error(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    done = trio.Event()
    answers: dict[str, ttrpc.Response] = {}

    async def script(end: RuntimeEnd) -> None:
        request = await end.accept_registration()
        assert (request.service, request.method) == (wire.RUNTIME_SERVICE, "RegisterPlugin")
        assert request.payload == wire.register_request("mokka", "10")
        answers["Configure"] = await end.call("Configure", b"\x28\xe8\x07")
        answers["StateChange"] = await end.call("StateChange", b"", sid=3)
        create = ttrpc.encode_request(
            ttrpc.Request("some.other.Service", "CreateContainer", b"")
        )
        await end.stream.send_all(ttrpc.frame(ttrpc.PLUGIN_CONN, 5, ttrpc.REQUEST, create))
        message = await end.receive()
        assert message is not None
        answers["other service"] = ttrpc.decode_response(message.body)
        # An empty request: a container with no name, handed to on_create all the same.
        answers["CreateContainer"] = await end.call("CreateContainer", b"", sid=7)
        done.set()
        await trio.sleep_forever()

    with trio.fail_after(10):
        _, status = await start(nursery, tmp_path, script)
        await done.wait()
    assert status.registrations == 1
    assert status.configured == 1
    assert answers["Configure"] == ttrpc.Response(0, "", wire.configure_response())
    assert answers["StateChange"].code == ttrpc.UNIMPLEMENTED
    assert answers["other service"].code == ttrpc.UNIMPLEMENTED
    assert answers["CreateContainer"] == ttrpc.Response(
        0, "", wire.create_container_response(model.Adjustment(env=("SEEN=",)))
    )


async def test_junk_drops_the_connection_with_one_line_and_it_comes_back(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registered = trio.Event()

    async def junk(end: RuntimeEnd) -> None:
        await end.accept_registration()
        await end.stream.send_all(b"\0\0\0\x01\xff\xff\xff\xff")
        assert await end.receive() is None  # the plugin hung up

    async def good(end: RuntimeEnd) -> None:
        await end.accept_registration()
        registered.set()
        await trio.sleep_forever()

    caplog.set_level(logging.WARNING, "mokka.simulators.nri.connection")
    with trio.fail_after(20):
        runtime, status = await start(nursery, tmp_path, junk, junk, junk, good)
        await registered.wait()
    assert runtime.connections == 4
    assert "chunk exceeds" in status.last_error
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "chunk exceeds" in lines[0]


async def test_a_refused_registration_is_tried_again(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    registered = trio.Event()

    async def refuse(end: RuntimeEnd) -> None:
        await end.accept_registration(code=3)

    async def good(end: RuntimeEnd) -> None:
        await end.accept_registration()
        registered.set()
        await trio.sleep_forever()

    with trio.fail_after(20):
        runtime, status = await start(nursery, tmp_path, refuse, good)
        await registered.wait()
    assert runtime.connections == 2
    assert "refused (code 3)" in status.last_error


async def test_cancellation_closes_the_connection(tmp_path: Path) -> None:
    closed = trio.Event()

    async def script(end: RuntimeEnd) -> None:
        await end.accept_registration()
        assert await end.receive() is None
        closed.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            runtime = Runtime(tmp_path / "nri.sock", [script])
            await nursery.start(serve, runtime)
            async with trio.open_nursery() as plugin:
                status = await plugin.start(
                    run_plugin, runtime.path, "mokka", "10", no_adjustment
                )
                assert status.registrations == 1
                plugin.cancel_scope.cancel()
            await closed.wait()
            nursery.cancel_scope.cancel()


async def test_a_socket_path_longer_than_sun_path_is_reached(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """A node root under a deep directory puts the NRI socket past 107 bytes,
    which ``connect`` refuses by name ("AF_UNIX path too long")."""
    deep = tmp_path.joinpath(*["d" * 40] * 4)
    deep.mkdir(parents=True)
    registered = trio.Event()

    async def script(end: RuntimeEnd) -> None:
        await end.accept_registration()
        registered.set()
        await trio.sleep_forever()

    runtime = Runtime(deep / "nri.sock", [script])
    assert len(os.fsencode(runtime.path)) > 108
    with trio.fail_after(10):
        await nursery.start(serve, runtime)
        status = await nursery.start(run_plugin, runtime.path, "mokka", "10", no_adjustment)
        await registered.wait()
    assert status.registrations == 1
