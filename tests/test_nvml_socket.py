"""The engine config over the NVML socket: the library with no config beside it
against the daemon's server (in this process), against servers that misbehave,
and the server against clients that misbehave.

The library runs in a child process (``nvml_socket_probe.py``) loaded from a
copy with no ``config/`` beside it and no ``MOCK_NVML_CONFIG``, as in a
container whose CDI spec another tool wrote; ``MOCK_NVML_SOCKET`` points it
at the test's socket instead of ``/run/nvidia-persistenced/socket``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from mokka import layout
from mokka.noderoot.host import Host
from mokka.simulators.gpudriver import nvml_socket
from mokka.simulators.gpudriver.nvml_socket import NvmlSocketServer
from tests.nvml_support import (
    library_without_config,
    node_path,
    socket_client_env,
    state_with_overrides,
    write_config,
)
from tests.support import snapshot

PROBE = Path(__file__).resolve().parent / "nvml_socket_probe.py"
#: NVML_ERROR_DRIVER_NOT_LOADED: what nvmlInit says with no config and no server.
DRIVER_NOT_LOADED = 9
#: The library gives an exchange 0.2 s; a call that waits on one takes no more
#: than that and a parse.  The bound here leaves room for a loaded machine.
CALL_BOUND = 0.6

WORKLOAD = (
    'format: 1\ndevice_count: 1\ndevice.0.process_count: 1\n'
    'device.0.process.0.pid: 4242\ndevice.0.process.0.name: "k8s:default/pod/c"\n'
)


@attrs.define
class Probe:
    """The probe child: one command, one JSON answer."""

    process: trio.Process
    _buffer: bytes = b""

    async def ask(self, command: str) -> dict:
        await self.process.stdin.send_all(command.encode() + b"\n")
        while b"\n" not in self._buffer:
            chunk = await self.process.stdout.receive_some(4096)
            assert chunk, f"the probe died answering {command!r}"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


@asynccontextmanager
async def probe(library: Path, socket_path: Path) -> AsyncIterator[Probe]:
    process = await trio.lowlevel.open_process(
        [sys.executable, str(PROBE), str(library)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=socket_client_env(socket_path),
    )
    try:
        yield Probe(process)
    finally:
        process.kill()
        await process.wait()


async def answer_when(client: Probe, command: str, wanted: object, *, within: float) -> float:
    """Ask until the answer's value is ``wanted``; the seconds it took (fails past ``within``)."""
    started = trio.current_time()
    with trio.fail_after(within):
        # The answer is another process's: there is no event to wait on.
        while (await client.ask(command)).get("value") != wanted:  # noqa: ASYNC110
            await trio.sleep(0.01)
    return trio.current_time() - started


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A node root with the t4 engine config staged."""
    root = tmp_path / "node"
    write_config(root, state_with_overrides("t4", tmp_path))
    return root


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: ``sun_path`` holds 108 bytes, and a test
    root's socket is deeper, so clients connect through a link here."""
    directory = Path(tempfile.mkdtemp(prefix="nvs", dir="/tmp"))
    yield directory
    shutil.rmtree(directory)


def link_to(short_dir: Path, target: Path) -> Path:
    """``short_dir/socket`` pointing at ``target`` (replaced if there)."""
    link = short_dir / "socket"
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    return link


@asynccontextmanager
async def serving(root: Path) -> AsyncIterator[NvmlSocketServer]:
    """The daemon's server on ``root`` in this process; stopped on the way out."""
    server = NvmlSocketServer(Host(root))
    async with trio.open_nursery() as nursery:
        path = await nursery.start(server.serve)
        assert path == node_path(root, nvml_socket.SOCKET)
        yield server
        nursery.cancel_scope.cancel()


