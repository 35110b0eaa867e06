"""Sample buffers, process utilization, violation status, thermal settings,
auto boost, temperature thresholds, retired pages and GPM, through the real
nvidia-smi 535 and nvidia-ml-py.

Every figure follows the simulated board: the profile, then what `mokka
ctl` overrides.  Features the real board has must answer; features it
lacks (GPM before Hopper, auto boost on data center boards) must not.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mokka.ctl import command as ctl
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.nvml_support import nvml_env, run_smi, write_config

pytestmark = pytest.mark.realclient

PROFILES = Path(__file__).resolve().parent.parent / "mokka" / "state" / "profiles"

NOT_SUPPORTED, NOT_FOUND = 3, 6
SAMPLE_BUFFER = 120
#: CLOCK_REALTIME_COARSE's id (Linux), the clock the violation meters count on.
REALTIME_COARSE = 5


def profile_with(tmp_path: Path, name: str, defaults: dict[str, Any]) -> Path:
    """A copy of a built-in profile with more ``device_defaults`` (one level deep)."""
    document = yaml.safe_load((PROFILES / f"{name}.yaml").read_text())
    for block, values in defaults.items():
        document["device_defaults"].setdefault(block, {}).update(values)
    path = tmp_path / f"{name}-custom.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def state_with(profile: str | Path, tmp_path: Path, *ctl_calls: list[str],
               document: dict[str, Any] | None = None) -> State:
    """The profile compiled with overrides: a document and/or ``mokka ctl`` calls."""
    overrides = tmp_path / "overrides.yaml"
    tmp_path.mkdir(parents=True, exist_ok=True)
    if document is not None:
        overrides.write_text(yaml.safe_dump({"version": 1, **document}))
    for call in ctl_calls:
        verb, *rest = call
        assert ctl.main([verb, "--file", str(overrides), *rest]) == 0
    used = overrides if overrides.exists() else None
    return compile_profile(profile, node_name="worker-1", overrides=used)


def run_pynvml(native: Path, config: Path, script: str, *args: str) -> Any:
    """Run ``script`` (which prints one JSON document) against the library."""
    result = subprocess.run(
        [sys.executable, "-c", "import json, sys, time\nimport pynvml as nv\nnv.nvmlInit()\n"
         + script, *args],
        env=nvml_env(native, config), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def sample_sections(out: str) -> dict[str, dict[str, str]]:
    """The "... Samples" blocks of ``nvidia-smi -q`` for one GPU: name -> {key: value}."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in out.splitlines():
        if re.match(r"^    \S.*Samples$", line):
            current = sections.setdefault(line.strip(), {})
        elif current is not None and line.startswith("        ") and ":" in line:
            key, value = line.split(":", 1)
            current[key.strip()] = value.strip()
        else:
            current = None
    return sections


def test_nvidia_smi_samples_follow_ctl_overrides(native: Path, smi: Path, tmp_path: Path):
    state = state_with(
        "h100", tmp_path,
        ["util", "--gpu", "0", "--gpu-pct", "80", "--mem-pct", "40"],
        ["power", "--gpu", "0", "--watts", "512.5"],
        ["clocks", "--gpu", "0", "--graphics", "1755", "--memory", "2619"],
    )
    result = run_smi(smi, native, write_config(tmp_path, state), "-q", "-i", "0", "-d",
                     "UTILIZATION,POWER,CLOCK,PERFORMANCE,TEMPERATURE,PAGE_RETIREMENT")
    assert result.returncode == 0, result.stdout + result.stderr
    sections = sample_sections(result.stdout)
    expected = {
        "GPU Utilization Samples": "80 %",
        "Memory Utilization Samples": "40 %",
        "ENC Utilization Samples": "0 %",
        "DEC Utilization Samples": "0 %",
        "Power Samples": "512.50 W",
        "SM Clock Samples": "1755 MHz",
        "Memory Clock Samples": "2619 MHz",
    }
    assert set(sections) == set(expected)
    for name, value in expected.items():
        assert sections[name] == {
            "Duration": f"{(SAMPLE_BUFFER - 1) / 6:.2f} sec",
            "Number of Samples": str(SAMPLE_BUFFER),
            "Max": value, "Min": value, "Avg": value,
        }, name


