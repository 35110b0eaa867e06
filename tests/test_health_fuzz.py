"""The health port against hostile clients: it must answer the next probe, whatever came before.

* malformed, deeply nested, huge and endless HTTP (crafted, and seeded
  mutations of good requests, sent in random pieces, many connections at
  once): the server stays up, ``/healthz`` answers afterwards, and nothing
  is logged with a traceback;
* a client that never reads: another client's probe is answered meanwhile,
  the stuck connection is closed after ``SEND_TIMEOUT``, and shutdown never
  waits for it (hypercorn shields its sends from cancellation);
* a connection flood against a real daemon whose open file limit is 256: it
  holds at most its cap of connections (its descriptors, counted in
  ``/proc``), stays up, answers afterwards and tears down cleanly;
* descriptors running out under the server (``EMFILE`` in ``accept``), in a
  child process whose limit drops after start: the server waits and
  retries, with a line or two of log, and answers once descriptors return.

The daemon's memory under a flood (RSS against its own baseline) is a figure
of ``bench/probe_flood.py``, not an assertion here: the structural bound is
the connection cap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import mokka.daemon.metrics  # noqa: F401  (imported now: not in a worker thread mid-test)
from mokka.daemon.probeserver import SEND_TIMEOUT
from mokka.noderoot.host import Host
from tests.daemon_support import PROCESS_TIMEOUT, DaemonProcess, daemon_env, stop_daemon
from tests.fakes import FakeSimulator
from tests.support import snapshot
from tests.test_health import served

SEED = 20261207
GOOD = [
    b"GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n",
    b"GET /readyz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
    b"HEAD /healthz HTTP/1.0\r\n\r\n",
    b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n",
]
HEAD = GOOD[0]
#: Inputs no client library would send.
CRAFTED = {
    "binary junk": bytes(range(256)) * 16,
    "a header line of 1 MiB": b"GET /healthz HTTP/1.1\r\nX: " + b"a" * (1 << 20) + b"\r\n\r\n",
    "100,000 headers": b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 100_000 + b"\r\n",
    "a path 100,000 levels deep": b"GET " + b"/a" * 100_000 + b" HTTP/1.1\r\n\r\n",
    "a query of 100,000 nested brackets": (
        b"GET /healthz?" + b"%5B" * 100_000 + b" HTTP/1.1\r\n\r\n"),
    "a bad chunk after a good request": (
        HEAD + b"GET /readyz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n"),
    "fifty good requests, then junk": HEAD * 50 + b"\x00junk\r\n\r\n",
    "an endless chunked body": (
        b"POST /healthz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1\r\na\r\n" * 200_000),
    "endless bytes and no line end": b"G" * (8 << 20),
    "a body far past its length": (
        b"GET /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\n" + b"x" * (1 << 20)),
    "an unfinished body": b"POST /healthz HTTP/1.1\r\nContent-Length: 1000000\r\n\r\nabc",
    "HTTP/2 prior knowledge, then junk": (
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + random.Random(SEED).randbytes(5000)),
    "an h2c upgrade, then junk": (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, "
        b"HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n" + b"junk" * 500),
    "a websocket upgrade, then junk": (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        + b"\x81\xff" + b"\xff" * 5000),
    "Expect 100-continue and no body": (
        b"GET /healthz HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"),
    "a target that is not ASCII": b"GET /\xc3\xa9\xff HTTP/1.1\r\nHost: x\r\n\r\n",
}


def mutated(rng: random.Random) -> bytes:
    """One to four good requests back to back, then a few bytes flipped, cut or inserted."""
    data = bytearray(b"".join(rng.choice(GOOD) for _ in range(rng.randint(1, 4))))
    for _ in range(rng.randint(0, 3)):
        position, choice = rng.randrange(len(data)), rng.random()
        if choice < 0.4:
            data[position] = rng.randrange(256)
        elif choice < 0.7:
            del data[position:position + rng.randint(1, 5)]
        else:
            data[position:position] = rng.randbytes(rng.randint(1, 6))
    return bytes(data)


async def hostile_client(port: int, data: bytes, rng: random.Random) -> None:
    """Send ``data`` in random pieces; then hang up, half-close, or read until the server does."""
    how, pieces = rng.randrange(3), []
    position = 0
    while position < len(data):
        size = rng.choice([1, 7, 100, 4096, 1 << 16])
        pieces.append(data[position:position + size])
        position += size
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            for piece in pieces:
                await stream.send_all(piece)
            if how == 1:
                await stream.send_eof()
            if how > 0:
                with trio.move_on_after(2):
                    while await stream.receive_some(65536):
                        pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # the server hung up first: a fine answer to junk


def problems(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Records that would be a defect: any traceback, any ERROR."""
    return [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def probe_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("mokka.daemon") and r.levelno >= logging.WARNING]


