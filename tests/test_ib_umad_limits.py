"""The umad socket under hostile tools: every amount it holds is bounded.

A ``MadService`` serves a socket in ``tmp_path`` for the fabric model of
``test_ib_mad``; raw ``SOCK_SEQPACKET`` clients play the tools: malformed,
huge and endless frames, 50,000 requests with the longest timeout there is,
a flood of agents and of connections, a tool that never reads its answers,
counter changes past a counter's width.  After each, a well-behaved client
still gets its answer, the service's own tables (pending requests,
connections) are within their bounds, and the log has a line or two, not
one per frame.  Timing runs on the ``autojump_clock`` (with no worker
thread in flight: the clock would jump past it), the rest on the real one.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from mokka.loglimit import LogLimit
from mokka.noderoot.host import Host
from mokka.simulators.ib import mad, pending, smp, umadsocket
from mokka.simulators.ib.counters import change_counters
from mokka.simulators.ib.fabric import SPINE, Walked
from mokka.simulators.ib.service import MadService
from mokka.simulators.ib.sysfs import COUNTERS, hca_artifacts
from tests.ib_support import (
    discard_with_pcibus,
    ib_native_fixture,  # noqa: F401  (a fixture: tests name it ib_native)
    native_env_fixture,  # noqa: F401  (a fixture: tests name it native_env)
    stage_with_pcibus,
    state_of,
)
from tests.mad_requests import smp_get
from tests.support import snapshot
from tests.test_ib_mad import IB, model

#: Bound on each test's own work (virtual time runs on the autojump clock).
LIMIT = 60
pytestmark = pytest.mark.timeout(120)
#: The longest timeout and retry count a umad header can carry.
U32_MAX = 2**32 - 1
#: An answerless LID: no entity of the fabric has it, so a request waits.
NOBODY = 77


@asynccontextmanager
async def serving(tmp_path: Path, **kwargs) -> AsyncIterator[MadService]:
    """A service on ``tmp_path/umad.sock`` until the body ends."""
    svc = MadService(fabric=model(live=set()), **kwargs)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.serve, tmp_path / "umad.sock")
        yield svc
        nursery.cancel_scope.cancel()


async def connect(tmp_path: Path, index: int | None = 0) -> trio.socket.SocketType:
    """A tool's connection, HELLO'd to umad ``index`` (``None``: no HELLO)."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    await sock.connect(str(tmp_path / "umad.sock"))
    if index is not None:
        await sock.send(mad.control_frame(mad.CTL_HELLO, index))
        assert mad.parse_reply(await sock.recv(64)) == (mad.CTL_HELLO, 0, 0)
    return sock


async def answered(tmp_path: Path) -> None:
    """A well-behaved tool on a fresh connection gets NodeInfo of HCA 0."""
    lid = model(live=set()).hcas[0].lid
    with trio.fail_after(5):
        sock = await connect(tmp_path)
        with sock:
            await sock.send(smp_get(lid))
            answer = mad.Umad.unpack(await sock.recv(512))
    assert (answer.status, answer.lid, mad.method(answer.mad)) == (0, lid, mad.METHOD_GET_RESP)


def warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and text in r.getMessage()]


async def test_malformed_huge_and_endless_frames_cost_two_log_lines(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(29)
    caplog.set_level(logging.WARNING)
    hostile = [
        b"MKIB",  # the magic alone
        mad.control_frame(mad.CTL_HELLO, U32_MAX),  # no such umad index
        mad.control_frame(mad.CTL_REGISTER, 0, b"\x01" * 5),  # truncated reg_req
        mad.control_frame(mad.CTL_COUNTER, 0, b"x"),  # truncated counter
        mad.control_frame(U32_MAX, U32_MAX),  # no such op
        bytes(63), bytes(70),  # neither a control frame nor a umad
        b"\xff" * 200_000,  # huge: the socket hands over the first MAX_FRAME bytes
    ]
    async with serving(tmp_path) as svc:
        with trio.fail_after(LIMIT):
            sock = await connect(tmp_path)

            async def drain() -> None:  # a tool reads its answers
                while await sock.recv(4096):
                    pass

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain)
                for frame in hostile:
                    await sock.send(frame)
                # Random MADs of every class, method, route and hop count
                # (PerfMgt, answered from a worker thread, in the next test).
                for _ in range(2000):
                    raw = bytearray(rng.randbytes(256))
                    raw[3] &= 0x7F  # requests (responses are matched, not routed)
                    raw[1] = raw[1] if raw[1] != mad.CLASS_PERF else mad.CLASS_SMP_DR
                    await sock.send(mad.Umad(
                        agent_id=rng.randrange(U32_MAX), timeout_ms=1, retries=0,
                        lid=rng.choice([0, 1, 2, 3, NOBODY, 0xFFFF]), mad=bytes(raw)).pack())
                # Endless junk: 20,000 frames too short to be anything.
                for i in range(20_000):
                    await sock.send(i.to_bytes(4, "little") + b"junk")
                await answered(tmp_path)
                assert len(warnings(caplog, "malformed frame")) == 1
                sock.shutdown(socket.SHUT_WR)
            sock.close()
            await trio.testing.wait_all_tasks_blocked()
            # The connection's end says how many were left out, in one line.
            junk_lines = warnings(caplog, "malformed frame")
            assert len(junk_lines) == 2
            assert "(and 20003 more like it since the last such line)" in junk_lines[1]
            assert (svc.connections, svc.pending) == (0, 0)
            await answered(tmp_path)


