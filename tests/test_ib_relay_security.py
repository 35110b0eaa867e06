"""Who the relay takes as a peer: only fabric nodes that prove the shared key.

A node's mock-ib runs in this process with its relay on loopback; the
other nodes are bare relays of the test (``ib_support.peer_relay``) or
strangers speaking raw TCP: the relay as it was (length and JSON, no key),
the protocol under a wrong key, the right key under a name outside the
fabric, frames replayed on the same or another connection.  None of them
changes a counter on disk; a key holder of the fabric does.  A stranger at
a down peer's address gets no MAD to answer (``perfquery`` times out rather
than print its value), and an answer from a peer other than the one a
request went to is dropped.  The daemon refuses a relay without a usable
key in one line that never shows the key.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from mokka.errors import SpecError
from mokka.simulators.ib import lids, mad, smp
from mokka.simulators.ib.relay import Relay
from mokka.simulators.ib.relaykeys import load_keys
from mokka.simulators.ib.relaywire import (
    DIALLER,
    MAGIC,
    NONCE_SIZE,
    Channel,
    read_greeting,
    session_key,
)
from tests.daemon_support import daemon_env
from tests.ib_support import (
    counter_file,
    counter_reset,
    free_port,
    ib_native_fixture,  # noqa: F401  (a fixture: tests name it ib_native)
    ib_tool,
    native_env_fixture,  # noqa: F401  (a fixture: tests name it native_env)
    peer_relay,
    plain_frame,
    relay_log,
    relay_node,
    write_relay_key,
)

NAMES = ["node-a", "node-b"]
HELLO_B = {"t": "hello", "node": "node-b", "nodes": NAMES, "guids": {}}
#: What a forged PortCounters answer says (a real counter never gets there here).
FORGED = 4242


async def read_to_end(stream: trio.SocketStream) -> bytes:
    """Everything the relay sends until it closes (a reset counts as the close)."""
    received = bytearray()
    with contextlib.suppress(trio.BrokenResourceError):
        while chunk := await stream.receive_some(65536):
            received += chunk
    return bytes(received)


async def plain_stranger(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; all the relay sends back until it closes."""
    with trio.fail_after(20):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(data)
            return await read_to_end(stream)