@pytest.mark.timeout(240)
async def test_malformed_deep_huge_and_endless_http_never_take_the_server_down(
    host: Host, node_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = snapshot(node_root)
    rng = random.Random(SEED)
    inputs = [*CRAFTED.values(), *(mutated(rng) for _ in range(400))]
    rng.shuffle(inputs)
    with trio.fail_after(200):
        async with served(host, [FakeSimulator("gpudriver")]) as probe:
            port = probe.client.base_url.port
            for start in range(0, len(inputs), 40):
                async with trio.open_nursery() as clients:
                    for data in inputs[start:start + 40]:
                        clients.start_soon(hostile_client, port, data, random.Random(rng.random()))
            code, body = await probe.get("/healthz")
            assert (code, body["status"]) == (200, "ok")
    # A crash of the server would have ended ``served`` with its exception.
    assert problems(caplog) == []
    assert len(probe_warnings(caplog)) <= 2, probe_warnings(caplog)
    assert snapshot(node_root) == before


async def never_reading_client(port: int) -> trio.SocketStream:
    """A connection whose receive buffer is tiny and never read: the server's answers
    to the requests sent on it soon fill every buffer on the way."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


async def send_until_hangup(stream: trio.SocketStream, data: bytes, hung_up: trio.Event) -> None:
    """Requests, again and again: once the server stops reading, this blocks until it hangs up."""
    try:
        while True:
            await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        hung_up.set()  # the server closed it: what should happen


@pytest.mark.timeout(120)
async def test_a_client_that_never_reads_holds_neither_the_probes_nor_the_shutdown(
    autojump_clock, host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    requests = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 100  # 440 kB of answers
    with trio.fail_after(600):  # virtual seconds
        async with trio.open_nursery() as senders:
            async with served(host, [FakeSimulator("gpudriver")]) as probe:
                port = probe.client.base_url.port
                stuck, hung_up = await never_reading_client(port), trio.Event()
                senders.start_soon(send_until_hangup, stuck, requests, hung_up)
                await trio.sleep(1)  # every buffer on the way is full by now
                assert not hung_up.is_set()
                assert (await probe.get("/healthz"))[0] == 200
                await trio.sleep(SEND_TIMEOUT)
                assert hung_up.is_set()
                assert probe_warnings(caplog) == [
                    f"health probes: closed a connection whose client read nothing "
                    f"for {SEND_TIMEOUT:g} s"]
                # A second one still stuck when the daemon shuts down.
                late, late_hung_up = await never_reading_client(port), trio.Event()
                senders.start_soon(send_until_hangup, late, requests, late_hung_up)
                await trio.sleep(1)
                assert not late_hung_up.is_set()
                shutdown_at = trio.current_time()
            # Shut down within the graceful second, not after the stuck send.
            assert trio.current_time() - shutdown_at < SEND_TIMEOUT
            await stuck.aclose()
            await late.aclose()
    assert problems(caplog) == []


#: A real daemon under a lowered open file limit (soft and hard: the daemon
#: raises its soft limit to the hard one at start).
_LIMITED_DAEMON = """
import resource, runpy, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
sys.argv = ["mokka", *sys.argv[1:]]
runpy.run_module("mokka", run_name="__main__", alter_sys=True)
"""


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def flood(port: int, count: int, held: list[trio.SocketStream]) -> None:
    """Up to ``count`` connections, each sending half a request and holding on.

    Connections past the server's backlog wait in the kernel's SYN retries:
    each try gives up after a second."""
    async def one() -> None:
        with trio.move_on_after(1):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            held.append(stream)
            with contextlib.suppress(trio.BrokenResourceError, OSError):
                await stream.send_all(b"GET /healthz HTTP/1.1\r\nX-Slow: ")

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)


async def get(port: int, path: str) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
    return answer


async def hang_up(held: list[trio.SocketStream]) -> None:
    """Close every connection a flood holds."""
    for stream in held:
        await stream.aclose()
    held.clear()


async def answers_after_the_flood(port: int, held: list[trio.SocketStream]) -> None:
    """Once the flood's connections are gone, a fresh probe gets a 200."""
    await hang_up(held)
    answer = await get(port, "/healthz")
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


async def end_flood(process: trio.Process, held: list[trio.SocketStream]) -> None:
    """However the test ended: the flood's connections closed, the child gone."""
    await hang_up(held)
    if process.returncode is None:
        process.kill()
        await process.wait()


@pytest.mark.timeout(180)
async def test_a_flood_to_the_fd_limit_leaves_the_daemon_up_and_capped(
    node_root: Path, tmp_path: Path
) -> None:
    before = snapshot(node_root)
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", _LIMITED_DAEMON, "--root", str(node_root),
         "--health-addr", "127.0.0.1:0", "--node-name", "flood-node"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path, env=daemon_env(),
    )
    daemon = DaemonProcess(process)
    held: list[trio.SocketStream] = []
    try:
        with trio.fail_after(PROCESS_TIMEOUT * 2):
            port = int((await daemon.wait_for_line(r"health probes on .* port=(\d+)"))[1])
            await daemon.wait_for_line(r"reconcile pass ok generation=1\b")
            baseline = open_fds(process.pid)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(daemon.drain)  # keep its log flowing
                await flood(port, 600, held)
                assert len(held) > 64  # the flood got past the cap, into the backlog
                during = open_fds(process.pid)
                assert process.returncode is None
                await answers_after_the_flood(port, held)
                nursery.cancel_scope.cancel()
            code = await stop_daemon(daemon, signal.SIGTERM)
    finally:
        await end_flood(process, held)
    log = "\n".join(daemon.lines)
    # A quarter of 256 connections at most, beside what the daemon held before
    # (and a few files a pass may have open meanwhile).
    assert during <= baseline + 64 + 16, (baseline, during)
    assert code == 0, log[-3000:]
    assert "Traceback" not in log
    assert sum("health probes:" in line for line in daemon.lines) <= 2, log[-3000:]
    assert snapshot(node_root) == before


