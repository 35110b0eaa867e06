"""The relay socket under hostile input: nothing a connection sends takes it down.

Malformed, deeply nested, non-finite, huge and endless frames, before the
hello and (from a key holder) after it; a trickle that never completes its
hello; more connections than the relay lets wait; a flood to the process's
descriptor limit (a child process with a low soft ``RLIMIT_NOFILE``); and a
peer that never reads.  Each drops its own connection, with at most one log
line per kind in ten seconds, and the relay (and the node's mock-ib behind
it) answers a peer of the fabric afterwards.  The timing tests run on the
autojump clock: the relay's deadlines are exact virtual seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from mokka.simulators.ib import lids, mad, relay, relaykeys, relaywire
from mokka.simulators.ib.relay import HELLO_TIMEOUT, MAX_UNVERIFIED, SEND_TIMEOUT
from mokka.simulators.ib.relaywire import MAGIC, NONCE_SIZE, Channel
from tests.daemon_support import daemon_env
from tests.ib_support import (
    counter_file,
    counter_reset,
    free_port,
    ib_native_fixture,  # noqa: F401  (a fixture: tests name it ib_native)
    native_env_fixture,  # noqa: F401  (a fixture: tests name it native_env)
    peer_relay,
    relay_log,
    relay_node,
    write_relay_key,
)
from tests.support import ROOT
from tests.test_ib_relay_security import HELLO_B, keyed_connection, plain_stranger, read_to_end

NAMES = ["node-a", "node-b"]
GREETING = len(MAGIC) + NONCE_SIZE


def raw_frame(channel: Channel, body: bytes, length: int | None = None) -> bytes:
    """``body`` framed and tagged as the next frame of ``channel`` (the wire
    format of ``docs/ib.md``, computed here, not by the relay's code)."""
    sequence = channel._sent  # the test speaks the protocol itself
    channel._sent += 1
    tag = hmac.new(channel.session, channel.sends + sequence.to_bytes(8, "big") + body,
                   hashlib.sha256).digest()
    return (len(body) if length is None else length).to_bytes(4, "big") + body + tag


#: Bodies a key holder could send after its hello, each a protocol error.
HOSTILE_BODIES = {
    "nested": b"[" * 60_000,
    "nested-object": b'{"a":' * 12_000,
    "infinity": b'{"t":"hello","node":"node-b","nodes":["node-a","node-b"],"guids":{"1":Infinity}}',
    "overflow": b'{"t":"hello","node":"node-b","nodes":["node-a","node-b"],"guids":{"1":1e400}}',
    "huge-int": b'{"t":"req","id":' + b"9" * 5000 + b"}",
    "not-utf8": b'{"t":"\xff\xfe"}',
    "not-an-object": b"[1,2,3]",
    "truncated": b'{"t":"req","id":1',
    "renamed": b'{"t":"hello","node":"node-a","nodes":["node-a","node-b"],"guids":{}}',
}


@pytest.mark.parametrize("where", ["before-hello", "after-hello"])
async def test_hostile_frames_drop_only_their_connection(
    tmp_path: Path, node_root: Path, native_env: Path, where: str
) -> None:
    key = write_relay_key(tmp_path)
    b_port = free_port()
    with relay_log() as log:
        async with relay_node(node_root, NAMES, key, {"node-b": b_port}) as a:
            for name, body in HOSTILE_BODIES.items():
                with trio.fail_after(20):
                    channel, _ = await keyed_connection(a.port, key)
                    async with channel.stream:
                        if where == "after-hello":
                            await channel.send(HELLO_B)
                            assert await channel.receive() == {"t": "welcome", "node": "node-a"}
                        data = (raw_frame(channel, body) if where == "after-hello"
                                else len(body).to_bytes(4, "big") + body + bytes(32))
                        with contextlib.suppress(trio.BrokenResourceError):
                            await channel.stream.send_all(data)
                        assert await read_to_end(channel.stream) == b"", name
            # Huge and impossible lengths, before anything else.
            for length in (relaywire.MAX_MESSAGE + 1, 0xFFFFFFFF):
                back = await plain_stranger(a.port, MAGIC + bytes(NONCE_SIZE)
                                            + length.to_bytes(4, "big") + b"x" * 100)
                assert len(back) == GREETING
            # Dropped with one line, then counted: not one line per frame.
            dropped = log.count("ib relay: dropped a connection from")
            assert dropped == 1, log.texts
            # mock-ib answers node-b afterwards: a Set of its counters works.
            await a.sim.change_counter(0, mad.CounterChange("symbol_error", mad.COUNTER_ADD, 3))
            async with peer_relay(NAMES, 1, key, {0: a.port}, port=b_port) as (b, received):
                await log.wait_for("ib relay: connected to node-a")
                await log.wait_for("ib relay: connected to node-b")
                assert await b.send(0, counter_reset(lids.hca_lid(0, 0), lids.hca_lid(1, 0), 1))
                with trio.fail_after(20):
                    _, answer = await received.receive()
                assert answer["t"] == "resp"
            assert counter_file(node_root, 0, "symbol_error").read_text().strip() == "0"


async def idle_connection(port: int) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    return stream


async def trickle_until_dropped(stream: trio.SocketStream, data: bytes,
                                relay_: relay.Relay) -> None:
    """``data`` one byte a second, until the relay has dropped the connection."""
    for byte in data:
        try:
            await stream.send_all(bytes([byte]))
        except trio.BrokenResourceError:
            return
        await trio.sleep(1)
        if relay_.unverified == 0:
            return
    raise AssertionError("the relay still waits for a hello after the whole trickle")


@pytest.mark.parametrize("trickle", ["silent", "slowloris", "endless-frame"])
async def test_a_connection_without_a_hello_is_dropped_at_the_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, trickle: str
) -> None:
    key = write_relay_key(tmp_path)
    with relay_log():
        async with peer_relay(NAMES, 0, key, {}, port=free_port()) as (a, _):
            stream = await idle_connection(a.port)
            async with stream:
                start = trio.current_time()
                assert len(await stream.receive_some(GREETING)) == GREETING
                with trio.fail_after(60):
                    if trickle == "silent":
                        assert await read_to_end(stream) == b""
                    else:
                        # One byte a second: a greeting, then a frame that says
                        # 64 KiB and never gets there.
                        data = MAGIC + bytes(NONCE_SIZE) + relaywire.MAX_MESSAGE.to_bytes(4, "big")
                        if trickle == "endless-frame":
                            await stream.send_all(data)
                            data = b"x" * 1000
                        await trickle_until_dropped(stream, data, a)
                assert trio.current_time() - start == pytest.approx(HELLO_TIMEOUT, abs=1)
                assert a.unverified == 0