SAMPLES_SCRIPT = """
handle = nv.nvmlDeviceGetHandleByIndex(0)
out = {}
for kind in range(10):
    try:
        vtype, samples = nv.nvmlDeviceGetSamples(handle, kind, 0)
        out[kind] = {"type": vtype, "stamps": [s.timeStamp for s in samples],
                     "values": sorted({s.sampleValue.uiVal for s in samples})}
    except nv.NVMLError as error:
        out[kind] = {"error": error.value}
newest = out[1]["stamps"][-1]
try:
    _, recent = nv.nvmlDeviceGetSamples(handle, 1, newest)
    out["after_newest"] = [s.timeStamp for s in recent]
except nv.NVMLError as error:
    out["after_newest"] = {"error": error.value}
_, recent = nv.nvmlDeviceGetSamples(handle, 1, newest - 2 * 166667)
out["after_two_periods"] = [s.timeStamp for s in recent]
out["newest"] = newest
# what the getters read at the same time: pinned utilization loads the board
out["now"] = {"0": nv.nvmlDeviceGetPowerUsage(handle),
              "2": nv.nvmlDeviceGetUtilizationRates(handle).memory,
              "5": nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
              "6": nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM)}
print(json.dumps(out))
"""


def test_get_samples_per_type_and_since_a_timestamp(native: Path, tmp_path: Path):
    state = state_with("h100", tmp_path, ["util", "--gpu", "0", "--gpu-pct", "65"])
    got = run_pynvml(native, write_config(tmp_path, state), SAMPLES_SCRIPT)
    gpu = state.gpus[0].fields
    now = got["now"]
    # 65 % pinned loads the board as a workload would (docs/nvml.md, linked readings)
    assert now["5"] > gpu["clocks"]["sm_current"]
    assert now["0"] > gpu["power"]["current_draw_mw"]
    expected = {
        "0": now["0"], "1": 65, "2": now["2"],
        "3": 0, "4": 0, "5": now["5"], "6": now["6"],
        "8": 0, "9": 0,
    }
    for kind, value in expected.items():
        assert got[kind]["type"] == 1  # unsigned int
        assert got[kind]["values"] == [value], kind
        stamps = got[kind]["stamps"]
        assert len(stamps) == SAMPLE_BUFFER
        # oldest first, one sampling period apart
        assert {b - a for a, b in itertools.pairwise(stamps)} == {166667}
    # module power: only Grace-attached modules report it
    assert got["7"] == {"error": NOT_SUPPORTED}
    newest = got["newest"]
    # nothing newer than the newest, unless a new period began in between
    after = got["after_newest"]
    assert after == {"error": NOT_FOUND} or all(t > newest for t in after)
    assert 2 <= len(got["after_two_periods"]) <= 3
    assert all(t > newest - 2 * 166667 for t in got["after_two_periods"])


PROCESS_SCRIPT = """
handle = nv.nvmlDeviceGetHandleByIndex(int(sys.argv[1]))
out = {}
try:
    out["samples"] = sorted(
        [s.pid, s.smUtil, s.memUtil, s.encUtil, s.decUtil]
        for s in nv.nvmlDeviceGetProcessUtilization(handle, 0))
except nv.NVMLError as error:
    out["samples"] = {"error": error.value}
print(json.dumps(out))
"""