async def test_library_reads_the_config_and_its_changes_over_the_socket(
    node: Path, tmp_path: Path, short_dir: Path
) -> None:
    before = snapshot(node)
    library = library_without_config(tmp_path / "container")
    socket_path = link_to(short_dir, node_path(node, nvml_socket.SOCKET))
    with trio.fail_after(60):
        async with probe(library, socket_path) as client:
            async with serving(node):
                assert (await client.ask("init"))["rc"] == 0
                assert (await client.ask("count"))["value"] == 1
                uuid = (await client.ask("uuid 0"))["value"]
                assert uuid == state_with_overrides("t4", tmp_path).gpus[0].uuid
                assert (await client.ask("temp 0"))["value"] != 77
                assert (await client.ask("holders 0"))["value"] == 0

                # What `mokka ctl temp` makes the daemon stage: a new config by rename.
                write_config(node, state_with_overrides(
                    "t4", tmp_path, ["temp", "--gpu", "0", "--celsius", "77"]))
                assert await answer_when(client, "temp 0", 77, within=1.0) < 1.0
                # The workload file comes in the same answer.
                node_path(node, layout.WORKLOAD_CONFIG).write_text(WORKLOAD)
                await answer_when(client, "holders 0", 1, within=1.0)

            # The server stopped: its socket, the directories made for it and
            # its record are gone; nothing else changed but the two files.
            after = snapshot(node)
            config_dir = layout.CONFIG_DIR.lstrip("/")
            changed = {f"{config_dir}/config.yaml", f"{config_dir}/workload.yaml"}
            assert {k: v for k, v in after.items() if k not in changed} == {
                k: v for k, v in before.items() if k not in changed}
            # The last good values stay, and no call waits on the missing server.
            started = trio.current_time()
            while trio.current_time() - started < 1.0:
                reply = await client.ask("temp 0")
                assert (reply["rc"], reply["value"]) == (0, 77)
                assert reply["seconds"] < CALL_BOUND
                await trio.sleep(0.02)
        # A fresh process finds no config and no server: no driver, at once.
        async with probe(library, socket_path) as fresh:
            reply = await fresh.ask("init")
        assert reply["rc"] == DRIVER_NOT_LOADED
        assert reply["seconds"] < CALL_BOUND


# ------------------------------------------------------------ hostile servers


async def _silent(conn: trio.SocketStream) -> None:
    await trio.sleep_forever()


async def _garbage(conn: trio.SocketStream) -> None:
    await conn.send_all(b"\x00\xff\xfe not this protocol\n" * 100)


async def _huge(conn: trio.SocketStream) -> None:
    await conn.send_all(b"MOKKA-NVML 1 OK abcd 99999999999999 0\n")
    await trio.sleep_forever()


async def _short(conn: trio.SocketStream) -> None:
    await conn.send_all(b"MOKKA-NVML 1 OK abcd 100000 0\nformat: 1\n")


async def _endless(conn: trio.SocketStream) -> None:
    while True:
        await conn.send_all(b"A" * 65536)


async def _drip(conn: trio.SocketStream) -> None:
    for byte in b"MOKKA-NVML 1 OK abcd 20 0\nformat: 1\ndevice_count: 0\n":
        await conn.send_all(bytes([byte]))
        await trio.sleep(0.05)


async def _broken_config(conn: trio.SocketStream) -> None:
    body = b"format: 1\ndevice_count: 0\nno colon here\n"
    await conn.send_all(b"MOKKA-NVML 1 OK abcd %d 0\n%s" % (len(body), body))


HOSTILE: dict[str, Callable[[trio.SocketStream], Awaitable[None]]] = {
    "silent": _silent, "garbage": _garbage, "huge": _huge, "short": _short,
    "endless": _endless, "drip": _drip, "broken-config": _broken_config,
}


@asynccontextmanager
async def hostile_server(path: Path, behaviour: str) -> AsyncIterator[list[int]]:
    """A server at ``path`` that answers every connection with ``behaviour``;
    yields a list that counts the connections."""
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(str(path))
    listener.listen(16)
    connections: list[int] = []

    async def handle(conn: trio.SocketStream) -> None:
        connections.append(1)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async with conn:
                await conn.receive_some(128)
                await HOSTILE[behaviour](conn)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, [trio.SocketListener(listener)])
        yield connections
        nursery.cancel_scope.cancel()
    os.unlink(path)


