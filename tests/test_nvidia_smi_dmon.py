"""The real nvidia-smi 535 monitors, ``dmon`` and ``pmon``, against the mock library.

Both ask nvidia-smi's private export table whether each GPU can be monitored
(slot 72) before sampling anything; ``dmon -s v`` reads the thermal violation
time from slot 138 and ``pmon`` the per-process engine use from slot 145
(docs/nvml.md).  Every figure they print must be the one the
public NVML getters give the same process (read here with nvidia-ml-py), so the
monitors and a monitoring agent never disagree.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.nvml_support import compiler, load_target, nvml_env, write_config

pytestmark = pytest.mark.realclient

#: Two pods hold GPU 3 (pids 200001 and 200002), as the daemon's workload file says.
WORKLOAD = (
    "format: 1\nworkload.memory_share_per_holder: 0.4\n"
    "workload.utilization_per_holder: 60\ndevice_count: 8\n"
    "device.3.process_count: 2\n"
    'device.3.process.0.pid: 200001\ndevice.3.process.0.name: "k8s:team/train-0/trainer"\n'
    'device.3.process.1.pid: 200002\ndevice.3.process.1.name: "k8s:team/train-1/trainer"\n'
)
HELD_GPU = 3
HELD_PIDS = (200001, 200002)

#: What the public getters say, per GPU, read in a child (NVML state is per process).
READINGS = """
import json, pynvml as nv
nv.nvmlInit()
out = []
for i in range(nv.nvmlDeviceGetCount()):
    h = nv.nvmlDeviceGetHandleByIndex(i)
    util = nv.nvmlDeviceGetUtilizationRates(h)
    try:
        procs = {p.pid: [p.smUtil, p.memUtil, p.encUtil, p.decUtil]
                 for p in nv.nvmlDeviceGetProcessUtilization(h, 0)}
    except nv.NVMLError_NotFound:
        procs = {}
    out.append({
        "pwr": nv.nvmlDeviceGetPowerUsage(h) // 1000,
        "gtemp": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "sm": util.gpu,
        "mem": util.memory,
        "mclk": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "pclk": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_GRAPHICS),
        "processes": procs,
    })
print(json.dumps(out))
"""


def stage(root: Path, state: State, workload: str | None) -> Path:
    config = write_config(root, state)
    if workload is not None:
        (config.parent / "workload.yaml").write_text(workload)
    return config


def run(binary: Path, native: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(binary), *args],
        env=nvml_env(native, config),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result


def readings(native: Path, config: Path) -> list[dict]:
    result = run(Path(sys.executable), native, config, "-c", READINGS)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def table(out: str) -> tuple[list[str], list[list[str]]]:
    """The column names (first header line) and the data rows of a monitor's output."""
    lines = [line for line in out.splitlines() if line.strip()]
    headers = [line for line in lines if line.startswith("#")]
    assert len(headers) == 2, out
    names = headers[0].lstrip("#").split()
    return names, [line.split() for line in lines if not line.startswith("#")]