async def keyed_connection(port: int, key_file: Path) -> tuple[Channel, bytes]:
    """A dialler's side of the handshake under ``key_file``'s key: the channel
    and the greeting sent (the hello is the caller's)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    greeting = MAGIC + os.urandom(NONCE_SIZE)
    await stream.send_all(greeting)
    theirs = await read_greeting(stream)
    key = load_keys(key_file)[0]
    return Channel(stream, session_key(key, greeting[len(MAGIC):], theirs), sends=DIALLER), greeting


async def keyed_stranger(port: int, key_file: Path, *messages: dict[str, Any]) -> bytes:
    """Messages sent as frames under ``key_file``'s key; what comes back after
    the greeting, until the relay closes."""
    with trio.fail_after(20):
        channel, _ = await keyed_connection(port, key_file)
        async with channel.stream:
            with contextlib.suppress(trio.BrokenResourceError):
                for message in messages:
                    await channel.send(message)
            return await read_to_end(channel.stream)


def resp_to(message: dict[str, Any], answer: bytes) -> dict[str, Any]:
    return {"t": "resp", "id": message["id"], "lid": message["dlid"], "mad": answer.hex()}


def counters_answer(request_hex: str, symbol_error: int) -> bytes:
    request = bytes.fromhex(request_hex)
    return mad.response(request, data=smp.port_counters(1, {"symbol_error": symbol_error}))


async def test_only_a_key_holder_of_the_fabric_changes_a_counter(
    tmp_path: Path, node_root: Path, native_env: Path
) -> None:
    key = write_relay_key(tmp_path)
    wrong = write_relay_key(tmp_path, "wrong.key")
    b_port = free_port()
    reset = counter_reset(dlid=lids.hca_lid(0, 0), slid=lids.hca_lid(1, 0), origin=1)
    with relay_log() as log:
        async with relay_node(node_root, NAMES, key, {"node-b": b_port}) as a:
            await a.sim.change_counter(0, mad.CounterChange("symbol_error", mad.COUNTER_ADD, 7))
            counter = counter_file(node_root, 0, "symbol_error")
            assert counter.read_text().strip() == "7"

            # The relay as it was: a hello and a Set of every counter, no key.
            back = await plain_stranger(a.port, plain_frame(HELLO_B) + plain_frame(reset))
            assert back[: len(MAGIC)] == MAGIC
            assert len(back) == len(MAGIC) + NONCE_SIZE
            # The protocol under another key; the key under a name not in the fabric.
            assert await keyed_stranger(a.port, wrong, HELLO_B, reset) == b""
            stranger = {**HELLO_B, "node": "node-z"}
            assert await keyed_stranger(a.port, key, stranger, reset) == b""
            assert counter.read_text().strip() == "7"
            assert not a.sim.readiness.reason.endswith("1/1 peer(s) live")

            # The same Set from node-b holding the key clears the counter.
            async with peer_relay(NAMES, 1, key, {0: a.port}, port=b_port) as (b, received):
                await log.wait_for("ib relay: connected to node-a")
                await log.wait_for("ib relay: connected to node-b")
                assert await b.send(0, reset)
                with trio.fail_after(20):
                    peer, answer = await received.receive()
                assert (peer, answer["t"], answer["id"]) == (0, "resp", 1)
                assert counter.read_text().strip() == "0"
                assert a.sim.readiness.reason.endswith("1/1 peer(s) live")
    key_text = key.read_text().strip()
    assert not [line for line in log.texts if key_text in line]


async def test_frames_cannot_be_replayed(tmp_path: Path, node_root: Path, native_env: Path) -> None:
    """A frame recorded on one connection fails on another, and a frame sent
    twice on one connection fails the second time."""
    key = write_relay_key(tmp_path)
    reset = counter_reset(dlid=lids.hca_lid(0, 0), slid=lids.hca_lid(1, 0), origin=1)
    with relay_log() as log:
        async with relay_node(node_root, NAMES, key, {"node-b": free_port()}) as a:
            await a.sim.change_counter(0, mad.CounterChange("symbol_error", mad.COUNTER_ADD, 7))
            counter = counter_file(node_root, 0, "symbol_error")
            with trio.fail_after(20):
                channel, greeting = await keyed_connection(a.port, key)
                async with channel.stream:
                    recorded = bytearray()
                    real_send = channel.stream.send_all

                    async def recording_send(data: bytes) -> None:
                        recorded.extend(data)
                        await real_send(data)

                    channel.stream.send_all = recording_send  # type: ignore[method-assign]
                    await channel.send(HELLO_B)
                    hello_frame = bytes(recorded)
                    welcome = await channel.receive()
                    assert welcome == {"t": "welcome", "node": "node-a"}
                    # The hello again, on the same connection: the wrong sequence.
                    await real_send(hello_frame)
                    assert await read_to_end(channel.stream) == b""
            assert log.count("failed authentication") == 1
            # The greeting and hello of that connection, replayed on a new one.
            back = await plain_stranger(a.port, greeting + hello_frame + plain_frame(reset))
            assert len(back) == len(MAGIC) + NONCE_SIZE
            assert counter.read_text().strip() == "7"


async def plain_impostor(port: int, a_port: int, *,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """At node-b's address: takes node-a's dial, says hello to node-a as node-b
    in plain JSON, and answers every request with a forged counter."""

    async def serve(stream: trio.SocketStream) -> None:
        async with stream, await trio.open_tcp_stream("127.0.0.1", a_port) as back:
            await back.send_all(plain_frame(HELLO_B))
            while head := await stream.receive_some(4):
                size = int.from_bytes(head.ljust(4, b"\0"), "big")
                if size > 65536:
                    return  # not the relay it knows how to fool
                body = bytearray()
                while len(body) < size and (chunk := await stream.receive_some(size - len(body))):
                    body += chunk
                message = json.loads(body)
                if message.get("t") == "req":
                    await back.send_all(plain_frame(resp_to(
                        message, counters_answer(message["mad"], FORGED))))

    await trio.serve_tcp(serve, port, host="127.0.0.1", task_status=task_status)


@pytest.mark.parametrize("kind", ["plain", "wrong-key"])
async def test_a_stranger_at_a_down_peers_address_answers_nothing(
    tmp_path: Path, node_root: Path, native_env: Path, kind: str
) -> None:
    """node-b is down and a stranger listens at its address (speaking the relay
    as it was, or the protocol under another key), answering every request
    with a forged counter: node-a never takes it as node-b, and perfquery
    times out instead of printing the forged value."""
    key = write_relay_key(tmp_path)
    wrong = write_relay_key(tmp_path, "wrong.key")
    a_port, b_port = free_port(), free_port()

    async def forging(received: trio.MemoryReceiveChannel[Any], relay: Relay) -> None:
        async for _, message in received:
            await relay.send(0, resp_to(message, counters_answer(message["mad"], FORGED)))

    with relay_log() as log:
        async with contextlib.AsyncExitStack() as stack:
            nursery = await stack.enter_async_context(trio.open_nursery())
            # The stranger listens first: node-a dials node-b's address as it starts.
            if kind == "plain":
                await nursery.start(plain_impostor, b_port, a_port)
            else:
                b, got = await stack.enter_async_context(
                    peer_relay(NAMES, 1, wrong, {0: a_port}, port=b_port))
                nursery.start_soon(forging, got, b)
            async with relay_node(node_root, NAMES, key, {"node-b": b_port},
                                  port=a_port) as a:
                # node-a's dial there failed (refused, or reset by the stranger).
                await log.wait_for(f"node-b at 127.0.0.1:{b_port} ")
                done = await ib_tool(node_root, "perfquery", "-t", "300",
                                     str(lids.hca_lid(1, 0)), "1")
                output = done.stdout.decode() + done.stderr.decode()
                assert done.returncode != 0, output
                assert str(FORGED) not in output
                assert "SymbolErrorCounter" not in output
                assert a.sim.readiness.reason.endswith("0/1 peer(s) live")
            nursery.cancel_scope.cancel()


async def test_an_answer_from_another_peer_than_the_one_asked_is_dropped(
    tmp_path: Path, node_root: Path, native_env: Path
) -> None:
    names = ["node-a", "node-b", "node-c"]
    key = write_relay_key(tmp_path)
    a_port, b_port, c_port = free_port(), free_port(), free_port()
    with relay_log() as log:
        async with (
            peer_relay(names, 1, key, {0: a_port}, port=b_port) as (b, to_b),
            peer_relay(names, 2, key, {0: a_port}, port=c_port) as (c, _),
            relay_node(node_root, names, key, {"node-b": b_port, "node-c": c_port},
                       port=a_port) as a,
        ):
            await log.wait_for("ib relay: connected to node-a", times=2)
            await log.wait_for("ib relay: connected to node-b")
            await log.wait_for("ib relay: connected to node-c")

            async def answer_as_b() -> None:
                async for _, message in to_b:
                    request = bytes.fromhex(message["mad"])
                    if mad.attr_id(request) != smp.ATTR_PORT_COUNTERS:
                        await b.send(0, resp_to(message, mad.response(
                            request, data=smp.perf_class_port_info())))
                        continue
                    # node-c answers node-b's request first, with its own value.
                    assert await c.send(0, resp_to(message, counters_answer(message["mad"],
                                                                            FORGED)))
                    await log.wait_for("dropped an answer from node-c to request")
                    await b.send(0, resp_to(message, counters_answer(message["mad"], 77)))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer_as_b)
                done = await ib_tool(node_root, "perfquery", "-t", "5000",
                                     str(lids.hca_lid(1, 0)), "1")
                nursery.cancel_scope.cancel()
            output = done.stdout.decode()
            assert done.returncode == 0, output + done.stderr.decode()
            assert re.search(r"^SymbolErrorCounter:\.+77$", output, re.M), output
            assert str(FORGED) not in output
            assert a.sim.readiness.reason.endswith("2/2 peer(s) live")


def test_the_key_file_is_required_and_checked(tmp_path: Path) -> None:
    """Each refusal is one line naming the flag, the file and what was expected."""
    with pytest.raises(SpecError, match=r"--ib-relay-key-file: not given, expected 1 to 4"):
        load_keys(None)
    cases = {
        "missing": (tmp_path / "missing", r"cannot open it \(No such file or directory\)"),
        "short": (tmp_path / "short", r"1 key\(s\) of 31 bytes"),
        "empty": (tmp_path / "empty", r"0 key\(s\) of no bytes"),
        "directory": (tmp_path / "dir", r"not a regular file"),
        "fifo": (tmp_path / "fifo", r"not a regular file"),
        "five": (tmp_path / "five", r"5 key\(s\) of 32, 32, 32, 32, 32 bytes"),
    }
    (tmp_path / "short").write_text("k" * 31 + "\n")
    (tmp_path / "empty").write_text("\n\n")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")  # opened without blocking: no writer needed
    (tmp_path / "five").write_text("\n".join(["k" * 32] * 5))
    for path, reason in cases.values():
        with pytest.raises(SpecError, match=reason) as caught:
            load_keys(path)
        assert str(caught.value).startswith(f"--ib-relay-key-file: {path}: ")
        assert "\n" not in str(caught.value)
    secret = "s3cr3t-" * 4
    (tmp_path / "short").write_text(secret)  # 28 bytes: refused, and never shown
    with pytest.raises(SpecError) as caught:
        load_keys(tmp_path / "short")
    assert secret not in str(caught.value)
    # Rotation: two keys, the first signs.
    (tmp_path / "two").write_text("n" * 40 + "\n" + "o" * 32 + "\n")
    assert load_keys(tmp_path / "two") == (b"n" * 40, b"o" * 32)


def test_the_daemon_refuses_a_relay_port_without_a_key_file(tmp_path: Path) -> None:
    root = tmp_path / "node"
    done = subprocess.run(
        [sys.executable, "-m", "mokka", "daemon", "--root", str(root), "--ib-relay-port",
         "18515"], capture_output=True, text=True, timeout=60, check=False, env=daemon_env(),
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--ib-relay-port 18515: the relay needs --ib-relay-key-file" in lines[0]
    assert not root.exists()


async def test_a_relay_with_a_bad_key_does_not_start(tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_text("too short\n")
    port = free_port()
    relay = Relay(nodes=tuple(NAMES), me=0, addresses={}, listen=("127.0.0.1", port),
                  own_guids=dict, on_message=None, key_file=short)  # type: ignore[arg-type]
    with trio.fail_after(20), pytest.raises(
        SpecError, match=rf"^--ib-relay-key-file: {short}: 1 key\(s\) of 9 bytes, expected"
    ):
        await relay.run()
    # The port it had bound for the moment is free again.
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


async def test_a_rotated_key_is_accepted_alongside_the_old_one(tmp_path: Path) -> None:
    """Mid-rotation: node-a holds the new key and the old, node-b the old one only;
    node-b's dial is welcomed under the old key, node-a's own dial (signed with
    the new key) is refused by node-b."""
    old = write_relay_key(tmp_path, "old.key")
    both = tmp_path / "both.key"
    both.write_text(write_relay_key(tmp_path, "new.key").read_text() + old.read_text())
    a_port, b_port = free_port(), free_port()
    with relay_log() as log, trio.fail_after(20):
        async with (
            peer_relay(NAMES, 0, both, {1: b_port}, port=a_port) as (a, _),
            peer_relay(NAMES, 1, old, {0: a_port}, port=b_port) as (b, _),
        ):
            await log.wait_for("ib relay: connected to node-a")
            await log.wait_for(f"node-b at 127.0.0.1:{b_port} is not taken as a peer")
            assert b.is_live(0)
            assert not a.is_live(1)