def test_random_requests_get_an_answer_or_none_never_an_error() -> None:
    """What the service routes a request to, for every entity of the fabric."""
    rng = random.Random(6)
    fabric = model(live={1, 2})
    entities = [SPINE, ("leaf", 0), ("leaf", 1), *(("hca", 0, i) for i in range(4))]
    for _ in range(3000):
        raw = bytearray(rng.randbytes(256))
        raw[1] = rng.choice([mad.CLASS_SMP_LID, mad.CLASS_SMP_DR, mad.CLASS_PERF, raw[1]])
        raw[3] = rng.choice([mad.METHOD_GET, mad.METHOD_SET, raw[3]])
        raw[16:18] = rng.choice([smp.ATTR_NODE_INFO, smp.ATTR_PORT_INFO, smp.ATTR_PORT_COUNTERS,
                                 smp.ATTR_LINEAR_FORWARDING_TABLE, smp.ATTR_PATH_RECORD,
                                 rng.randrange(0x10000)]).to_bytes(2, "big")
        request = bytes(raw)
        entity = rng.choice(entities)
        for answer in (fabric.answer_smp(entity, rng.randrange(256), request),
                       fabric.answer_perf(entity, request),
                       fabric.answer_sa(request, rng.randrange(0x10000))):
            assert len(answer) == mad.MAD_SIZE
        hops = tuple(rng.randrange(256) for _ in range(rng.randrange(64)))
        walked = fabric.walk(Walked(entity=("hca", 0, rng.randrange(4)), arrival=1, hops=hops))
        assert walked is None or len(walked.hops) < len(hops) or not hops


async def test_fifty_thousand_long_timeout_mads_are_bounded_and_freed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    count = 50_000
    async with serving(tmp_path) as svc:
        with trio.fail_after(LIMIT):
            sock = await connect(tmp_path)
            statuses: dict[int, int] = {}

            async def read_answers() -> None:
                while len(statuses) < count - pending.MAX_PENDING_PER_CONNECTION:
                    back = mad.Umad.unpack(await sock.recv(512))
                    statuses[mad.tid(back.mad)] = back.status

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_answers)
                for tid in range(count):
                    await sock.send(smp_get(NOBODY, timeout_ms=U32_MAX, retries=U32_MAX,
                                            tid=tid))
            # The first MAX_PENDING_PER_CONNECTION wait; the rest came back at once.
            assert set(statuses.values()) == {errno.ENOMEM}
            assert sorted(statuses) == list(range(pending.MAX_PENDING_PER_CONNECTION, count))
            assert svc.pending == pending.MAX_PENDING_PER_CONNECTION
            assert len(warnings(caplog, "handed back with ENOMEM")) == 1
            await answered(tmp_path)
            # The tool goes: its requests go with it, at once.
            sock.close()
            await trio.testing.wait_all_tasks_blocked()
            assert (svc.connections, svc.pending) == (0, 0)


async def test_the_pending_requests_of_all_tools_are_bounded_together(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pending, "MAX_PENDING", 300)
    async with serving(tmp_path) as svc:
        with trio.fail_after(LIMIT):
            first, second = await connect(tmp_path), await connect(tmp_path)
            for tid in range(200):
                await first.send(smp_get(NOBODY, timeout_ms=U32_MAX, tid=tid))
            for tid in range(200):
                await second.send(smp_get(NOBODY, timeout_ms=U32_MAX, tid=tid))
            refused = [mad.Umad.unpack(await second.recv(512)) for _ in range(100)]
            assert {r.status for r in refused} == {errno.ENOMEM}
            assert [mad.tid(r.mad) for r in refused] == list(range(100, 200))
            await trio.testing.wait_all_tasks_blocked()
            assert svc.pending == 300
            first.close()
            second.close()


