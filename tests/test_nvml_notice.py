"""The change notice: a running NVML client sees a new engine config at its next call.

The daemon side is real: the gpudriver simulator stages the driver tree
(the mock library built from the tree, the engine config and the counter
file ``config/generation``) through ``Host`` and bumps the counter after
each new config, and the workload simulator bumps it after each workload
file; the reader is a separate process that loads the library (the
*staged* one where the simulator stages it) and makes exactly one NVML call
per request.  Readers run with ``MOCK_NVML_RECHECK_INTERVAL_MS`` set to an
hour, so the library's stat schedule cannot explain a change they see: only
the notice can; the fallback tests set it to 0 (stat at every call) instead
of sleeping.  The last test swaps snapshots by bumps under 8 threads in
valgrind.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from mokka import layout
from mokka.noderoot.host import File, Host
from mokka.simulators.gpudriver import GpuDriverSimulator, notice
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.simulators.workload import WorkloadSettings, WorkloadSimulator
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.gpudriver_support import node_paths, symlink_settings
from tests.nvml_support import compiler, load_target, node_path, open_files, write_config
from tests.podresources_support import SOCKET, Pod, PodResourcesServer, compile_api
from tests.support import require_tool
from tests.test_nvml_workload import polls

#: One NVML call per line read: ``uuid`` (nvmlDeviceGetUUID of device 0) or
#: ``util <index>`` (nvmlDeviceGetUtilizationRates, the GPU percent).
READER = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
assert lib.nvmlInit_v2() == 0
handles = [ctypes.c_void_p() for _ in range(8)]
for index, handle in enumerate(handles):
    assert lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
buf = ctypes.create_string_buffer(96)
rates = (ctypes.c_uint * 2)()
print("READY", flush=True)
for line in sys.stdin:
    command = line.split()
    if command[0] == "uuid":
        code = lib.nvmlDeviceGetUUID(handles[0], buf, 96)
        print(code, buf.value.decode(), flush=True)
    else:
        code = lib.nvmlDeviceGetUtilizationRates(handles[int(command[1])], rates)
        print(code, rates[0], flush=True)
"""

HOUR_MS = "3600000"
HAMMER = Path(__file__).resolve().parent / "nvml_hammer.c"
STAGED_LIBRARY = f"{layout.DRIVER_LIB}/libnvidia-ml.so.1"


