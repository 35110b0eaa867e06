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
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from mokka import layout
from mokka.host import Host
from mokka.simulators.workload import WorkloadSettings, WorkloadSimulator
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.nvml_support import nvml_env, write_config
from tests.podresources_support import Pod, PodResourcesServer, compile_api

SOCKET = "var/lib/kubelet/pod-resources/kubelet.sock"
READINGS = Path(__file__).resolve().parent / "nvml_readings_probe.py"
SMI_QUERY = "--query-gpu=index,memory.used,utilization.gpu,power.draw,temperature.gpu"
SMI_APPS = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"


@pytest.fixture(scope="module")
def pb2(tmp_path_factory: pytest.TempPathFactory):
    return compile_api(tmp_path_factory.mktemp("podresources-api"))[0]


@pytest.fixture
def server(pb2, node_root: Path):
    server = PodResourcesServer(pb2, node_root / SOCKET)
    server.start()
    yield server
    server.stop()


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
