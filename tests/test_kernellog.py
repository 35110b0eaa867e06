"""The kernel log announcer: record formats (journald and raw), exactly-once
announcement across a restart, the /dev/kmsg rate limit on the autojump clock,
and a root without /dev/kmsg."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import stat
from pathlib import Path

import pytest
import trio

from mokka import layout
from mokka.errors import SpecError, StageError
from mokka.noderoot.host import Host
from mokka.simulators import kmsg, registry
from mokka.simulators.base import Daemon, Readiness, Simulator
from mokka.simulators.kernellog import (
    ANNOUNCED,
    PLUGIN,
    KernelLogSettings,
    KernelLogSimulator,
    _Announced,
    _Line,
    _write_batch,
)
from mokka.state.compile import compile_profile
from mokka.state.model import Gpu, State, System, Xid
from tests.support import snapshot, wait_for_count

KMSG = layout.KMSG.lstrip("/")
BUSES = ("53", "64", "75", "a8")


def uuid(i: int) -> str:
    return f"GPU-5c1e3f2a-0000-4000-8000-00000000000{i}"


def make_state(*xids: tuple[str, int, int], generation: int = 1) -> State:
    """Four GPUs on HGX-like buses and the given (id, gpu index, code) Xids."""
    return State(
        generation=generation, content_hash=f"h{generation}", node_name="node-a",
        profile_name="h100",
        system=System(driver_version="580.105.08", nvml_version="13.580.105.08",
                      cuda_version_major=13, cuda_version_minor=0),
        gpus=tuple(
            Gpu(index=i, minor=i, uuid=uuid(i), serial=f"165432100000{i}",
                name="NVIDIA H100 80GB HBM3", brand="Nvidia", architecture="hopper",
                bus_id=f"0000:{BUSES[i]}:00.0", pci_vendor_id=0x10DE, pci_device_id=0x2330,
                pci_subsystem_vendor_id=0x10DE, pci_subsystem_device_id=0x16C1,
                root_complex="pci0000:00", numa_node=0)
            for i in range(4)
        ),
        xids=tuple(Xid(id=i, gpu_index=g, code=c) for i, g, c in xids),
    )


@pytest.fixture
def kmsg_file(node_root: Path) -> Path:
    """The node's kernel log as a regular file (the test creates it; the daemon never does)."""
    path = node_root / KMSG
    path.parent.mkdir()
    path.write_bytes(b"")
    return path


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def without_kmsg(snap: dict[str, tuple]) -> dict[str, tuple]:
    """The snapshot minus the kernel log's content (the log is the output, it stays)."""
    return {k: (v[:2] if k == KMSG else v) for k, v in snap.items()}


# ---- formats ------------------------------------------------------------------


def test_the_pci_tag_is_domain_bus_device_in_upper_case() -> None:
    gpu = make_state().gpu(3)
    assert kmsg.pci_tag(gpu) == "PCI:0000:A8:00"
    odd = make_state().gpus[0].__class__(**{
        **{f: getattr(gpu, f) for f in ("index", "minor", "uuid", "serial", "name", "brand",
                                        "architecture", "pci_vendor_id", "pci_device_id",
                                        "pci_subsystem_vendor_id", "pci_subsystem_device_id",
                                        "root_complex", "numa_node")},
        "bus_id": "0008:1b:1f.3",
    })
    assert kmsg.pci_tag(odd) == "PCI:0008:1B:1F"


def test_every_documented_code_has_nvidias_description() -> None:
    codes = {13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 154}
    assert set(kmsg.DESCRIPTIONS) == codes
    gpu = make_state().gpu(0)
    assert kmsg.xid_record(gpu, 79, "raw") == (
        b"NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, "
        b"GPU has fallen off the bus.\n")
    assert kmsg.xid_record(gpu, 4242, "raw").endswith(b": 4242, pid='<unknown>', "
                                                      b"name=<unknown>, Unspecified error.\n")
    for code in codes:
        assert len(kmsg.xid_record(gpu, code, "journald")) <= kmsg.MAX_RECORD_BYTES


