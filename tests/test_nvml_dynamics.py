"""Readings that follow a profile's `dynamics` patterns, read through nvidia-ml-py.

The clock is pinned with MOCK_NVML_CLOCK_OVERRIDE (seconds since the epoch),
so two processes read the same instant and one process can sweep many.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mokka.errors import SpecError
from mokka.state.compile import compile_profile
from mokka.state.profile import read_profile_text
from tests.nvml_support import nvml_env, write_config

READINGS = Path(__file__).resolve().parent / "nvml_readings_probe.py"
#: An instant well inside the epoch: 2026-12-01T00:00:00Z.
T0 = 1_795_996_800.0
SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL = 0x4, 0x8, 0x20, 0x40


def profile_with(tmp_path: Path, dynamics: dict[str, Any], name: str = "dyn.yaml") -> Path:
    """The built-in h100 profile with ``dynamics`` in its device_defaults."""
    doc = yaml.safe_load(read_profile_text("h100")[1])
    doc["device_defaults"]["dynamics"] = dynamics
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def read_at(native: Path, config: Path, *instants: float) -> list[dict[str, Any]]:
    """Every GPU's readings at each instant, from one nvidia-ml-py process."""
    result = subprocess.run(
        [sys.executable, str(READINGS), *(repr(t) for t in instants)],
        env=nvml_env(native, config, MOCK_NVML_CLOCK_OVERRIDE=repr(instants[0])),
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    for entry in doc["instants"]:
        for reading in entry.values():
            reading["supported"] = doc["supported_sm_clocks"]
    return doc["instants"]


NOISY = {
    "step_s": 0.5,
    "utilization": {"pattern": "noise", "mean": 50, "amplitude": 50, "seed": 7},
}


def test_two_processes_reading_the_same_instant_agree(native: Path, node_root: Path,
                                                      tmp_path: Path) -> None:
    config = write_config(node_root, compile_profile(profile_with(tmp_path, NOISY),
                                                     node_name="node-a"))
    instants = [T0 + 0.25 * i for i in range(40)]
    first = read_at(native, config, *instants)
    second = read_at(native, config, *instants)
    assert first == second
    # ... and the pattern does move: per instant and per device
    assert len({entry["0"]["util_gpu"] for entry in first}) > 10
    assert any(entry["0"]["util_gpu"] != entry["1"]["util_gpu"] for entry in first)
    # the noise holds for a step (0.5 s), so t and t + 0.25 in one step agree
    assert first[0]["0"] == first[1]["0"]


def assert_within_limits(reading: dict[str, Any]) -> None:
    assert 0 <= reading["util_gpu"] <= 100
    assert 0 <= reading["power_mw"] <= reading["power_limit_mw"] <= reading["power_max_mw"]
    assert reading["temperature_c"] < reading["shutdown_c"]
    assert reading["sm_clock_mhz"] in reading["supported"]
    assert 0 <= reading["memory_used"] <= reading["memory_total"]


@pytest.mark.parametrize("dynamics", [
    NOISY,
    {"utilization": {"pattern": "burst", "low": 0, "high": 100, "period_s": 10, "duty": 0.3}},
    {"utilization": {"pattern": "ramp", "from": 0, "to": 100, "period_s": 20},
     "temperature": {"pattern": "ramp", "from": 30, "to": 120, "period_s": 20},
     "memory": {"pattern": "steady", "value": 1.0},
     "clocks": {"pattern": "noise", "mean": 1500, "amplitude": 1000, "seed": 3}},
    {"power": {"pattern": "noise", "mean": 600, "amplitude": 400, "seed": 11}},
], ids=["noise", "burst", "hot-ramp", "power-noise"])
def test_values_stay_within_the_board_limits(native: Path, node_root: Path, tmp_path: Path,
                                             dynamics: dict[str, Any]) -> None:
    config = write_config(node_root, compile_profile(profile_with(tmp_path, dynamics),
                                                     node_name="node-a"))
    sweep = read_at(native, config, *(T0 + 0.37 * i for i in range(60)))
    for entry in sweep:
        for reading in entry.values():
            assert_within_limits(reading)
    # the sweep sees the board move, not one steady reading
    assert len({(entry["0"]["util_gpu"], entry["0"]["power_mw"]) for entry in sweep}) > 1


def burst(low: float, high: float) -> dict[str, Any]:
    """A utilization burst of period 10 s: ``high`` for 0..5 s, ``low`` for 5..10 s."""
    return {"utilization": {"pattern": "burst", "low": low, "high": high, "period_s": 10,
                            "duty": 0.5}}


#: An instant in a ``burst``'s low half, and one in its high half (a burst
#: starts at each multiple of its period).
BURST_LOW_HIGH = ((T0 // 10) * 10 + 7, (T0 // 10) * 10 + 4)


def low_and_high(native: Path, node_root: Path, profile: Path) -> tuple[dict, dict, Path]:
    """GPU 0's readings at ``BURST_LOW_HIGH``, and the profile's config written into the root."""
    config = write_config(node_root, compile_profile(profile, node_name="node-a"))
    low, high = (entry["0"] for entry in read_at(native, config, *BURST_LOW_HIGH))
    return low, high, config


def test_power_temperature_and_clocks_follow_utilization(native: Path, node_root: Path,
                                                         tmp_path: Path) -> None:
    profile = profile_with(tmp_path, burst(0, 100))
    idle, busy, _config = low_and_high(native, node_root, profile)
    assert (idle["util_gpu"], busy["util_gpu"]) == (0, 100)
    assert idle["power_mw"] == 68920
    assert busy["power_mw"] == busy["power_limit_mw"]
    assert idle["temperature_c"] < busy["temperature_c"] < busy["slowdown_c"]
    assert busy["reasons"] & SW_POWER_CAP
    assert not idle["reasons"] & SW_POWER_CAP
    assert idle["reasons"] & 0x1  # GPU idle
    assert idle["sm_clock_mhz"] < busy["sm_clock_mhz"] < busy["sm_max_mhz"]
    assert busy["util_memory"] > idle["util_memory"]


def test_a_hot_board_throttles_with_the_thermal_reasons(native: Path, node_root: Path,
                                                        tmp_path: Path) -> None:
    dynamics = {"temperature": {"pattern": "steady", "value": 120},
                "utilization": {"pattern": "steady", "value": 40}}
    config = write_config(node_root, compile_profile(profile_with(tmp_path, dynamics),
                                                     node_name="node-a"))
    hot = read_at(native, config, T0)[0]["0"]
    assert hot["temperature_c"] == hot["shutdown_c"] - 1
    assert hot["reasons"] & (HW_SLOWDOWN | HW_THERMAL | SW_THERMAL) == (
        HW_SLOWDOWN | HW_THERMAL | SW_THERMAL)
    assert hot["sm_clock_mhz"] < hot["sm_max_mhz"]
    assert hot["sm_clock_mhz"] in hot["supported"]


def test_an_override_beats_the_pattern_and_reset_returns_to_it(native: Path, node_root: Path,
                                                               tmp_path: Path) -> None:
    profile = profile_with(tmp_path, NOISY)
    instants = [T0 + 0.5 * i for i in range(12)]
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(yaml.safe_dump(
        {"version": 1, "all": {"utilization": {"gpu": 90}, "thermal": {"temperature_gpu_c": 55}}}))
    pinned = read_at(native, write_config(node_root, compile_profile(
        profile, node_name="node-a", overrides=overrides)), *instants)
    for entry in pinned:
        reading = entry["0"]
        assert (reading["util_gpu"], reading["temperature_c"]) == (90, 55)
        # the overridden utilization still drives what it derives
        assert reading["power_mw"] == round(68920 + (700000 - 68920) * 0.9)

    overrides.write_text(yaml.safe_dump({"version": 1}))  # `mokka ctl reset`
    reset = read_at(native, write_config(node_root, compile_profile(
        profile, node_name="node-a", overrides=overrides)), *instants)
    without = read_at(native, write_config(node_root, compile_profile(
        profile, node_name="node-a")), *instants)
    assert reset == without
    assert len({entry["0"]["util_gpu"] for entry in reset}) > 3


@pytest.mark.parametrize(("dynamics", "message"), [
    ({"utilization": {"pattern": "wave", "value": 3}},
     "device_defaults.dynamics.utilization.pattern: 'wave' is not one of: steady, ramp"),
    ({"utilization": {"pattern": "steady", "value": 150}},
     "device_defaults.dynamics.utilization.value"),
    ({"memory": {"pattern": "ramp", "from": 0, "to": 0.5}},
     "device_defaults.dynamics.memory.period_s: missing, expected a number (pattern ramp"),
    ({"power": {"pattern": "burst", "low": 1, "high": 2, "period_s": 0}},
     "device_defaults.dynamics.power.period_s"),
    ({"fan": {"pattern": "steady", "value": 1}}, "device_defaults.dynamics"),
    ({"clocks": {"pattern": "noise", "mean": 1000, "amplitude": 10, "seed": -1}},
     "device_defaults.dynamics.clocks.seed"),
])
def test_bad_dynamics_are_refused_naming_the_field(tmp_path: Path, dynamics: dict[str, Any],
                                                   message: str) -> None:
    path = profile_with(tmp_path, dynamics, name="bad.yaml")
    with pytest.raises(SpecError) as info:
        compile_profile(path, node_name="node-a")
    assert "bad.yaml" in str(info.value)
    assert message in str(info.value)


def read_with(native: Path, config: Path, instants: list[float], **env: str) -> list[Any]:
    """read_at's sweep with extra environment (one process)."""
    result = subprocess.run(
        [sys.executable, str(READINGS), *(repr(t) for t in instants)],
        env=nvml_env(native, config, MOCK_NVML_CLOCK_OVERRIDE=repr(instants[0]), **env),
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["instants"]


@pytest.mark.parametrize("dynamics", [
    NOISY,
    {"utilization": {"pattern": "ramp", "from": 0, "to": 100, "period_s": 20},
     "temperature": {"pattern": "ramp", "from": 30, "to": 120, "period_s": 20},
     "clocks": {"pattern": "noise", "mean": 1500, "amplitude": 1000, "seed": 3}},
    {"power": {"pattern": "burst", "low": 100, "high": 800, "period_s": 3, "duty": 0.4},
     "memory": {"pattern": "ramp", "from": 0.1, "to": 0.9, "period_s": 7}},
], ids=["noise", "ramps", "power-burst"])
def test_cached_readings_equal_the_formula_at_every_instant(native: Path, node_root: Path,
                                                             tmp_path: Path,
                                                             dynamics: dict[str, Any]) -> None:
    """Readings served from the cache are the ones the formula derives.

    The sweep revisits instants (a cached tick, then another, then the first
    again) on a board with a pattern and on one that pods hold; with
    MOCK_NVML_READING_CACHE=0 every reading is derived afresh.
    """
    config = write_config(node_root, compile_profile(profile_with(tmp_path, dynamics),
                                                     node_name="node-a"))
    (config.parent / "workload.yaml").write_text(
        "format: 1\nworkload.memory_share_per_holder: 0.3\n"
        "workload.utilization_per_holder: 45\ndevice_count: 8\n"
        'device.5.process_count: 1\ndevice.5.process.0.pid: 200001\n'
        'device.5.process.0.name: "k8s:a/b/c"\n')
    base = [T0 + 0.37 * i for i in range(12)]
    instants = base + base[::-1] + [base[3], base[3], base[7], base[3]]
    cached = read_with(native, config, instants)
    fresh = read_with(native, config, instants, MOCK_NVML_READING_CACHE="0")
    assert cached == fresh
    assert len({entry["0"]["util_gpu"] for entry in cached} |
               {entry["0"]["power_mw"] for entry in cached}) > 2
    assert cached[0]["5"]["processes"][0]["pid"] == 200001


PSTATES = r"""
import json, os, sys
import pynvml as nv
nv.nvmlInit()
out = []
for instant in sys.argv[1:]:
    os.environ["MOCK_NVML_CLOCK_OVERRIDE"] = instant
    out.append([[nv.nvmlDeviceGetPerformanceState(h), nv.nvmlDeviceGetPowerState(h)]
                for h in map(nv.nvmlDeviceGetHandleByIndex, range(nv.nvmlDeviceGetCount()))])
print(json.dumps(out))
"""


def pstates(native: Path, config: Path, *instants: float) -> list[list[list[int]]]:
    """[performance state, power state] of every GPU at each instant."""
    result = subprocess.run([sys.executable, "-c", PSTATES, *(repr(t) for t in instants)],
                            env=nvml_env(native, config, MOCK_NVML_CLOCK_OVERRIDE=repr(T0)),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def smi_pstate(smi: Path, native: Path, config: Path, instant: float) -> str:
    """nvidia-smi -q's "Performance State" of GPU 0 at a pinned instant."""
    result = subprocess.run([str(smi), "-q", "-i", "0"],
                            env=nvml_env(native, config, MOCK_NVML_CLOCK_OVERRIDE=repr(instant)),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    states = [line.split(":", 1)[1].strip() for line in result.stdout.splitlines()
              if line.strip().startswith("Performance State")]
    assert len(states) == 1, result.stdout
    return states[0]


def idle_in_p8(tmp_path: Path, dynamics: dict[str, Any] | None) -> Path:
    """The h100 profile with P8 as its (idle) performance and power state."""
    doc = yaml.safe_load(read_profile_text("h100")[1])
    doc["device_defaults"]["performance_state"] = "P8"
    doc["device_defaults"]["power"]["power_state"] = "P8"
    if dynamics is not None:
        doc["device_defaults"]["dynamics"] = dynamics
    path = tmp_path / "p8.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_performance_state_follows_the_load_unless_pinned(native: Path, smi: Path,
                                                              node_root: Path,
                                                              tmp_path: Path) -> None:
    burst = {"utilization": {"pattern": "burst", "low": 3, "high": 90, "period_s": 10,
                             "duty": 0.5}}
    profile = idle_in_p8(tmp_path, burst)
    config = write_config(node_root, compile_profile(profile, node_name="node-a"))
    busy, idle = T0 + 4, T0 + 7  # 90 % and 3 % (under the 5 % threshold)
    assert pstates(native, config, busy, idle) == [[[0, 0]] * 8, [[8, 8]] * 8]
    assert (smi_pstate(smi, native, config, busy), smi_pstate(smi, native, config, idle)) == (
        "P0", "P8")

    # `mokka ctl pstate --gpu 0 --state P2` wins over the load
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(yaml.safe_dump({"version": 1, "devices": {
        "0": {"performance_state": "P2", "power": {"power_state": "P2"}}}}))
    config = write_config(node_root, compile_profile(profile, node_name="node-a",
                                                     overrides=overrides))
    assert pstates(native, config, busy, idle) == [[[2, 2]] + [[0, 0]] * 7,
                                                   [[2, 2]] + [[8, 8]] * 7]
    assert (smi_pstate(smi, native, config, busy), smi_pstate(smi, native, config, idle)) == (
        "P2", "P2")

    # `mokka ctl set --gpu 1 performance_state=P3` alone pins both getters too
    overrides.write_text(yaml.safe_dump({"version": 1, "devices": {
        "1": {"performance_state": "P3"}}}))
    config = write_config(node_root, compile_profile(profile, node_name="node-a",
                                                     overrides=overrides))
    assert pstates(native, config, busy, idle) == [[[0, 0], [3, 3]] + [[0, 0]] * 6,
                                                   [[8, 8], [3, 3]] + [[8, 8]] * 6]

    # an idle board without a pattern stays in its profile's state
    config = write_config(node_root, compile_profile(idle_in_p8(tmp_path, None),
                                                     node_name="node-a"))
    assert pstates(native, config, busy) == [[[8, 8]] * 8]


def test_a_board_under_the_busy_threshold_runs_its_idle_clock(native: Path, node_root: Path,
                                                             tmp_path: Path) -> None:
    """The SM clock and the P-state agree: at 3 % (at most 5 %: the idle state) the board
    runs the profile's idle clock, not boost; at 6 % it is busy and boosts."""
    low, high, config = low_and_high(native, node_root, idle_in_p8(tmp_path, burst(3, 6)))
    assert (low["util_gpu"], high["util_gpu"]) == (3, 6)
    assert low["sm_clock_mhz"] == 345  # h100's idle sm_current
    assert high["sm_clock_mhz"] == high["sm_max_mhz"] == 1980
    assert pstates(native, config, *BURST_LOW_HIGH) == [[[8, 8]] * 8, [[0, 0]] * 8]