@pytest.mark.parametrize(("profile", "workload"), [("h100", WORKLOAD), ("gb200", None)])
def test_dmon_prints_two_samples_of_every_gpu(
    native: Path, smi: Path, tmp_path: Path, profile: str, workload: str | None
):
    state = compile_profile(profile, node_name="worker-1")
    config = stage(tmp_path, state, workload)
    result = run(smi, native, config, "dmon", "-c", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Not supported" not in result.stdout
    names, rows = table(result.stdout)
    assert names[:12] == ["gpu", "pwr", "gtemp", "mtemp", "sm", "mem", "enc", "dec", "jpg",
                          "ofa", "mclk", "pclk"]
    # exactly two samples: rows for GPUs 0..n-1, then again
    assert [int(row[0]) for row in rows] == list(range(len(state.gpus))) * 2
    expected = readings(native, config)
    for row in rows:
        gpu = int(row[0])
        got = dict(zip(names, row, strict=True))
        want = expected[gpu]
        for column in ("pwr", "gtemp", "sm", "mem", "mclk", "pclk"):
            assert int(got[column]) == want[column], (gpu, column, got, want)
        memory_c = state.gpus[gpu].fields["thermal"]["temperature_memory_c"]
        assert int(got["mtemp"]) == memory_c
    if workload is not None:
        # the held GPU is busy and the others idle, in both samples
        busy = [row for row in rows if int(row[0]) == HELD_GPU]
        idle = [row for row in rows if int(row[0]) != HELD_GPU]
        assert all(int(row[4]) == 100 for row in busy)
        assert all(int(row[4]) == 0 for row in idle)


def test_dmon_flags_the_gpu_held_down_by_a_thermal_slowdown(
    native: Path, smi: Path, tmp_path: Path
):
    """tviol (slot 138) is 1 for a sample in which the thermal policy's
    violation time grew: only on the GPU whose profile has the SW thermal
    slowdown active, and only from the second sample (the first has no
    earlier reading to compare with)."""
    state = compile_profile("h100", node_name="worker-1")
    hot = 5
    gpus = []
    for gpu in state.gpus:
        if gpu.index == hot:
            fields = copy.deepcopy(dict(gpu.fields))
            fields["clocks_throttle_reasons"]["sw_thermal_slowdown"] = True
            gpu = attrs.evolve(gpu, fields=fields)
        gpus.append(gpu)
    config = stage(tmp_path, attrs.evolve(state, gpus=tuple(gpus)), None)
    result = run(smi, native, config, "dmon", "-c", "2", "-s", "v")
    assert result.returncode == 0, result.stdout + result.stderr
    names, rows = table(result.stdout)
    assert names == ["gpu", "pviol", "tviol"]
    first, second = rows[: len(gpus)], rows[len(gpus):]
    assert [row[2] for row in first] == ["0"] * len(gpus)
    assert [row[2] for row in second] == ["1" if i == hot else "0" for i in range(len(gpus))]
    assert all(row[1] == "0" for row in rows)  # no power cap on an idle node


def test_pmon_lists_the_pods_processes_with_their_engine_use(
    native: Path, smi: Path, tmp_path: Path
):
    state = compile_profile("h100", node_name="worker-1")
    config = stage(tmp_path, state, WORKLOAD)
    result = run(smi, native, config, "pmon", "-c", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    names, rows = table(result.stdout)
    assert names == ["gpu", "pid", "type", "sm", "mem", "enc", "dec", "command"]
    expected = readings(native, config)[HELD_GPU]["processes"]
    held = {int(row[1]): row for row in rows if int(row[0]) == HELD_GPU}
    assert sorted(held) == list(HELD_PIDS)
    for pid, row in held.items():
        assert row[2] == "C"  # pods run compute processes
        assert [int(v) for v in row[3:7]] == expected[str(pid)], row
        assert int(row[3]) > 0
    # every other GPU: one row with no process
    others = [row for row in rows if int(row[0]) != HELD_GPU]
    assert [int(row[0]) for row in others] == [i for i in range(8) if i != HELD_GPU]
    assert all(row[1:] == ["-"] * 7 for row in others)


def test_pmon_on_an_idle_node_lists_no_process(native: Path, smi: Path, tmp_path: Path):
    state = compile_profile("gb200", node_name="worker-1")
    result = run(smi, native, stage(tmp_path, state, None), "pmon", "-c", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    _, rows = table(result.stdout)
    assert rows == [[str(i)] + ["-"] * 7 for i in range(len(state.gpus))]


def test_without_the_monitoring_slot_the_monitors_refuse(smi: Path, tmp_path: Path):
    """The proof that slot 72 is what they need: a table that ends at it (its
    offset 0x240 is no longer below the size) gives nvidia-smi's refusal."""
    native = tmp_path / "native"
    load_target("nvml").build(native, compiler(), ["-DMOCK_EXPORT_TABLE_BYTES=0x240"])
    config = stage(tmp_path, compile_profile("h100", node_name="worker-1"), None)
    for command in ("dmon", "pmon"):
        result = run(smi, native, config, command, "-c", "1")
        assert "Not supported on the device(s)" in result.stdout, (command, result.stdout)
