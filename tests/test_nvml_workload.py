"""Held GPUs look busy to real clients, and idle again once the pod is gone.

The whole chain is real: a gRPC pod-resources server on a unix socket under
the node root (tests/podresources_support.py), the workload simulator
polling it and writing the workload file, the mock NVML library built from
the tree reading that file beside the engine config, and the real
nvidia-smi 535 and nvidia-ml-py reading the library in fresh processes.
The simulator runs on trio's real clock (its gRPC calls run in threads);
every wait is on its poll counter, bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from mokka import layout
from mokka.noderoot.host import File, Host
from mokka.simulators.gpudriver import notice
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.simulators.workload import WorkloadSettings, WorkloadSimulator
from mokka.state.compile import compile_profile
from mokka.state.model import State
from mokka.state.profile import read_profile_text
from tests.nvml_support import compiler, load_target, nvml_env, write_config
from tests.podresources_support import (
    Pod,
    PodResourcesServer,
    pb2_fixture,  # noqa: F401  (a fixture: tests name it pb2)
    server_fixture,  # noqa: F401  (a fixture: tests name it server)
)
from tests.support import require_tool

READINGS = Path(__file__).resolve().parent / "nvml_readings_probe.py"
SMI_QUERY = "--query-gpu=index,memory.used,utilization.gpu,power.draw,temperature.gpu"
SMI_APPS = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"
HAMMER = Path(__file__).resolve().parent / "nvml_hammer.c"


@pytest.fixture
def h100() -> State:
    return compile_profile("h100", node_name="node-a")


def smi_csv(smi: Path, native: Path, config: Path, query: str) -> list[list[str]]:
    result = subprocess.run([str(smi), query, "--format=csv,noheader,nounits"],
                            env=nvml_env(native, config), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return [[cell.strip() for cell in row] for row in csv.reader(io.StringIO(result.stdout))
            if row]


def smi_text(smi: Path, native: Path, config: Path, *args: str) -> str:
    result = subprocess.run([str(smi), *args], env=nvml_env(native, config),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def pynvml_readings(native: Path, config: Path) -> dict[str, Any]:
    result = subprocess.run([sys.executable, str(READINGS)], env=nvml_env(native, config),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["instants"][0]


async def polls(sim: WorkloadSimulator, count: int) -> None:
    target = sim.polls.value + count
    await sim.polls.wait_value(lambda value: value >= target)


async def look(smi: Path, native: Path, config: Path) -> dict[str, Any]:
    """What nvidia-smi (query, apps, table) and nvidia-ml-py show now."""
    def run() -> dict[str, Any]:
        return {
            "gpus": smi_csv(smi, native, config, SMI_QUERY),
            "apps": smi_csv(smi, native, config, SMI_APPS),
            "table": smi_text(smi, native, config),
            "nvml": pynvml_readings(native, config),
        }
    return await trio.to_thread.run_sync(run)


def assert_idle(seen: dict[str, Any], idle: dict[str, Any]) -> None:
    assert seen["apps"] == []
    assert "No running processes found" in seen["table"]
    assert seen["gpus"] == idle["gpus"]
    for index, reading in seen["nvml"].items():
        assert reading == idle["nvml"][index]
        assert reading["processes"] == []


async def test_real_clients_see_held_gpus_busy_and_idle_again(
    native: Path, smi: Path, host: Host, node_root: Path, h100: State,
    server: PodResourcesServer,
) -> None:
    config = write_config(node_root, h100)
    assert config.parent == (node_root / layout.WORKLOAD_CONFIG.lstrip("/")).parent
    held = h100.gpu(3).uuid
    server.allocatable = [("nvidia.com/gpu", [g.uuid for g in h100.gpus])]
    sim = WorkloadSimulator(settings=WorkloadSettings(poll_interval=0.05, call_timeout=0.5))
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, host, h100)
            await polls(sim, 1)
            idle = await look(smi, native, config)
            idle_gpu3 = idle["nvml"]["3"]
            assert idle_gpu3["util_gpu"] == 0
            assert idle["gpus"][3][1:] == ["0", "0", "68.92", "29"]

            # one pod holds GPU 3; a second one shares it by time-slicing
            server.pods = [
                Pod("team", "train", {"main": [("nvidia.com/gpu", [held])]}),
                Pod("lab", "infer", {"server": [("nvidia.com/gpu.shared", [f"{held}::1"])]}),
            ]
            await polls(sim, 2)
            busy = await look(smi, native, config)
            nvml = busy["nvml"]["3"]
            names = sorted(p["name"] for p in nvml["processes"])
            assert names == ["k8s:lab/infer/server", "k8s:team/train/main"]
            share = int(nvml["memory_total"] * 0.4)
            assert all(p["used"] == share for p in nvml["processes"])
            assert nvml["memory_used"] > idle_gpu3["memory_used"] + 2 * share - 2**20
            assert nvml["util_gpu"] == 100  # two holders x 60 %, capped
            # a fully busy board draws its limit, is power-capped, runs warm
            # but below its slowdown point, and clocks below its boost clock
            assert nvml["power_mw"] == nvml["power_limit_mw"]
            assert idle_gpu3["temperature_c"] < nvml["temperature_c"] < nvml["slowdown_c"]
            assert nvml["reasons"] & 0x4  # SW power cap
            assert idle_gpu3["sm_clock_mhz"] < nvml["sm_clock_mhz"] < nvml["sm_max_mhz"]
            for index in ("0", "1", "2", "4", "5", "6", "7"):
                assert busy["nvml"][index] == idle["nvml"][index]

            # nvidia-smi shows the same board: query, process list and table
            gpu3 = busy["gpus"][3]
            assert int(gpu3[1]) == nvml["memory_used"] // 2**20
            assert gpu3[2:] == ["100", f"{nvml['power_mw'] / 1000:.2f}",
                                str(nvml["temperature_c"])]
            assert sorted(row[2] for row in busy["apps"]) == names
            assert {row[0] for row in busy["apps"]} == {held}
            assert sorted(int(row[1]) for row in busy["apps"]) == sorted(
                p["pid"] for p in nvml["processes"])
            assert {row[3] for row in busy["apps"]} == {str(share // 2**20)}
            for name in names:
                assert name in busy["table"]

            # the pods go: every reading returns to idle
            server.pods = []
            await polls(sim, 2)
            assert_idle(await look(smi, native, config), idle)
            nursery.cancel_scope.cancel()
    await sim.discard(host)


def test_a_damaged_workload_file_is_ignored_and_a_missing_one_is_idle(
    native: Path, node_root: Path, h100: State,
) -> None:
    config = write_config(node_root, h100)
    workload = config.parent / "workload.yaml"
    idle = pynvml_readings(native, config)
    for damage in ("format: 2\ndevice_count: 8\ndevice.0.process_count: 1\n",
                   "not a line of the format\n", "\0" * 10):
        workload.write_text(damage)
        result = subprocess.run([sys.executable, str(READINGS)],
                                env=nvml_env(native, config, MOCK_NVML_DEBUG="1"),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["instants"][0] == idle
        assert f"workload file {workload} ignored (every GPU idle)" in result.stderr
    workload.unlink()
    assert pynvml_readings(native, config) == idle


def test_a_running_reader_follows_the_workload_file(native: Path, node_root: Path,
                                                   h100: State) -> None:
    """A long-lived process picks up a new workload file on the config's schedule."""
    config = write_config(node_root, h100)
    workload = config.parent / "workload.yaml"
    script = (
        "import pynvml as nv, sys, time\n"
        "nv.nvmlInit(); h = nv.nvmlDeviceGetHandleByIndex(0)\n"
        "print(nv.nvmlDeviceGetUtilizationRates(h).gpu, flush=True)\n"
        "sys.stdin.readline()\n"
        "deadline = time.monotonic() + 10\n"
        "while time.monotonic() < deadline:\n"
        "    if nv.nvmlDeviceGetUtilizationRates(h).gpu:\n"
        "        break\n"
        "    time.sleep(0.05)\n"
        "procs = nv.nvmlDeviceGetComputeRunningProcesses(h)\n"
        "print(nv.nvmlDeviceGetUtilizationRates(h).gpu, len(procs))\n"
    )
    with subprocess.Popen([sys.executable, "-c", script], env=nvml_env(native, config),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline().strip() == "0"
        workload.write_text(
            "format: 1\nworkload.memory_share_per_holder: 0.25\n"
            "workload.utilization_per_holder: 35\ndevice_count: 8\n"
            "device.0.process_count: 1\ndevice.0.process.0.pid: 200001\n"
            'device.0.process.0.name: "k8s:a/b/c"\n')
        child.stdin.write("go\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=30)
    assert out.split() == ["35", "1"]


FEEDS = """
import json, pynvml as nv
nv.nvmlInit()
out = {}
for i in (0, 3):
    h = nv.nvmlDeviceGetHandleByIndex(i)
    _, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)
    _, power_samples = nv.nvmlDeviceGetSamples(h, nv.NVML_TOTAL_POWER_SAMPLES, 0)
    fields = nv.nvmlDeviceGetFieldValues(h, [
        nv.NVML_FI_DEV_POWER_INSTANT, (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)])
    try:
        procs = sorted(p.pid for p in nv.nvmlDeviceGetProcessUtilization(h, 0))
    except nv.NVMLError_NotFound:
        procs = []
    out[i] = {
        "util_samples": sorted({s.sampleValue.uiVal for s in samples}),
        "power_samples": sorted({s.sampleValue.uiVal for s in power_samples}),
        "power_field": fields[0].value.uiVal,
        "nvlink_tx_kib": fields[1].value.ullVal,
        "power": nv.nvmlDeviceGetPowerUsage(h),
        "process_utilization": procs,
        "processes": sorted(p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)),
        "graphics": [p.pid for p in nv.nvmlDeviceGetGraphicsRunningProcesses(h)],
    }
print(json.dumps(out))
"""


def test_readings_feed_samples_fields_process_utilization_and_nvlink(
    native: Path, node_root: Path, h100: State,
) -> None:
    config = write_config(node_root, h100)
    (config.parent / "workload.yaml").write_text(
        "format: 1\nworkload.memory_share_per_holder: 0.4\n"
        "workload.utilization_per_holder: 60\ndevice_count: 8\n"
        "device.3.process_count: 2\n"
        'device.3.process.0.pid: 200001\ndevice.3.process.0.name: "k8s:a/b/c"\n'
        'device.3.process.1.pid: 200002\ndevice.3.process.1.name: "k8s:a/d/c"\n')
    result = subprocess.run([sys.executable, "-c", FEEDS], env=nvml_env(native, config),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    idle, held = (json.loads(result.stdout)[key] for key in ("0", "3"))
    assert idle["util_samples"] == [0]
    assert held["util_samples"] == [100]
    assert idle["power_samples"] == [idle["power"]] == [idle["power_field"]] == [68920]
    assert held["power_samples"] == [held["power"]] == [held["power_field"]] == [700000]
    assert held["processes"] == held["process_utilization"] == [200001, 200002]
    assert idle["processes"] == idle["process_utilization"] == []
    assert held["graphics"] == idle["graphics"] == []  # pods run compute processes
    # NVLink traffic accrues at the utilization's share of the bandwidth
    assert idle["nvlink_tx_kib"] == 0 < held["nvlink_tx_kib"]


def holders_file(device: int, count: int, share: float = 0.4, util: int = 60) -> str:
    lines = [f"format: 1\nworkload.memory_share_per_holder: {share}\n"
             f"workload.utilization_per_holder: {util}\ndevice_count: 8\n"
             f"device.{device}.process_count: {count}\n"]
    lines += [f'device.{device}.process.{i}.pid: {300000 + i}\n'
              f'device.{device}.process.{i}.name: "k8s:ns/pod-{i}/main"\n' for i in range(count)]
    return "".join(lines)


def test_every_holder_is_listed_however_many_hold_the_gpu(native: Path, node_root: Path,
                                                           h100: State) -> None:
    """Past the lock-free table's 64 PIDs the list is read from the file itself."""
    config = write_config(node_root, h100)
    for count in (1, 64, 65, 150):
        (config.parent / "workload.yaml").write_text(holders_file(2, count, share=0.001))
        nvml = pynvml_readings(native, config)["2"]
        assert [p["pid"] for p in nvml["processes"]] == [300000 + i for i in range(count)]
        assert nvml["processes"][-1]["name"] == f"k8s:ns/pod-{count - 1}/main"
        assert {p["used"] for p in nvml["processes"]} == {int(nvml["memory_total"] * 0.001)}


def test_a_held_board_runs_in_p0_and_nvidia_smi_agrees(native: Path, smi: Path,
                                                       node_root: Path, tmp_path: Path) -> None:
    doc = yaml.safe_load(read_profile_text("h100")[1])
    doc["device_defaults"]["performance_state"] = "P8"
    doc["device_defaults"]["power"]["power_state"] = "P8"
    (tmp_path / "p8.yaml").write_text(yaml.safe_dump(doc))
    config = write_config(node_root, compile_profile(tmp_path / "p8.yaml", node_name="node-a"))
    (config.parent / "workload.yaml").write_text(holders_file(3, 1))
    script = ("import json, pynvml as nv\nnv.nvmlInit()\n"
              "handles = map(nv.nvmlDeviceGetHandleByIndex, range(8))\n"
              "print(json.dumps([nv.nvmlDeviceGetPerformanceState(h) for h in handles]))\n")
    result = subprocess.run([sys.executable, "-c", script], env=nvml_env(native, config),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [8, 8, 8, 0, 8, 8, 8, 8]
    rows = smi_csv(smi, native, config, "--query-gpu=index,pstate")
    assert rows == [[str(i), "P0" if i == 3 else "P8"] for i in range(8)]
    table = smi_text(smi, native, config, "-q", "-i", "3")
    assert [line.split(":")[1].strip() for line in table.splitlines()
            if line.strip().startswith("Performance State")] == ["P0"]


#: One NVML call per line read, with the clock pinned (one tick for ever):
#: ``util`` (GPU percent of device 0) or ``procs`` (its compute processes).
PINNED_READER = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
assert lib.nvmlInit_v2() == 0
handle = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
rates = (ctypes.c_uint * 2)()
count = ctypes.c_uint()
print("READY", flush=True)
for line in sys.stdin:
    if line.strip() == "util":
        assert lib.nvmlDeviceGetUtilizationRates(handle, rates) == 0
        print(rates[0], flush=True)
    else:
        count.value = 0
        code = lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), None)
        assert code in (0, 7)  # success, or insufficient size: a size query
        print(count.value, flush=True)
"""


def test_a_bump_is_seen_by_the_next_call_even_within_one_clock_tick(native: Path,
                                                                   tmp_path: Path) -> None:
    """The readings cache is keyed by the workload file and the config, not only the clock."""
    host = Host(tmp_path / "root")
    host.root.mkdir()
    owner = "cache-test"
    state = compile_profile("h100", node_name="node-a")
    notice.converge_announced(host, owner,
                              [File(layout.ENGINE_CONFIG, render_engine_config(state))])
    config = host.resolve(layout.ENGINE_CONFIG)
    workload = config.parent / "workload.yaml"
    env = nvml_env(native, config, MOCK_NVML_CLOCK_OVERRIDE="1795996800.0",
                   MOCK_NVML_RECHECK_INTERVAL_MS="3600000")
    with subprocess.Popen([sys.executable, "-c", PINNED_READER,
                           str(native / "libnvidia-ml.so.1")], env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as reader:
        assert reader.stdin is not None
        assert reader.stdout is not None

        def call(command: str) -> int:
            reader.stdin.write(command + "\n")
            reader.stdin.flush()
            return int(reader.stdout.readline())

        def place(text: str) -> None:
            workload.with_suffix(".tmp").write_text(text)
            os.replace(workload.with_suffix(".tmp"), workload)
            notice.bump(host)

        try:
            assert reader.stdout.readline().strip() == "READY"
            assert (call("util"), call("procs")) == (0, 0)
            place(holders_file(0, 1, util=35))
            assert (call("util"), call("procs")) == (35, 1)
            place(holders_file(0, 2, util=35))
            assert (call("util"), call("procs")) == (70, 2)
            # a new config (a pattern beats the holders) within the same tick
            doc = yaml.safe_load(read_profile_text("h100")[1])
            doc["device_defaults"]["dynamics"] = {
                "utilization": {"pattern": "steady", "value": 12}}
            (tmp_path / "steady.yaml").write_text(yaml.safe_dump(doc))
            notice.converge_announced(host, owner, [File(
                layout.ENGINE_CONFIG, render_engine_config(
                    compile_profile(tmp_path / "steady.yaml", node_name="node-a")))])
            assert (call("util"), call("procs")) == (12, 2)
            workload.unlink()
            notice.bump(host)
            assert (call("procs"), call("util")) == (0, 12)
        finally:
            reader.stdin.close()
            assert reader.wait(timeout=60) == 0
            workload.unlink(missing_ok=True)
            host.discard(owner)


def test_eight_threads_on_held_and_moving_boards_run_clean_under_valgrind(
    native: Path, tmp_path: Path,
) -> None:
    """The readings cache and the lock-free holder tables under contention.

    tests/nvml_hammer.c's threads read memory and temperature (derived
    readings) of every GPU, each moving with a noise pattern, while the
    workload file that holds some of them is replaced under them.
    """
    valgrind = require_tool("valgrind")
    header = load_target("nvml")._exports().find_header()
    driver = tmp_path / "nvml_hammer"
    subprocess.run([compiler(), "-O1", "-g", "-Wall", "-Werror", f"-I{header.parent}",
                    str(HAMMER), "-o", str(driver), f"-L{native}", "-l:libnvidia-ml.so.1",
                    "-pthread"], check=True)
    doc = yaml.safe_load(read_profile_text("h100")[1])
    doc["device_defaults"]["dynamics"] = {
        "step_s": 0.01, "utilization": {"pattern": "noise", "mean": 50, "amplitude": 50,
                                        "seed": 5}}
    (tmp_path / "moving.yaml").write_text(yaml.safe_dump(doc))
    config = write_config(tmp_path, compile_profile(tmp_path / "moving.yaml",
                                                    node_name="worker-1"))
    workload = config.parent / "workload.yaml"
    workload.write_text(holders_file(2, 3))
    child = subprocess.Popen(
        [valgrind, "--error-exitcode=1", "--leak-check=full", "--errors-for-leak-kinds=definite",
         "--quiet", str(driver), "8", "1.5"],
        env=nvml_env(native, config, MOCK_NVML_RECHECK_INTERVAL_MS="0"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "RUNNING"
        for count in (1, 70, 0, 2):
            tmp = workload.with_suffix(".tmp")
            tmp.write_text(holders_file(4, count))
            os.replace(tmp, workload)
        stdout, stderr = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, stderr[-4000:]
    assert "failures=0" in stdout