@pytest.mark.parametrize("behaviour", sorted(HOSTILE))
async def test_a_hostile_server_costs_no_crash_no_hang_and_no_values(
    node: Path, tmp_path: Path, short_dir: Path, behaviour: str
) -> None:
    library = library_without_config(tmp_path / "container")
    socket_path = link_to(short_dir, node_path(node, nvml_socket.SOCKET))
    with trio.fail_after(60):
        async with probe(library, socket_path) as client:
            async with serving(node):
                assert (await client.ask("init"))["rc"] == 0
                good = (await client.ask("temp 0"))["value"]
            hostile_path = short_dir / "hostile"
            link_to(short_dir, hostile_path)
            async with hostile_server(hostile_path, behaviour) as connections:
                # A process already running keeps its last good config: a
                # second of calls, several schedule ticks, none held up.
                started = trio.current_time()
                while trio.current_time() - started < 1.0 or not connections:
                    reply = await client.ask("temp 0")
                    assert (reply["rc"], reply["value"]) == (0, good), reply
                    assert reply["seconds"] < CALL_BOUND, reply
                    await trio.sleep(0.02)
                # A new process gets no config from it: no driver, in bounded time.
                async with probe(library, socket_path) as fresh:
                    reply = await fresh.ask("init")
                assert reply["rc"] == DRIVER_NOT_LOADED, reply
                assert reply["seconds"] < CALL_BOUND, reply


# ------------------------------------------------------------ hostile clients


async def test_the_server_outlasts_hostile_clients(
    node: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A config of 4 MiB (comments pad it): an answer no socket buffer holds,
    # so a client that never reads holds the server's send until the deadline.
    config = node_path(node, layout.ENGINE_CONFIG)
    config.write_bytes(config.read_bytes() + b"# padding\n" * (400 << 10))
    monkeypatch.setattr(nvml_socket, "DEADLINE", 0.5)
    caplog.set_level(logging.WARNING, logger=nvml_socket.__name__)
    path = node_path(node, nvml_socket.SOCKET)
    held: list[trio.socket.SocketType] = []

    async def connect() -> trio.socket.SocketType:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(f"/proc/self/fd/{dirfd}/{path.name}")
        return sock

    async def exchange(request: bytes) -> bytes:
        sock = await connect()
        with sock:
            with contextlib.suppress(OSError):
                await sock.send(request)
            data = b""
            # A request over the bound is answered and closed with bytes
            # unread, which the kernel turns into a reset: the answer may be lost.
            with contextlib.suppress(ConnectionResetError):
                while chunk := await sock.recv(1 << 20):
                    data += chunk
            return data

    with trio.fail_after(60):
        async with serving(node) as server:
            dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
            try:
                # Malformed lines: an error each.  A request far over the
                # line's bound: an error, or a reset when it came unread.
                error = b"MOKKA-NVML 1 ERROR malformed request\n"
                for junk in (b"GET\n", b"MOKKA-NVML 2 GET -\n", b"MOKKA-NVML 1 GET xyz\n",
                             b"MOKKA-NVML 1 GET " + b"a" * 33 + b"\n", b"\n"):
                    for _ in range(20):
                        assert await exchange(junk) == error
                for _ in range(20):
                    assert await exchange(b"\xff" * 200_000) in (error, b"")
                # One that never finishes its line, one that never reads.
                held.append(await connect())
                await held[-1].send(b"MOKKA-NV")
                held.append(await connect())
                await held[-1].send(b"MOKKA-NVML 1 GET -\n")
                # A flood: the cap is served, the rest closed at once.
                for _ in range(nvml_socket.MAX_CONNECTIONS + 50):
                    held.append(await connect())
                await trio.sleep(0.1)
                assert server.connections <= nvml_socket.MAX_CONNECTIONS
                # Past the deadline every held connection is dropped, and a
                # well-behaved client is served the file as it is on disk.
                with trio.fail_after(5):
                    while server.connections:  # noqa: ASYNC110 (a count, not an event)
                        await trio.sleep(0.05)
                for sock in held:
                    sock.close()
                reply = await exchange(b"MOKKA-NVML 1 GET -\n")
                header, body = reply.split(b"\n", 1)
                word, token, config_len, workload_len = header.split()[2:]
                size = config.stat().st_size
                assert (word, int(config_len), int(workload_len)) == (b"OK", size, 0)
                assert body == config.read_bytes()
                again = await exchange(b"MOKKA-NVML 1 GET " + token + b"\n")
                assert again == b"MOKKA-NVML 1 UNCHANGED " + token + b"\n"
            finally:
                os.close(dirfd)
    # Hundreds of bad events, a few lines: the first of each kind, then counts.
    warnings = [r for r in caplog.records if r.name == nvml_socket.__name__]
    assert 3 <= len(warnings) <= 8, [r.getMessage() for r in warnings]