def test_an_overlong_record_is_cut_to_one_kib_and_stays_one_line() -> None:
    gpu = attrs_evolve(make_state().gpu(0), uuid="GPU-" + "é" * 800)
    record = kmsg.gpu_record(gpu, "journald")
    assert len(record) <= kmsg.MAX_RECORD_BYTES
    assert record.endswith(b"\n")
    assert record.count(b"\n") == 1
    record.decode()  # still valid UTF-8


def attrs_evolve(gpu: Gpu, **changes) -> Gpu:
    import attrs

    return attrs.evolve(gpu, **changes)


def test_one_write_per_record_through_a_message_preserving_socket(host: Host) -> None:
    # SOCK_SEQPACKET keeps write boundaries, so each recv is exactly one write().
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with reader, writer:
        gpu = make_state().gpu(1)
        batch = [
            _Line(kmsg.gpu_record(gpu, "raw"), gpu=gpu.uuid),
            _Line(kmsg.xid_record(gpu, 79, "raw"), xid="x1"),
            _Line(kmsg.xid_record(gpu, 48, "raw"), xid="x2"),
        ]
        announced, error = _write_batch(host, writer.fileno(), batch, _Announced())
        assert error is None
        assert announced == _Announced(frozenset({"x1", "x2"}), frozenset({gpu.uuid}))
        received = [reader.recv(4096) for _ in batch]
        assert received == [line.data for line in batch]
    host.discard("kernellog")


# ---- announcing -------------------------------------------------------------------