def test_process_utilization_shares_the_device_utilization(native: Path, tmp_path: Path):
    processes = [
        {"pid": 4242, "type": "compute", "used_memory_bytes": 1 << 30},
        {"pid": 4343, "type": "compute", "used_memory_bytes": 1 << 30},
        {"pid": 4444, "type": "compute", "used_memory_bytes": 1 << 30, "sm_util": 7},
    ]
    state = state_with(
        "h100", tmp_path, ["util", "--gpu", "0", "--gpu-pct", "90", "--mem-pct", "60"],
        document={"devices": {"0": {"processes": processes},
                              "1": {"processes": processes[:2]}}},
    )
    config = write_config(tmp_path, state)
    got = run_pynvml(native, config, PROCESS_SCRIPT, "0")
    assert got["samples"] == [[4242, 30, 20, 0, 0], [4343, 30, 20, 0, 0], [4444, 7, 20, 0, 0]]
    # GPU 1 is idle: NVML reports no process that did nothing
    assert run_pynvml(native, config, PROCESS_SCRIPT, "1") == {"samples": {"error": NOT_FOUND}}
    # no processes at all
    assert run_pynvml(native, config, PROCESS_SCRIPT, "2") == {"samples": {"error": NOT_FOUND}}


VIOLATION_SCRIPT = """
handle = nv.nvmlDeviceGetHandleByIndex(0)
POWER, THERMAL, LOW_UTIL, TOTAL_BASE = 0, 1, 4, 11
def read(policy):
    v = nv.nvmlDeviceGetViolationStatus(handle, policy)
    return v.violationTime, v.referenceTime
start = time.monotonic()
first = {p: read(p) for p in (POWER, THERMAL, LOW_UTIL, TOTAL_BASE)}
reads = 0
while read(POWER)[0] - first[POWER][0] < 1000 and time.monotonic() - start < 20:
    reads += 1
last = {p: read(p) for p in (POWER, THERMAL, LOW_UTIL, TOTAL_BASE)}
elapsed = time.monotonic() - start
try:
    nv.nvmlDeviceGetViolationStatus(handle, 7)
    bad = 0
except nv.NVMLError as error:
    bad = error.value
print(json.dumps({"first": first, "last": last, "elapsed": elapsed, "bad": bad}))
"""


def test_violation_time_grows_while_its_reason_is_active(native: Path, tmp_path: Path):
    state = state_with("h100", tmp_path,
                       ["throttle", "--gpu", "0", "--reasons", "sw_power_cap"])
    got = run_pynvml(native, write_config(tmp_path, state), VIOLATION_SCRIPT)
    first = {int(k): v for k, v in got["first"].items()}
    last = {int(k): v for k, v in got["last"].items()}
    power = last[0][0] - first[0][0]
    # the meter counts on CLOCK_REALTIME_COARSE (clock id 5, which Python's
    # time module does not name): whole kernel ticks (docs/nvml.md)
    tick_ns = time.clock_getres(REALTIME_COARSE) * 1e9
    assert 1000 <= power <= got["elapsed"] * 1e9 + tick_ns
    assert last[11][0] > first[11][0]  # held below base clocks too
    assert last[1][0] == first[1][0] == 0  # no thermal slowdown
    assert last[4][0] == first[4][0] == 0  # not idle: the throttle replaced gpu_idle
    assert last[0][1] >= first[0][1] > 0  # wall-clock microseconds
    assert got["bad"] == 2  # INVALID_ARGUMENT: no policy 7


THERMAL_SCRIPT = """
handle = nv.nvmlDeviceGetHandleByIndex(0)
def settings(index):
    s = nv.c_nvmlGpuThermalSettings_t()
    try:
        nv.nvmlDeviceGetThermalSettings(handle, index, nv.byref(s))
    except nv.NVMLError as error:
        return {"error": error.value}
    return [s.count] + [[s.sensor[i].controller, s.sensor[i].defaultMinTemp,
                         s.sensor[i].defaultMaxTemp, s.sensor[i].currentTemp,
                         s.sensor[i].target] for i in range(s.count)]
out = {"all": settings(15), "first": settings(0), "second": settings(1)}
def threshold(kind):
    try:
        return nv.nvmlDeviceGetTemperatureThreshold(handle, kind)
    except nv.NVMLError as error:
        return {"error": error.value}
out["thresholds"] = [threshold(kind) for kind in range(8)]
try:
    out["auto_boost"] = list(nv.nvmlDeviceGetAutoBoostedClocksEnabled(handle))
except nv.NVMLError as error:
    out["auto_boost"] = {"error": error.value}
print(json.dumps(out))
"""