class Reader:
    """A client process holding the library open across changes."""

    def __init__(self, library: Path, *, interval_ms: str, config: Path | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_NVML_")}
        env.update(MOCK_NVML_RECHECK_INTERVAL_MS=interval_ms, MOCK_NVML_DEBUG="1")
        if config is not None:
            env["MOCK_NVML_CONFIG"] = str(config)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", READER, str(library)], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        assert self._line() == "READY"

    def _line(self) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        if not ready:
            self.proc.kill()
            pytest.fail(f"the reader did not answer within 60 s: {self.proc.stderr.read()}")
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"the reader exited: {self.proc.stderr.read()}")
        return line.strip()

    def _call(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        code, _, value = self._line().partition(" ")
        assert code == "0", f"{command}: NVML returned {code}"
        return value

    def uuid(self) -> str:
        """The answer of exactly one nvmlDeviceGetUUID call."""
        return self._call("uuid")

    def utilization(self, index: int) -> int:
        """The GPU percent of exactly one nvmlDeviceGetUtilizationRates call."""
        return int(self._call(f"util {index}"))

    def open_counters(self) -> list[tuple[int, str]]:
        """(inode, path) of every counter file the reader holds open."""
        return open_files(self.proc.pid, "/config/generation")

    def mapped_counters(self) -> list[tuple[str, int, str]]:
        """(permissions, inode, path) of every mapping of a counter file in the reader."""
        found = []
        for line in Path(f"/proc/{self.proc.pid}/maps").read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and "/config/generation" in fields[5]:
                found.append((fields[1], int(fields[4]), fields[5]))
        return found

    def close(self) -> str:
        """Ends the reader; its stderr (the library's debug lines)."""
        try:
            _out, err = self.proc.communicate(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        assert self.proc.returncode == 0, err
        return err


def node(name: str) -> State:
    """The h100 profile for node ``name``: every GPU UUID depends on it."""
    return compile_profile("h100", node_name=name)


def uuid_of(state: State) -> str:
    return state.gpus[0].uuid


@pytest.fixture
def staged(native: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, host: Host):
    """A gpudriver simulator staging onto the test root with the library built from the tree."""
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(native))
    sim = GpuDriverSimulator(settings=symlink_settings(tmp_path), can_mount=False)

    def stage(state: State) -> None:
        async def run() -> None:
            with trio.fail_after(60):
                await sim.stage(host, state)

        trio.run(run)

    yield sim, stage

    async def teardown() -> None:
        with trio.fail_after(60):
            await sim.revoke(host)
            await sim.discard(host)

    trio.run(teardown)
    # Revoke + discard leave the root as the test found it: empty.
    assert node_paths(host.root) == set()


def counter(host: Host) -> int:
    raw = host.resolve(layout.CONFIG_GENERATION).read_bytes()
    assert len(raw) == notice.NOTICE_BYTES
    return int.from_bytes(raw, "little")


def test_a_staged_change_is_seen_by_the_next_call_of_a_running_client(staged, host: Host):
    _sim, stage = staged
    a, b = node("node-a"), node("node-b")
    stage(a)
    assert counter(host) == 1  # created, then bumped once the config was in place
    reader = Reader(host.resolve(STAGED_LIBRARY), interval_ms=HOUR_MS)
    try:
        assert reader.uuid() == uuid_of(a)
        counter_file = host.resolve(layout.CONFIG_GENERATION)
        # Held open and read with pread, never mapped: a truncated file cannot fault.
        assert reader.open_counters() == [(counter_file.stat().st_ino, str(counter_file))]
        assert reader.mapped_counters() == []

        inode = counter_file.stat().st_ino
        stage(b)
        assert counter(host) == 2
        assert counter_file.stat().st_ino == inode  # bumped in place, never replaced
        assert reader.uuid() == uuid_of(b)

        stage(b)  # nothing changed: no bump, no re-read
        assert counter(host) == 2
        assert reader.uuid() == uuid_of(b)
    finally:
        log = reader.close()
    assert log.count("changed; re-read it") == 1


def test_a_config_renamed_without_a_bump_waits_for_the_bump(staged, host: Host):
    """The library does not poll the file on every call: the counter is what it watches."""
    _sim, stage = staged
    a, b = node("node-a"), node("node-b")
    stage(a)
    reader = Reader(host.resolve(STAGED_LIBRARY), interval_ms=HOUR_MS)
    try:
        assert reader.uuid() == uuid_of(a)
        config = host.resolve(layout.ENGINE_CONFIG)
        tmp = config.with_name("config.yaml.tmp")
        tmp.write_text(render_engine_config(b))
        os.replace(tmp, config)
        assert reader.uuid() == uuid_of(a)  # within the hour's schedule, no bump: still a
        assert notice.bump(host) == 2
        assert reader.uuid() == uuid_of(b)
    finally:
        reader.close()
    stage(a)  # the simulator's own content again, so discard finds it as staged


def test_a_replaced_counter_file_is_opened_again(staged, host: Host):
    """Discard and a new stage make a new counter file: the stat schedule opens it."""
    sim, stage = staged
    a, b = node("node-a"), node("node-b")
    stage(a)
    first = host.resolve(layout.CONFIG_GENERATION).stat().st_ino
    reader = Reader(host.resolve(STAGED_LIBRARY), interval_ms="0")
    try:
        assert reader.uuid() == uuid_of(a)

        async def discard() -> None:
            with trio.fail_after(60):
                await sim.discard(host)

        trio.run(discard)
        assert not host.exists(layout.CONFIG_GENERATION)
        stage(b)
        second = host.resolve(layout.CONFIG_GENERATION).stat().st_ino
        assert second != first
        assert reader.uuid() == uuid_of(b)
        # the new file, opened in the old one's place by the call that saw b
        assert [inode for inode, _path in reader.open_counters()] == [second]
    finally:
        log = reader.close()
    assert log.count("change notice") == 2


def test_without_a_counter_file_the_stat_schedule_still_sees_changes(tmp_path: Path,
                                                                    native: Path):
    """An older daemon writes no counter: the library falls back to stat'ing the file."""
    root = tmp_path / "root"
    a, b = node("node-a"), node("node-b")
    config = write_config(root, a)
    assert not node_path(root, layout.CONFIG_GENERATION).exists()
    reader = Reader(native / "libnvidia-ml.so.1", interval_ms="0", config=config)
    try:
        assert reader.uuid() == uuid_of(a)
        assert reader.mapped_counters() == []
        assert reader.open_counters() == []
        write_config(root, b)
        assert reader.uuid() == uuid_of(b)
    finally:
        log = reader.close()
    assert "change notice" not in log


def test_a_workload_bump_alone_re_reads_no_engine_config(tmp_path: Path, native: Path):
    """A bump for the workload file: the engine config is stat'ed, found unchanged, kept."""
    host = Host(tmp_path / "root")
    host.root.mkdir()
    a = node("node-a")
    notice.converge_announced(host, "notice-test",
                              [File(layout.ENGINE_CONFIG, render_engine_config(a))])
    reader = Reader(native / "libnvidia-ml.so.1", interval_ms=HOUR_MS,
                    config=host.resolve(layout.ENGINE_CONFIG))
    try:
        assert reader.uuid() == uuid_of(a)
        assert notice.bump(host) == 2
        assert reader.uuid() == uuid_of(a)
    finally:
        log = reader.close()
        host.discard("notice-test")
    assert "changed; re-read it" not in log
    assert node_paths(host.root) == set()


def test_converging_keeps_the_counter_file_and_its_value(host: Host):
    """Listed with its current bytes, the counter is never rewritten by rename."""
    config = File(layout.ENGINE_CONFIG, "format: 1\ndevice_count: 0\n")
    assert notice.bump(host) is None  # nothing staged yet: nothing to bump
    notice.converge_announced(host, "notice-test", [config])
    assert counter(host) == 1
    inode = host.resolve(layout.CONFIG_GENERATION).stat().st_ino
    assert notice.bump(host) == 2
    report = notice.converge_announced(host, "notice-test", [config])
    assert not report.changed  # the bumped value is what is listed: nothing to do
    assert counter(host) == 2
    assert host.resolve(layout.CONFIG_GENERATION).stat().st_ino == inode
    notice.converge_announced(host, "notice-test", [attrs.evolve(config, content="format: 1\n")])
    assert counter(host) == 3
    notice.converge_announced(host, "notice-test", [])
    assert node_paths(host.root) == set()


async def test_the_workload_simulator_bumps_and_a_running_client_sees_the_pods(
    native: Path, host: Host, tmp_path: Path,
) -> None:
    """The workload file (a pod takes GPU 3, then leaves) reaches the next call."""
    state = node("node-a")
    notice.converge_announced(host, "notice-test",
                              [File(layout.ENGINE_CONFIG, render_engine_config(state))])
    (tmp_path / "podresources-api").mkdir()
    pb2 = compile_api(tmp_path / "podresources-api")[0]
    server = PodResourcesServer(pb2, host.root / SOCKET)
    server.start()
    held = state.gpu(3).uuid
    server.allocatable = [("nvidia.com/gpu", [g.uuid for g in state.gpus])]
    reader = Reader(native / "libnvidia-ml.so.1", interval_ms=HOUR_MS,
                    config=host.resolve(layout.ENGINE_CONFIG))
    sim = WorkloadSimulator(settings=WorkloadSettings(poll_interval=0.05, call_timeout=0.5))
    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                await nursery.start(sim.run, host, state)
                await polls(sim, 1)
                idle = reader.utilization(3)
                server.pods = [Pod("team", "train", {"main": [("nvidia.com/gpu", [held])]})]
                await polls(sim, 2)
                assert host.exists(layout.WORKLOAD_CONFIG)
                assert reader.utilization(3) == min(100, idle + 60)  # one holder: 60 % more
                server.pods = []
                await polls(sim, 2)
                assert reader.utilization(3) == idle
                nursery.cancel_scope.cancel()
    finally:
        reader.close()
        server.stop()
        await sim.discard(host)
        notice.converge_announced(host, "notice-test", [])
    # what the notice and the simulator wrote is gone (``var/lib/kubelet``
    # and its parents belong to the stand-in kubelet)
    assert not [p for p in node_paths(host.root) if p.startswith("var/lib/nvml-mock")]
    assert not host.exists(layout.MOKKA_STATE_DIR)  # no bookkeeping left either


@pytest.mark.realclient
def test_reloads_announced_under_eight_threads_run_clean_under_valgrind(
    native: Path, host: Host, tmp_path: Path,
) -> None:
    """Snapshots swapped at the next call (not on a schedule) while 8 threads read them.

    The library's stat schedule is an hour away, so every re-read here comes
    from a bump, landing in the middle of other threads' calls: memcheck must
    see no invalid read of a freed snapshot and no definite leak.
    """
    valgrind = require_tool("valgrind")
    header = load_target("nvml")._exports().find_header()
    driver = tmp_path / "nvml_hammer"
    subprocess.run(
        [compiler(), "-O1", "-g", "-Wall", "-Werror", f"-I{header.parent}", str(HAMMER),
         "-o", str(driver), f"-L{native}", "-l:libnvidia-ml.so.1", "-pthread"],
        check=True, timeout=120,
    )

    def stage(name: str) -> None:
        notice.converge_announced(host, "notice-test", [
            File(layout.ENGINE_CONFIG, render_engine_config(node(name)))])

    stage("node-a")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_NVML_")}
    env.update(LD_LIBRARY_PATH=str(native), MOCK_NVML_CONFIG=str(host.resolve(
        layout.ENGINE_CONFIG)), MOCK_NVML_DEBUG="1", MOCK_NVML_RECHECK_INTERVAL_MS=HOUR_MS)
    child = subprocess.Popen(
        [valgrind, "--error-exitcode=1", "--leak-check=full",
         "--errors-for-leak-kinds=definite", "--quiet", str(driver), "8", "1.5"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "RUNNING"
        for name in ("node-b", "node-c", "node-d"):
            stage(name)
        stdout, stderr = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
        notice.converge_announced(host, "notice-test", [])
    assert child.returncode == 0, stderr[-4000:]
    assert "failures=0" in stdout
    assert "change notice" in stderr
    assert "changed; re-read it" in stderr