#: Serves the probes over fakes; after start, the open file limit drops to
#: 40, so a flood makes ``accept`` fail with EMFILE.  Ends when stdin closes.
_EMFILE_SERVER = """
import logging, resource, sys, trio
from pathlib import Path
from mokka.daemon.health import DaemonView, create_app, serve_health
from mokka.daemon.reconciler import Reconciler
from mokka.noderoot.host import Host
from tests.fakes import FakeSimulator
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
async def main():
    host = Host(Path(sys.argv[1]))
    sims = [FakeSimulator("gpudriver")]
    app = create_app(DaemonView(Reconciler(host, sims), sims))
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_health(
            app, ("127.0.0.1", 0), shutdown_trigger=done.wait, task_status=task_status))
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, hard))
        print("port", port, flush=True)
        await trio.wrap_file(sys.stdin).read()
        done.set()
trio.run(main)
"""


@pytest.mark.timeout(120)
async def test_accept_waits_out_emfile_and_serves_when_descriptors_return(
    node_root: Path, tmp_path: Path
) -> None:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", _EMFILE_SERVER, str(node_root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        cwd=tmp_path, env=daemon_env(),  # the checkout first: ``tests.fakes`` too
    )
    server = DaemonProcess(process)
    held: list[trio.SocketStream] = []
    try:
        with trio.fail_after(PROCESS_TIMEOUT):
            port = int((await server.wait_for_line(r"^port (\d+)"))[1])
            await flood(port, 100, held)
            await server.wait_for_line(r"cannot accept a connection \(too many open files\)")
            assert process.returncode is None
            await answers_after_the_flood(port, held)
            await process.stdin.aclose()
            assert await process.wait() == 0
            await server.drain()
    finally:
        await end_flood(process, held)
    log = "\n".join(server.lines)
    assert "Traceback" not in log, log[-3000:]
    # Seconds of EMFILE at ten tries a second: one line, a count at most.
    assert sum("cannot accept" in line for line in server.lines) <= 2, log[-3000:]