def test_thermal_settings_thresholds_and_auto_boost(native: Path, tmp_path: Path):
    state = state_with("h100", tmp_path, ["temp", "--gpu", "0", "--celsius", "61"])
    got = run_pynvml(native, write_config(tmp_path, state), THERMAL_SCRIPT)
    gpu_internal, target_gpu, target_memory = 1, 1, 2
    thermal = state.gpus[0].fields["thermal"]
    gpu_sensor = [gpu_internal, 0, thermal["shutdown_threshold_c"], 61, target_gpu]
    memory_sensor = [gpu_internal, 0, thermal["max_memory_operating_c"],
                     thermal["temperature_memory_c"], target_memory]
    assert got["all"] == [2, gpu_sensor, memory_sensor]
    assert got["first"] == [1, gpu_sensor]
    assert got["second"] == [1, memory_sensor]
    # shutdown, slowdown, memory max, GPU max as the H100 reports them; no
    # acoustic or GPS targets on a data center board
    assert got["thresholds"] == [92, 89, 95, 87] + [{"error": NOT_SUPPORTED}] * 4
    # the H100 capture prints Auto Boost: N/A
    assert got["auto_boost"] == {"error": NOT_SUPPORTED}


def test_auto_boost_where_the_profile_has_it(native: Path, tmp_path: Path):
    profile = profile_with(tmp_path, "t4", {"clocks": {"auto_boost": True,
                                                       "auto_boost_default": False}})
    state = state_with(profile, tmp_path)
    got = run_pynvml(native, write_config(tmp_path, state), THERMAL_SCRIPT)
    assert got["auto_boost"] == [1, 0]
    # the T4 reports no memory temperature: one sensor only
    assert got["all"][0] == 1
    assert got["second"] == {"error": 2}


GPM_SCRIPT = """
handle = nv.nvmlDeviceGetHandleByIndex(0)
out = {"supported": nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice}
if out["supported"]:
    ids = [int(i) for i in sys.argv[1].split(",")]
    first, second = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmSampleGet(handle, first)
    # some NVML calls between the two samples, so time passes between them
    for _ in range(2000):
        nv.nvmlDeviceGetUtilizationRates(handle)
    nv.nvmlGpmSampleGet(handle, second)
    get = nv.c_nvmlGpmMetricsGet_t()
    get.version = nv.NVML_GPM_METRICS_GET_VERSION
    get.numMetrics = len(ids)
    get.sample1, get.sample2 = first, second
    for i, metric in enumerate(ids):
        get.metrics[i].metricId = metric
    nv.nvmlGpmMetricsGet(get)
    out["metrics"] = {
        str(m.metricId): {"ret": m.nvmlReturn, "value": m.value,
                          "unit": m.metricInfo.unit.decode() if m.metricInfo.unit else None}
        for m in get.metrics[:len(ids)]}
    nv.nvmlGpmSampleFree(first)
    nv.nvmlGpmSampleFree(second)
else:
    sample = nv.nvmlGpmSampleAlloc()
    try:
        nv.nvmlGpmSampleGet(handle, sample)
        out["sample"] = 0
    except nv.NVMLError as error:
        out["sample"] = error.value
    nv.nvmlGpmSampleFree(sample)
print(json.dumps(out))
"""

GRAPHICS, SM, TENSOR, DRAM, FP64, NVDEC0, NVLINK_TX, NVLINK_L0_RX, NVLINK_L17_TX = (
    1, 2, 5, 10, 11, 30, 61, 62, 97)