@pytest.mark.parametrize(("timeout_ms", "retries", "seconds"), [
    (U32_MAX, 0, 60),  # one wait: a minute at most
    (U32_MAX, U32_MAX, 300),  # all the retries: five minutes at most
    (0, 2, 3),  # the default second, three times
    (250, 3, 1),
])
async def test_a_request_waits_at_most_as_long_as_the_kernel_lets_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock,
    timeout_ms: int, retries: int, seconds: float,
) -> None:
    async with serving(tmp_path):
        with trio.fail_after(LIMIT + 300):
            sock = await connect(tmp_path)
            start = trio.current_time()
            await sock.send(smp_get(NOBODY, timeout_ms=timeout_ms, retries=retries))
            back = mad.Umad.unpack(await sock.recv(512))
            assert back.status == mad.ETIMEDOUT
            assert trio.current_time() - start == pytest.approx(seconds)
            sock.close()


async def test_a_tool_that_never_reads_is_dropped(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    lid = model(live=set()).hcas[0].lid
    async with serving(tmp_path) as svc:
        with trio.fail_after(LIMIT):
            sock = await connect(tmp_path)
            sent, error = 0, None
            while error is None:  # every request is answered; none is read
                try:
                    await sock.send(smp_get(lid, tid=sent))
                except OSError as exc:
                    error = exc.errno
                sent += 1
            assert error in (errno.EPIPE, errno.ECONNRESET)
            await trio.testing.wait_all_tasks_blocked()
            assert (svc.connections, svc.pending) == (0, 0)
            # Held: the socket's buffer and at most MAX_OUTBOX more.
            assert sent < 10_000
            lines = warnings(caplog, "dropped a tool's connection")
            assert lines == [f"ib: dropped a tool's connection: it left {umadsocket.MAX_OUTBOX} "
                             "answers unread"]
            sock.close()
            await answered(tmp_path)


async def test_agents_are_bounded_and_their_ids_reused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    reg_req = struct.pack("=I16sBBB3sBx", 0, bytes(16), 1, 0x32, 1, b"\x00\x14\x05", 0)
    async with serving(tmp_path):
        with trio.fail_after(LIMIT):
            sock = await connect(tmp_path)
            replies = []
            for _ in range(umadsocket.MAX_AGENTS + 8):
                await sock.send(mad.control_frame(mad.CTL_REGISTER, 0, reg_req))
                replies.append(mad.parse_reply(await sock.recv(64)))
            assert replies[: umadsocket.MAX_AGENTS] == [
                (mad.CTL_REGISTER, 0, i) for i in range(umadsocket.MAX_AGENTS)]
            assert set(replies[umadsocket.MAX_AGENTS :]) == {(mad.CTL_REGISTER, -errno.ENOMEM, 0)}
            await sock.send(mad.control_frame(mad.CTL_UNREGISTER, 5))
            assert mad.parse_reply(await sock.recv(64)) == (mad.CTL_UNREGISTER, 0, 0)
            await sock.send(mad.control_frame(mad.CTL_REGISTER, 0, reg_req))
            assert mad.parse_reply(await sock.recv(64)) == (mad.CTL_REGISTER, 0, 5)
            sock.close()


async def test_connections_past_the_cap_are_refused_with_one_line(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(umadsocket, "MAX_CONNECTIONS", 8)
    async with serving(tmp_path) as svc:
        with trio.fail_after(LIMIT):
            kept = [await connect(tmp_path) for _ in range(8)]
            for _ in range(40):
                with await connect(tmp_path, index=None) as refused:
                    assert await refused.recv(64) == b""  # closed at once
            assert svc.connections == 8
            assert len(warnings(caplog, "refused a tool's connection")) == 1
            kept.pop().close()
            await trio.testing.wait_all_tasks_blocked()
            await answered(tmp_path)  # room again
            for sock in kept:
                sock.close()
    # The service's end counts the refusals the first line left out.
    lines = warnings(caplog, "refused a tool's connection")
    assert len(lines) == 2
    assert "(and 38 more like it" in lines[1]


async def test_a_log_limit_logs_the_first_then_a_count_per_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    limit = LogLimit(logging.getLogger("tests.loglimit"), interval=10)
    with trio.fail_after(LIMIT):
        for i in range(5):
            limit.warning("frame %d", i)
        await trio.sleep(9.9)
        limit.warning("frame %d", 5)
        assert [r.getMessage() for r in caplog.records] == ["frame 0"]
        await trio.sleep(0.1)
        limit.warning("frame %d", 6)  # ten seconds on: the line counts the five left out
        limit.warning("frame %d", 7)
        limit.flush()
        limit.flush()  # nothing left to say
    assert [r.getMessage() for r in caplog.records] == [
        "frame 0", "frame 6 (and 5 more like it since the last such line)", "frame 7"]


# --------------------------------------------------------------------------
# Counters: the two modes, and never past a counter's width
# --------------------------------------------------------------------------


@attrs.define
class Counters:
    """The simulator's side of a counter change, in memory."""

    values: dict[str, int] = attrs.field(factory=dict)

    async def change(self, hca: int, change: mad.CounterChange) -> int:
        assert change.mode == mad.COUNTER_SET  # the service hands over settings only
        self.values[change.name] = change.value
        return change.value


async def counter(sock: trio.socket.SocketType, name: str, mode: int, value: int) -> tuple:
    await sock.send(mad.counter_frame(0, name, mode, value))
    return mad.parse_counter_reply(await sock.recv(64))


async def test_counter_modes_and_widths(tmp_path: Path) -> None:
    """(The real clock: the service reads the counters in a worker thread.)"""
    counters = Counters()
    fabric = attrs.evolve(model(live=set()), read_counters=lambda i: counters.values)
    svc = MadService(fabric=fabric, on_counter=counters.change)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.serve, tmp_path / "umad.sock")
            sock = await connect(tmp_path, index=None)
            # Mode 7 is neither add nor set: refused, nothing changed.
            assert await counter(sock, "symbol_error", 7, 5) == (-errno.EINVAL, 0)
            assert counters.values == {}
            top = 2**64 - 1
            assert await counter(sock, "symbol_error", mad.COUNTER_ADD, 70_000) == (0, 0xFFFF)
            assert await counter(sock, "symbol_error", mad.COUNTER_ADD, top) == (0, 0xFFFF)
            assert await counter(sock, "local_link_integrity_errors", mad.COUNTER_SET, 99) == (
                0, 15)
            # The reply carries a 64-bit counter whole.
            assert await counter(sock, "port_xmit_data", mad.COUNTER_ADD, 2**40) == (0, 2**40)
            assert await counter(sock, "port_xmit_data", mad.COUNTER_ADD, top) == (0, top)
            assert counters.values == {"symbol_error": 0xFFFF, "local_link_integrity_errors": 15,
                                       "port_xmit_data": top}
            sock.close()
            nursery.cancel_scope.cancel()


def test_sysfs_shows_a_counter_held_at_its_width() -> None:
    hca = model(live=set()).hcas[0]
    files = {a.path.rsplit("/", 1)[1]: a.content for a in hca_artifacts(
        hca, {name: 2**70 for name in COUNTERS}) if "/counters/" in a.path}
    assert files["symbol_error"] == b"65535\n"
    assert files["local_link_integrity_errors"] == b"15\n"
    assert files["port_xmit_wait"] == b"%d\n" % (2**32 - 1)
    assert files["port_xmit_data"] == files["unicast_rcv_packets"] == b"%d\n" % (2**64 - 1)


async def test_ctl_counters_stop_at_their_width_in_sysfs(node_root: Path, native_env: Path) -> None:
    """``mokka ctl ib-counter`` through the real simulator: the staged file
    stops at the counter's width however often it is raised."""
    before = snapshot(node_root)
    host = Host(node_root)
    state = state_of("gb200")
    sim = await stage_with_pcibus(host, state)
    files = node_root / IB / "sys/class/infiniband/mlx5_1/ports/1/counters"
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, state)
            for _ in range(2):
                values = await trio.to_thread.run_sync(lambda: change_counters(
                    host, 1, [("port_rcv_data", 2**64 - 1), ("link_downed", 200)], set_=False))
            assert values == [2**64 - 1, 255]
            assert (files / "port_rcv_data").read_text() == f"{2**64 - 1}\n"
            assert (files / "link_downed").read_text() == "255\n"
            nursery.cancel_scope.cancel()
    await discard_with_pcibus(host, sim)
    assert snapshot(node_root) == before