async def test_connections_waiting_for_their_hello_are_capped(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    key = write_relay_key(tmp_path)
    with relay_log() as log:
        async with peer_relay(NAMES, 0, key, {}, port=free_port()) as (a, _):
            waiting = [await idle_connection(a.port) for _ in range(MAX_UNVERIFIED)]
            extra = [await idle_connection(a.port) for _ in range(10)]
            with trio.fail_after(HELLO_TIMEOUT / 2):
                for stream in extra:
                    # Closed at once, without even a greeting.
                    assert await read_to_end(stream) == b""
            assert a.unverified == MAX_UNVERIFIED
            assert log.count("waiting for their hello already") == 1
            with trio.fail_after(HELLO_TIMEOUT * 2):
                for stream in waiting:
                    assert len(await read_to_end(stream)) == GREETING
            assert a.unverified == 0
            for stream in waiting + extra:
                await stream.aclose()


async def test_a_peer_that_never_reads_is_dropped(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """node-b proves the key, then reads nothing: node-a's sends stop at the
    socket buffers, and after ``SEND_TIMEOUT`` node-b is down, not a backlog."""
    key = write_relay_key(tmp_path)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    b_port = listeners[0].socket.getsockname()[1]
    welcomed = trio.Event()

    async def deaf_peer() -> None:
        async with await listeners[0].accept() as stream:
            _, hello = await accept_as(stream, key, "node-b")
            assert hello["node"] == "node-a"
            welcomed.set()
            await trio.sleep_forever()  # never reads again

    with relay_log() as log:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(deaf_peer)
            async with peer_relay(NAMES, 0, key, {1: b_port}) as (a, _):
                await welcomed.wait()
                await log.wait_for("ib relay: connected to node-b")
                message = {"t": "req", "pad": "x" * 60_000}
                sent = 0
                with trio.fail_after(SEND_TIMEOUT * 4):
                    while await a.send(1, message):
                        sent += 1
                assert 0 < sent < 2000  # the kernel's buffers, not a queue of ours
                assert not a.is_live(1)
                assert log.count("node-b went away (it read nothing for 5s)") == 1
            nursery.cancel_scope.cancel()
    for listener in listeners:
        await listener.aclose()


async def accept_as(stream: trio.SocketStream, key_file: Path,
                    node: str) -> tuple[Channel, dict[str, Any]]:
    """The acceptor's side of the handshake as ``node``: its channel and the hello."""
    nonce = bytes(range(NONCE_SIZE))
    await stream.send_all(MAGIC + nonce)
    theirs = await relaywire.read_greeting(stream)
    key = relaykeys.load_keys(key_file)[0]
    channel = Channel(stream, relaywire.session_key(key, theirs, nonce), sends=relaywire.ACCEPTOR)
    hello = await channel.receive()
    assert hello is not None
    await channel.send({"t": "welcome", "node": node})
    return channel, hello


FLOOD_CHILD = textwrap.dedent("""
    import resource, sys, logging, trio
    from pathlib import Path
    from mokka.simulators.ib.relay import Relay
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]), resource.getrlimit(
        resource.RLIMIT_NOFILE)[1]))

    async def on_message(peer, message):
        pass

    async def main():
        relay = Relay(nodes=("node-a", "node-b"), me=0, addresses={},
                      listen=("127.0.0.1", int(sys.argv[2])), own_guids=dict,
                      on_message=on_message, key_file=Path(sys.argv[1]))
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            print("listening", flush=True)
            await trio.sleep(120)
            print("max rss kB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)

    trio.run(main)
""")


async def test_a_connection_flood_to_the_descriptor_limit(tmp_path: Path) -> None:
    """Past the soft descriptor limit ``accept`` fails with EMFILE: the relay
    backs off, logs it once, and a peer gets in once the flood is gone."""
    key = write_relay_key(tmp_path)
    port = free_port()
    limit = 48
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 1000
    child = await trio.lowlevel.open_process(
        [sys.executable, "-c", FLOOD_CHILD, str(key), str(port), str(limit)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=daemon_env(),
    )
    assert child.stdout is not None
    assert child.stderr is not None
    log = b""
    try:
        with trio.fail_after(60):
            assert (await child.stdout.receive_some(100)).startswith(b"listening")
            flood = [await idle_connection(port) for _ in range(limit * 3)]
            while b"Too many open files" not in log:
                chunk = await child.stderr.receive_some(65536)
                assert chunk, log.decode()
                log += chunk
            for stream in flood:
                await stream.aclose()
            with relay_log() as peer_log:
                async with peer_relay(NAMES, 1, key, {0: port}) as (b, _):
                    # Its dial waits in the listen queue while the child backs
                    # off (at most ``ACCEPT_BACKOFF[1]``, within the dial timeout).
                    await peer_log.wait_for("ib relay: connected to node-a")
                    assert b.is_live(0)
            assert child.returncode is None
    finally:
        child.kill()
        with trio.CancelScope(shield=True), trio.fail_after(20):
            await child.wait()
            while chunk := await child.stderr.receive_some(65536):
                log += chunk
    assert log.count(b"cannot accept a connection (Too many open files)") == 1, log.decode()
    assert b"Traceback" not in log