@pytest.mark.parametrize("profile", ["h100", "b200", "gb200", "gb300"])
def test_gpm_on_hopper_and_later_follows_utilization(native: Path, tmp_path: Path,
                                                      profile: str):
    custom = profile_with(tmp_path, profile, {"gpm": {"tensor_active_pct": 50}})
    state = state_with(custom, tmp_path,
                       ["util", "--gpu", "0", "--gpu-pct", "70", "--mem-pct", "35"])
    ids = [GRAPHICS, SM, TENSOR, DRAM, FP64, NVDEC0, NVLINK_TX, NVLINK_L0_RX, NVLINK_L17_TX]
    got = run_pynvml(native, write_config(tmp_path, state), GPM_SCRIPT,
                     ",".join(map(str, ids)))
    assert got["supported"] == 1
    metrics = {int(k): v for k, v in got["metrics"].items()}
    assert {m["ret"] for m in metrics.values()} == {0}
    assert metrics[GRAPHICS]["value"] == metrics[SM]["value"] == 70
    assert metrics[SM]["unit"] == "%"
    assert metrics[TENSOR]["value"] == 35  # half of the SM activity
    assert metrics[DRAM]["value"] == 35
    assert metrics[FP64]["value"] == 0
    assert metrics[NVDEC0]["value"] == 0
    assert state.nvlink is not None
    link_mib = state.nvlink.bandwidth_per_link_mbps * 1e6 / 2**20 * 0.7
    assert metrics[NVLINK_L0_RX]["value"] == pytest.approx(link_mib, rel=0.1)
    assert metrics[NVLINK_L17_TX]["value"] == pytest.approx(link_mib, rel=0.1)
    assert metrics[NVLINK_TX]["value"] == pytest.approx(link_mib * 18, rel=0.1)
    assert metrics[NVLINK_TX]["unit"] == "MiB/sec"


@pytest.mark.parametrize("profile", ["a100", "t4", "l40s"])
def test_gpm_is_not_supported_before_hopper(native: Path, tmp_path: Path, profile: str):
    state = compile_profile(profile, node_name="worker-1")
    got = run_pynvml(native, write_config(tmp_path, state), GPM_SCRIPT, "1")
    assert got == {"supported": 0, "sample": NOT_SUPPORTED}


MODULE_SCRIPT = """
handle = nv.nvmlDeviceGetHandleByIndex(0)
try:
    _, samples = nv.nvmlDeviceGetSamples(handle, 7, 0)
    print(json.dumps(sorted({s.sampleValue.uiVal for s in samples})))
except nv.NVMLError as error:
    print(json.dumps({"error": error.value}))
"""


def test_module_power_samples_on_grace_superchips(native: Path, tmp_path: Path):
    state = compile_profile("gb200", node_name="worker-1")
    module = state.gpus[0].fields.get("module_power")
    assert module is not None, "the gb200 profile has a module_power block"
    got = run_pynvml(native, write_config(tmp_path, state), MODULE_SCRIPT)
    assert got == [module["current_draw_mw"]]


def retirement_section(out: str) -> list[str]:
    lines = out.splitlines()
    start = lines.index("    Retired Pages")
    return [line.strip() for line in lines[start + 1:start + 4]]


def test_retired_pages_where_the_board_reports_them(native: Path, smi: Path, tmp_path: Path):
    """Pre-Ampere boards retire pages (`mokka ctl` can add some); Hopper remaps rows instead."""
    pages = {
        "single_bit_retirement": {"count": 2, "addresses": [0x1000, 0x2000]},
        "double_bit_retirement": {"count": 1, "addresses": [0x3000]},
        "pending_blacklist": True, "pending_retirement": True,
    }
    t4 = state_with("t4", tmp_path / "t4", document={"all": {"retired_pages": pages}})
    result = run_smi(smi, native, write_config(tmp_path / "t4", t4), "-q", "-d",
                     "PAGE_RETIREMENT")
    assert result.returncode == 0, result.stdout + result.stderr
    assert retirement_section(result.stdout) == [
        "Single Bit ECC                    : 2",
        "Double Bit ECC                    : 1",
        "Pending Page Blacklist            : Yes",
    ]
    h100 = compile_profile("h100", node_name="worker-1")
    result = run_smi(smi, native, write_config(tmp_path / "h100", h100), "-q", "-i", "0", "-d",
                     "PAGE_RETIREMENT")
    assert result.returncode == 0, result.stdout + result.stderr
    assert retirement_section(result.stdout) == [
        "Single Bit ECC                    : N/A",
        "Double Bit ECC                    : N/A",
        "Pending Page Blacklist            : N/A",
    ]
