"""The workload simulator against a real gRPC pod-resources server.

The server (tests/podresources_support.py) is grpcio's real server on a
unix socket under the node root, encoding with classes generated from the
project's .proto by grpc_tools; the daemon reads the answers with its own
wire reader.  These tests use trio's real clock: the gRPC calls run in real
threads (an autojump clock would fire every deadline at once).  Every wait
is on the simulator's poll counter, bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
import yaml

from mokka.errors import SpecError
from mokka.noderoot.host import Host
from mokka.simulators.workload import WorkloadSettings, WorkloadSimulator, wire
from mokka.simulators.workload.allocation import (
    Shares,
    allocation_for,
    gpu_position,
    render_workload,
)
from mokka.simulators.workload.podresources import (
    MAX_FIELDS,
    MAX_MESSAGE_BYTES,
    AnswerError,
    Grant,
    Holder,
    decode_allocatable,
    decode_list,
)
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.podresources_support import (
    HOSTILE_LISTS,
    SOCKET,
    Pod,
    PodResourcesServer,
    pb2_fixture,  # noqa: F401  (a fixture: tests name it pb2)
    server_fixture,  # noqa: F401  (a fixture: tests name it server)
    workload,
)
from tests.support import snapshot


@pytest.fixture
def h100() -> State:
    return compile_profile("h100", node_name="node-a")


def holder(pod: str, container: str = "main", namespace: str = "team") -> Holder:
    return Holder(namespace, pod, container)


# --- decoding: the project's reader against the real protobuf encoder -------------


def test_list_answer_decodes_device_plugin_and_dra_grants(pb2, h100: State) -> None:
    server = PodResourcesServer(pb2, Path("/unused"))
    server.pods = [
        Pod("team", "train-0", {"main": [("nvidia.com/gpu", [h100.gpu(0).uuid, "3"])],
                                "sidecar": [("example.com/nic", ["eth1"])]}),
        Pod("ml", "infer", {}, claims={"srv": [("gpu.nvidia.com", "gpu-5", [])]}),
        Pod("ml", "cdi-only", {}, claims={"c": [("gpu.nvidia.com", "",
                                                  ["k8s.gpu.nvidia.com/device=gpu-6"])]}),
    ]
    grants = decode_list(server.list_answer().SerializeToString())
    assert grants == (
        Grant(holder("train-0"), "nvidia.com/gpu", h100.gpu(0).uuid),
        Grant(holder("train-0"), "nvidia.com/gpu", "3"),
        Grant(holder("train-0", "sidecar"), "example.com/nic", "eth1"),
        Grant(holder("infer", "srv", "ml"), "gpu.nvidia.com", "gpu-5"),
        Grant(holder("cdi-only", "c", "ml"), "gpu.nvidia.com", "k8s.gpu.nvidia.com/device=gpu-6"),
    )


def test_allocatable_answer_decodes(pb2) -> None:
    response = pb2.AllocatableResourcesResponse()
    response.devices.add(resource_name="nvidia.com/gpu", device_ids=["a", "b"])
    response.cpu_ids.extend([0, 1, 2])
    assert decode_allocatable(response.SerializeToString()) == (
        ("nvidia.com/gpu", "a"), ("nvidia.com/gpu", "b"))


def test_damaged_answers_raise_answer_errors_only(pb2, h100: State) -> None:
    server = PodResourcesServer(pb2, Path("/unused"))
    server.pods = [Pod("team", f"p{i}", {"main": [("nvidia.com/gpu", [str(i % 8)])]})
                   for i in range(6)]
    good = server.list_answer().SerializeToString()
    rng = random.Random(20261201)
    outcomes = {"decoded": 0, "refused": 0}
    for _ in range(3000):
        damaged = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            position = rng.randrange(len(damaged))
            if choice < 0.5:
                damaged[position] = rng.randrange(256)
            elif choice < 0.75:
                del damaged[position:]
            else:
                damaged[position:position] = rng.randbytes(rng.randint(1, 8))
            if not damaged:
                break
        try:
            decode_list(bytes(damaged))
            outcomes["decoded"] += 1
        except AnswerError:
            outcomes["refused"] += 1
    # Both kinds happen (the mutations are not all fatal), and nothing else
    # was raised (it would have failed the test above).
    assert outcomes["decoded"] > 100
    assert outcomes["refused"] > 100


def test_names_are_cut_and_grant_counts_capped(pb2) -> None:
    server = PodResourcesServer(pb2, Path("/unused"))
    server.pods = [Pod("n" * 5000, "p", {"c": [("nvidia.com/gpu", ["0"])]})]
    (grant,) = decode_list(server.list_answer().SerializeToString())
    assert len(grant.holder.namespace) == 253
    server.pods = [Pod("n", "p", {"c": [("nvidia.com/gpu", ["0"] * 20_001)]})]
    with pytest.raises(AnswerError, match="more than 20000 device grants"):
        decode_list(server.list_answer().SerializeToString())


# --- the allocation: level-triggered, stable -------------------------------------------


def test_every_spelling_of_a_gpu_resolves(h100: State) -> None:
    uuid = h100.gpu(2).uuid
    for spelling in (uuid, uuid.lower(), f"{uuid}::3", "2", "gpu-2", "nvidia.com/gpu=2",
                     f"nvidia.com/gpu={uuid}", "k8s.gpu.nvidia.com/device=gpu-2"):
        assert gpu_position(spelling, h100) == 2, spelling
    for foreign in ("GPU-00000000-0000-0000-0000-000000000000", "8", "gpu-99", "MIG-x", "", "²"):
        assert gpu_position(foreign, h100) is None, foreign


def test_allocation_dedupes_replicas_shares_pids_and_filters_resources(h100: State) -> None:
    uuid0, uuid1 = h100.gpu(0).uuid, h100.gpu(1).uuid
    grants = [
        Grant(holder("a"), "nvidia.com/gpu.shared", f"{uuid0}::0"),
        Grant(holder("a"), "nvidia.com/gpu.shared", f"{uuid0}::1"),  # same GPU, same process
        Grant(holder("b"), "nvidia.com/gpu.shared", f"{uuid0}::2"),  # time-sliced: a second one
        Grant(holder("a"), "nvidia.com/gpu", uuid1),  # one process on two GPUs
        Grant(holder("c"), "example.com/fpga", "4"),  # not a GPU resource
        Grant(holder("d"), "nvidia.com/gpu", "GPU-elsewhere"),
    ]
    allocation = allocation_for(grants, h100, resources=("nvidia.com/",))
    assert sorted(allocation.processes) == [0, 1]
    on0 = allocation.processes[0]
    assert [p.name for p in on0] == ["k8s:team/a/main", "k8s:team/b/main"]
    assert allocation.processes[1][0].pid == on0[0].pid
    assert on0[0].pid != on0[1].pid
    assert allocation.unresolved == ("GPU-elsewhere",)
    assert allocation.holders == 2
    # Level-triggered: the same grants in another order give the same answer.
    assert allocation_for(reversed(grants), h100, resources=("nvidia.com/",)) == allocation


def test_workload_file_is_the_engine_config_format(h100: State) -> None:
    allocation = allocation_for(
        [Grant(holder("a"), "nvidia.com/gpu", "1"), Grant(Holder("x", 'q"\\\x01', "c"),
                                                          "nvidia.com/gpu", "1")],
        h100, resources=("nvidia.com/",))
    text = render_workload(h100, allocation, Shares(memory=0.25, utilization=70))
    doc = yaml.safe_load(text)
    assert doc["format"] == 1
    assert doc["device_count"] == len(h100.gpus)
    assert doc["workload.memory_share_per_holder"] == 0.25
    assert doc["workload.utilization_per_holder"] == 70
    assert doc["device.1.process_count"] == 2
    assert doc["device.0.process_count"] == 0
    assert doc["device.1.process.1.name"] == 'k8s:x/q"\\?/c'
    assert render_workload(h100, allocation, Shares(memory=0.25, utilization=70)) == text


def test_settings_refuse_bad_values() -> None:
    with pytest.raises(SpecError) as info:
        WorkloadSettings(mode="sometimes", socket="relative", poll_interval=0,
                         memory_share=1.5, utilization=101, resources=("",))
    assert len(info.value.problems) == 6


# --- the daemon against the real server -----------------------------------------------


def fast(**kwargs) -> WorkloadSettings:
    return WorkloadSettings(poll_interval=0.05, call_timeout=0.5, **kwargs)


async def polls(sim: WorkloadSimulator, count: int) -> None:
    """Wait for ``count`` more completed polls."""
    target = sim.polls.value + count
    await sim.polls.wait_value(lambda value: value >= target)


async def test_no_socket_means_idle_and_ready_with_the_reason(host: Host, node_root: Path,
                                                              h100: State) -> None:
    before = snapshot(node_root)
    sim = WorkloadSimulator(settings=fast())
    await sim.stage(host, h100)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, h100)
            await polls(sim, 1)
            nursery.cancel_scope.cancel()
    assert sim.readiness.ready
    assert "no pod-resources socket at /var/lib/kubelet/pod-resources/kubelet.sock" in (
        sim.readiness.reason)
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_held_gpus_follow_the_allocation_and_return_to_idle(
    host: Host, node_root: Path, h100: State, server: PodResourcesServer
) -> None:
    before = snapshot(node_root)
    server.allocatable = [("nvidia.com/gpu", [g.uuid for g in h100.gpus])]
    sim = WorkloadSimulator(settings=fast())
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, h100)
            await polls(sim, 1)
            assert workload(node_root)["device.0.process_count"] == 0
            assert sim.readiness.ready
            assert "the kubelet can allocate 8 of them" in sim.readiness.reason

            server.pods = [Pod("team", "train", {"main": [("nvidia.com/gpu", [h100.gpu(3).uuid])]})]
            await polls(sim, 2)
            doc = workload(node_root)
            assert doc["device.3.process_count"] == 1
            assert doc["device.3.process.0.name"] == "k8s:team/train/main"
            assert sim.readiness.reason.startswith("1 container(s) hold 1 of 8 GPU(s)")

            server.pods = []
            await polls(sim, 2)
            assert workload(node_root)["device.3.process_count"] == 0
            nursery.cancel_scope.cancel()
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_failed_answers_keep_the_last_allocation_and_say_why(
    host: Host, node_root: Path, h100: State, server: PodResourcesServer
) -> None:
    server.pods = [Pod("team", "train", {"main": [("nvidia.com/gpu", ["0"])]})]
    sim = WorkloadSimulator(settings=fast())
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, h100)
            await polls(sim, 1)
            good = workload(node_root)
            assert good["device.0.process_count"] == 1
            for mode, words in (("garbage", "List answer does not decode"),
                                ("error", "UNAVAILABLE: kubelet restarting")):
                server.mode = mode
                await polls(sim, 2)
                assert not sim.readiness.ready
                assert words in sim.readiness.reason
                assert "keeping the last good allocation" in sim.readiness.reason
                assert workload(node_root) == good
            server.mode = "ok"
            await polls(sim, 2)
            assert sim.readiness.ready
            nursery.cancel_scope.cancel()
    await sim.discard(host)


async def test_a_stalled_kubelet_times_out_and_never_delays_cancellation(
    host: Host, node_root: Path, h100: State, server: PodResourcesServer
) -> None:
    server.mode = "stall"
    sim = WorkloadSimulator(settings=fast())
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, h100)
            await polls(sim, 1)
            assert not sim.readiness.ready
            assert "DEADLINE_EXCEEDED" in sim.readiness.reason
            # A call in flight: cancellation abandons it at once.
            server.called.clear()
            assert await trio.to_thread.run_sync(server.called.wait, 10)
            started = trio.current_time()
            nursery.cancel_scope.cancel()
    assert trio.current_time() - started < 0.5
    server.release.set()
    await sim.discard(host)


async def test_reload_repositions_at_once(host: Host, node_root: Path,
                                          server: PodResourcesServer) -> None:
    eight = compile_profile("h100", node_name="node-a")
    server.pods = [Pod("team", "train", {"main": [("nvidia.com/gpu", ["7"])]})]
    sim = WorkloadSimulator(settings=WorkloadSettings(poll_interval=3600, call_timeout=0.5))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, eight)
            await polls(sim, 1)
            assert workload(node_root)["device.7.process_count"] == 1
            four = compile_profile("l40s", node_name="node-a")
            await sim.reload(four)
            await polls(sim, 1)  # well before the hour-long interval
            doc = workload(node_root)
            assert doc["device_count"] == len(four.gpus)
            assert "device.7.process_count" not in doc
            nursery.cancel_scope.cancel()
    await sim.discard(host)


async def test_with_no_socket_nothing_polls_until_a_kubelet_starts(
    host: Host, node_root: Path, h100: State, pb2
) -> None:
    """No socket: the way to it is watched, not polled on the interval (an hour
    here), and a kubelet starting later is picked up at once."""
    sim = WorkloadSimulator(settings=WorkloadSettings(poll_interval=3600, call_timeout=0.5))
    # Served under a temp name, then renamed into place: the socket appears
    # already listening (a bind seen before its listen would be refused, and
    # retried only at the next poll, an hour away here).
    socket = node_root / SOCKET
    server = PodResourcesServer(pb2, socket.with_name("kubelet.sock.tmp"))
    server.pods = [Pod("team", "train", {"main": [("nvidia.com/gpu", ["2"])]})]
    try:
        with trio.fail_after(30):  # real seconds: bounds a broken test
            async with trio.open_nursery() as nursery:
                await nursery.start(sim.run, host, h100)
                await sim.polls.wait_value(lambda value: value >= 1)
                assert "no pod-resources socket" in sim.readiness.reason
                # The kubelet's directories and socket appear (none existed).
                socket.parent.mkdir(parents=True)
                await trio.to_thread.run_sync(server.start)
                socket.with_name("kubelet.sock.tmp").rename(socket)
                await sim.polls.wait_value(lambda _: workload(node_root) is not None)
                assert workload(node_root)["device.2.process_count"] == 1
                assert sim.readiness.ready
                nursery.cancel_scope.cancel()
    finally:
        server.stop()
        socket.unlink(missing_ok=True)
    await sim.discard(host)


async def test_off_polls_nothing_until_a_reload(host: Host, node_root: Path, h100: State,
                                                autojump_clock: trio.abc.Clock) -> None:
    sim = WorkloadSimulator(settings=fast(mode="off"))
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, h100)
        await sim.polls.wait_value(lambda value: value >= 1)
        await trio.sleep(3600)
        assert sim.polls.value == 1
        await sim.reload(h100)
        await sim.polls.wait_value(lambda value: value >= 2)
        await trio.testing.wait_all_tasks_blocked()
        assert sim.polls.value == 2
        nursery.cancel_scope.cancel()
    await sim.discard(host)


# --- hostile answers: bounded before they are paid for ----------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(HOSTILE_LISTS))
def test_hostile_answers_stop_at_their_first_cap(name: str) -> None:
    answer, words = HOSTILE_LISTS[name]
    assert len(answer) <= MAX_MESSAGE_BYTES  # what the socket lets through
    budget = wire.Budget(MAX_FIELDS)
    if words is None:
        grants = decode_list(answer, budget)
        assert all(len(g.holder.pod) <= 253 for g in grants)
    else:
        with pytest.raises(AnswerError, match=words):
            decode_list(answer, budget)
    # The CPU a decode costs is bounded by the cap, not by the answer's size.
    assert budget.spent <= MAX_FIELDS + 1


class Abandoned(BaseException):
    """Stands for ``trio.Cancelled``, which ``check_cancelled`` raises once abandoned."""


@pytest.mark.timeout(60)
def test_an_abandoned_decode_stops_at_its_next_checkpoint() -> None:
    answer, _ = HOSTILE_LISTS["two million unknown fields"]
    calls = []

    def checkpoint() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise Abandoned

    budget = wire.Budget(MAX_FIELDS, checkpoint)
    with pytest.raises(Abandoned):
        decode_list(answer, budget)
    assert budget.spent == 3 * wire.CHECK_EVERY


@attrs.define(eq=False)
class StuckClient:
    """A client whose call ignores its deadline, as a wedged gRPC call or a
    long decode would: it ends when released or, when ``heeds_checkpoint``,
    at the first checkpoint after its caller abandoned it."""

    heeds_checkpoint: bool = False
    release: threading.Event = attrs.field(factory=threading.Event)
    ended: threading.Event = attrs.field(factory=threading.Event)
    calls: int = 0
    running: int = 0
    most_at_once: int = 0
    closed: bool = False
    socket: Path | None = None
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def connect(self, socket: Path, timeout: float) -> StuckClient:
        self.socket = socket
        return self

    def poll(self, checkpoint):
        with self._lock:
            self.calls += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            while not self.release.wait(0.005):
                if self.heeds_checkpoint:
                    checkpoint()
            return (), ()
        finally:
            with self._lock:
                self.running -= 1
            self.ended.set()

    def close(self) -> None:
        self.closed = True


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "mokka.simulators.workload.simulator" and r.levelno == logging.WARNING]


async def test_no_second_call_while_an_abandoned_one_runs_and_teardown_never_waits(
    host: Host, node_root: Path, h100: State, server: PodResourcesServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = snapshot(node_root)
    stuck = StuckClient()
    sim = WorkloadSimulator(settings=WorkloadSettings(poll_interval=0.01, call_timeout=0.02),
                            connect=stuck.connect)
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(sim.run, host, h100)
                await polls(sim, 6)
                assert "abandoned, is still running; no new call until it ends" in (
                    sim.readiness.reason)
                nursery.cancel_scope.cancel()
            await sim.discard(host)
        # Teardown ended while the abandoned call still runs, and no poll
        # started a second one beside it.
        assert stuck.running == 1
        assert (stuck.calls, stuck.most_at_once, stuck.closed) == (1, 1, True)
        # Six failed polls, one line.
        assert len(warnings_of(caplog)) == 1, warnings_of(caplog)
    finally:
        stuck.release.set()
        assert await trio.to_thread.run_sync(stuck.ended.wait, 10)
    assert snapshot(node_root) == before


async def test_an_abandoned_call_ends_at_its_checkpoint_and_polling_goes_on(
    host: Host, h100: State, server: PodResourcesServer
) -> None:
    stuck = StuckClient(heeds_checkpoint=True)
    sim = WorkloadSimulator(settings=WorkloadSettings(poll_interval=0.01, call_timeout=0.02),
                            connect=stuck.connect)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, h100)
            await sim.polls.wait_value(lambda _: stuck.calls >= 3)
            nursery.cancel_scope.cancel()
    # Each abandoned call ended by itself (never released), one at a time.
    assert stuck.most_at_once == 1
    assert not stuck.release.is_set()
    await sim.discard(host)