async def test_stage_writes_nothing_and_a_missing_kmsg_is_not_ready(
    host: Host, node_root: Path
) -> None:
    before = snapshot(node_root)
    sim = KernelLogSimulator(settings=KernelLogSettings(fallback_file="off"))
    await sim.stage(host, make_state(("x1", 0, 79)))
    assert snapshot(node_root) == before
    assert not sim.readiness.ready
    assert sim.readiness.reason == (
        f"{node_root}/dev/kmsg does not exist: Xids cannot reach the kernel log")
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_journald_style_announces_the_gpu_then_its_xids(
    host: Host, node_root: Path, kmsg_file: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    sim = KernelLogSimulator()
    state = make_state(("x1", 1, 79), ("x2", 0, 48), ("x3", 1, 13))
    await sim.stage(host, state)
    assert not sim.readiness.ready  # staged, not running yet
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        await wait_for_count(sim.written, 3)
        assert trio.current_time() == 0.0
        assert sim.readiness.ready
        nursery.cancel_scope.cancel()
    assert lines(kmsg_file) == [
        f"NVRM: NVRM: GPU at PCI:0000:64:00: {uuid(1)}",
        "NVRM: NVRM: Xid (PCI:0000:64:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.",
        f"NVRM: NVRM: GPU at PCI:0000:53:00: {uuid(0)}",
        "NVRM: NVRM: Xid (PCI:0000:53:00): 48, pid='<unknown>', name=<unknown>, "
        "Double Bit ECC Error.",
        "NVRM: NVRM: Xid (PCI:0000:64:00): 13, pid='<unknown>', name=<unknown>, "
        "Graphics Engine Exception.",
    ]
    # journald takes the first "NVRM:" as the identifier; MESSAGE keeps the second.
    messages = [line.removeprefix("NVRM: ") for line in lines(kmsg_file)]
    assert sum(m.startswith("NVRM: Xid") for m in messages) == 3
    persisted = json.loads((node_root / ANNOUNCED.lstrip("/")).read_text())
    assert persisted == {"version": 1, "xids": ["x1", "x2", "x3"], "gpus": [uuid(0), uuid(1)]}
    await sim.discard(host)
    assert without_kmsg(snapshot(node_root)) == without_kmsg(before)


async def test_an_xid_from_the_overrides_of_a_built_in_profile(
    host: Host, node_root: Path, kmsg_file: Path, tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(
        "version: 1\ndevices:\n  \"1\": {failure: {mode: fallen_off_bus, xid: {code: 79}}}\n")
    state = compile_profile("gb200", node_name="node-a", overrides=overrides)
    sim = KernelLogSimulator()
    await sim.stage(host, state)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        await wait_for_count(sim.written, 1)
        nursery.cancel_scope.cancel()
    assert lines(kmsg_file) == [
        f"NVRM: NVRM: GPU at PCI:0009:01:00: {state.gpu(1).uuid}",
        "NVRM: NVRM: Xid (PCI:0009:01:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.",
    ]
    await sim.discard(host)
    assert without_kmsg(snapshot(node_root)) == without_kmsg(before)


async def test_raw_style_writes_the_prefix_once(
    host: Host, node_root: Path, kmsg_file: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    sim = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    state = make_state(("x1", 3, 94))
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        await wait_for_count(sim.written, 1)
        nursery.cancel_scope.cancel()
    assert lines(kmsg_file) == [
        f"NVRM: GPU at PCI:0000:A8:00: {uuid(3)}",
        "NVRM: Xid (PCI:0000:A8:00): 94, pid='<unknown>', name=<unknown>, Contained ECC error.",
    ]
    # What node-problem-detector and gpud match on the raw log.
    assert re.search(r"NVRM: Xid.*?: (\d+),", "\n".join(lines(kmsg_file))).group(1) == "94"
    await sim.discard(host)
    assert without_kmsg(snapshot(node_root)) == without_kmsg(before)


async def test_each_xid_is_announced_once_across_a_restart(
    host: Host, node_root: Path, kmsg_file: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    first = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run, host, make_state(("x1", 0, 79)))
        await wait_for_count(first.written, 1)
        # The same state again (a resync): nothing new is written.
        await first.reload(make_state(("x1", 0, 79), generation=2))
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert len(lines(kmsg_file)) == 2

    # A new process over the same root: x1 stays announced, x2 is new, and GPU 0's
    # header is not printed again.
    restarted = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    fresh_host = Host(node_root)
    state = make_state(("x1", 0, 79), ("x2", 0, 31), generation=3)
    await restarted.stage(fresh_host, state)
    async with trio.open_nursery() as nursery:
        await nursery.start(restarted.run, fresh_host, state)
        await wait_for_count(restarted.written, 1)
        await trio.sleep(1)
        assert restarted.readiness == Readiness.ok("2 Xid(s) announced (raw)")
        nursery.cancel_scope.cancel()
    assert restarted.written.value == 1
    assert lines(kmsg_file)[2:] == [
        "NVRM: Xid (PCI:0000:53:00): 31, pid='<unknown>', name=<unknown>, GPU memory page fault.",
    ]
    await restarted.discard(fresh_host)
    assert without_kmsg(snapshot(node_root)) == without_kmsg(before)


async def test_xids_delivered_by_reload_are_announced(
    host: Host, node_root: Path, kmsg_file: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    sim = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, make_state())
        await trio.sleep(7)
        assert lines(kmsg_file) == []
        await sim.reload(make_state(("x9", 2, 119), generation=2))
        await wait_for_count(sim.written, 1)
        assert trio.current_time() == 7.0
        nursery.cancel_scope.cancel()
    assert lines(kmsg_file)[-1] == (
        "NVRM: Xid (PCI:0000:75:00): 119, pid='<unknown>', name=<unknown>, GSP RPC Timeout.")
    await sim.discard(host)
    assert without_kmsg(snapshot(node_root)) == without_kmsg(before)


class _BrokenStage:
    """A simulator whose stage fails, so a pass stops at the barrier."""

    name = "broken"
    readiness = Readiness.not_ready("broken")

    async def stage(self, host: Host, state: State) -> None:
        raise StageError("broken: stage failed on purpose")

    async def discard(self, host: Host) -> None:
        return None


async def test_an_xid_of_a_pass_that_fails_at_the_barrier_is_not_announced(
    host: Host, node_root: Path, kmsg_file: Path, autojump_clock: trio.abc.Clock
) -> None:
    """The kernel log is what node-problem-detector acts on: an Xid reaches it
    only with a state that passed the barrier, as NVML's events do."""
    from mokka.daemon.reconciler import Reconciler
    from mokka.daemon.supervisor import Supervisor

    before = snapshot(node_root)
    sim = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    async with trio.open_nursery() as nursery:
        supervisor = Supervisor(host)
        await nursery.start(supervisor.run)
        good = Reconciler(host, [sim], supervisor=supervisor)
        assert (await good.reconcile_once(make_state())).ok  # the announcer runs
        failing = Reconciler(host, [sim, _BrokenStage()], supervisor=supervisor)
        result = await failing.reconcile_once(make_state(("x1", 0, 79), generation=2))
        assert not result.ok
        await trio.sleep(30)  # whatever the announcer would do, it has done by now
        assert lines(kmsg_file) == []
        assert sim.written.value == 0
        # The same Xid in a pass that succeeds is announced.
        assert (await good.reconcile_once(make_state(("x1", 0, 79), generation=3))).ok
        await wait_for_count(sim.written, 1)
        supervisor.stop()
        await supervisor.wait_stopped()
        nursery.cancel_scope.cancel()
    assert lines(kmsg_file)[-1].startswith("NVRM: Xid (PCI:0000:53:00): 79, ")
    await sim.discard(host)
    assert without_kmsg(snapshot(node_root)) == without_kmsg(before)


async def test_a_withdrawn_and_reinjected_xid_is_announced_again(
    host: Host, node_root: Path, kmsg_file: Path, autojump_clock: trio.abc.Clock
) -> None:
    sim = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, make_state(("x1", 0, 79)))
        await wait_for_count(sim.written, 1)
        await sim.reload(make_state(generation=2))  # overrides reset: no Xid in force
        await trio.sleep(1)
        await sim.reload(make_state(("x1", 0, 79), generation=3))  # injected again
        await wait_for_count(sim.written, 2)
        nursery.cancel_scope.cancel()
    xid_lines = [line for line in lines(kmsg_file) if "Xid" in line]
    assert len(xid_lines) == 2
    await sim.discard(host)


async def test_the_rate_limit_queues_instead_of_dropping(
    host: Host, node_root: Path, kmsg_file: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    sim = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    state = make_state(*[(f"x{i:02d}", 0, 79) for i in range(12)])
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        # Ten records in the first window: GPU 0's header and nine Xids.
        await wait_for_count(sim.written, 9)
        assert trio.current_time() == 0.0
        assert len(lines(kmsg_file)) == 10
        # The rest once the 5 s window has fully passed (plus the jiffy margin).
        await wait_for_count(sim.written, 12)
        assert trio.current_time() == 5.05
        assert len(lines(kmsg_file)) == 13
        # The new window (from 5.05) has 7 records left: a new Xid goes out at once.
        await trio.sleep(1)
        await sim.reload(make_state(*[(f"x{i:02d}", 0, 79) for i in range(13)], generation=2))
        await wait_for_count(sim.written, 13)
        assert trio.current_time() == 6.05
        nursery.cancel_scope.cancel()
    assert [line.count("Xid") for line in lines(kmsg_file)] == [0] + [1] * 13
    await sim.discard(host)
    assert without_kmsg(snapshot(node_root)) == without_kmsg(before)


async def test_the_limiter_mirrors_the_kernels_window(autojump_clock: trio.abc.Clock) -> None:
    limiter = kmsg.WindowLimiter(burst=10, interval=5.0)
    assert limiter.grant(4) == 4
    await trio.sleep(4.0)
    assert limiter.grant(10) == 6  # same window: 10 in total
    assert limiter.grant(1) == 0
    await limiter.wait()
    assert trio.current_time() == 5.05
    assert limiter.grant(12) == 10


async def test_a_missing_kmsg_is_retried_and_never_created(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock
) -> None:
    before = snapshot(node_root)
    sim = KernelLogSimulator(settings=KernelLogSettings(style="raw", fallback_file="off"))
    state = make_state(("x1", 0, 79))
    await sim.stage(host, state)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        await trio.sleep(3)
        assert not (node_root / KMSG).exists()
        assert not sim.readiness.ready
        assert "dev/kmsg does not exist" in sim.readiness.reason
        (node_root / "dev").mkdir()
        (node_root / KMSG).write_bytes(b"")
        await wait_for_count(sim.written, 1)
        assert trio.current_time() == 10.0  # the next retry
        assert sim.readiness.ready
        nursery.cancel_scope.cancel()
    await sim.discard(host)
    assert set(snapshot(node_root)) - set(before) == {"dev", KMSG}


async def test_a_local_root_gets_a_regular_file_that_discard_removes(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock
) -> None:
    """No /dev/null device: not a real host, so the stand-in file is created and read back."""
    before = snapshot(node_root)
    sim = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    state = make_state(("x1", 0, 79))
    await sim.stage(host, state)
    assert (node_root / KMSG).is_file()
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        await wait_for_count(sim.written, 1)
        assert sim.readiness.ready
        # a later stage keeps what was logged (the content is the log, not managed)
        await sim.stage(host, state)
        assert b"NVRM: Xid (PCI:0000:53:00): 79" in (node_root / KMSG).read_bytes()
        nursery.cancel_scope.cancel()
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_a_real_host_kmsg_is_never_created(host: Host, node_root: Path) -> None:
    """A root with a /dev/null character device is a real host: its kernel log is the kernel's."""
    (node_root / "dev").mkdir()
    os.mknod(node_root / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    before = snapshot(node_root)
    sim = KernelLogSimulator()
    await sim.stage(host, make_state(("x1", 0, 79)))
    assert not (node_root / KMSG).exists()
    assert "dev/kmsg does not exist" in sim.readiness.reason
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_a_fifo_without_a_reader_is_not_ready_and_with_one_gets_the_records(
    host: Host, node_root: Path, autojump_clock: trio.abc.Clock
) -> None:
    (node_root / "dev").mkdir()
    fifo = node_root / KMSG
    os.mkfifo(fifo)
    before = snapshot(node_root)
    sim = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    state = make_state(("x1", 2, 45))
    await sim.stage(host, state)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        assert "no reader on the FIFO" in sim.readiness.reason
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            await wait_for_count(sim.written, 1)
            assert trio.current_time() == 10.0
            data = os.read(reader, 65536)
        finally:
            os.close(reader)
        nursery.cancel_scope.cancel()
    assert data.decode().splitlines()[1] == (
        "NVRM: Xid (PCI:0000:75:00): 45, pid='<unknown>', name=<unknown>, "
        "Preemptive cleanup, due to previous errors.")
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_an_xid_for_a_missing_gpu_is_skipped(
    host: Host, node_root: Path, kmsg_file: Path, autojump_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, make_state(("ghost", 7, 79), ("x1", 0, 79)))
        await wait_for_count(sim.written, 1)
        nursery.cancel_scope.cancel()
    assert len(lines(kmsg_file)) == 2
    assert "Xid ghost names GPU 7, which this state does not have" in caplog.text
    await sim.discard(host)


@pytest.mark.parametrize("damage", [b"{not json", b"\xff\xfe{\"xids\": []}"])
async def test_a_damaged_announced_file_announces_again(
    host: Host, node_root: Path, kmsg_file: Path, autojump_clock: trio.abc.Clock,
    damage: bytes,
) -> None:
    sim = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, make_state(("x1", 0, 79)))
        await wait_for_count(sim.written, 1)
        nursery.cancel_scope.cancel()
    (node_root / ANNOUNCED.lstrip("/")).write_bytes(damage)
    again = KernelLogSimulator(settings=KernelLogSettings(style="raw"))
    async with trio.open_nursery() as nursery:
        await nursery.start(again.run, host, make_state(("x1", 0, 79)))
        await wait_for_count(again.written, 1)
        nursery.cancel_scope.cancel()
    assert sum("Xid" in line for line in lines(kmsg_file)) == 2
    await again.discard(host)
    assert not (node_root / ANNOUNCED.lstrip("/")).exists()


# ---- settings and registration --------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    PLUGIN.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_build_the_simulator() -> None:
    sim = PLUGIN.build(parse("--kmsg-style", "raw"))
    assert isinstance(sim, Simulator)
    assert isinstance(sim, Daemon)
    assert sim.settings.style == "raw"
    assert PLUGIN.build(parse()).settings.style == "journald"
    assert "mokka.simulators.kernellog" in registry.PLUGIN_MODULES


def test_bad_settings_are_clear_errors() -> None:
    with pytest.raises(SpecError, match="--kmsg-style: 'syslog', expected one of journald, raw"):
        KernelLogSettings(style="syslog")
    with pytest.raises(SystemExit):
        parse("--kmsg-style", "syslog")
