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


def test_power_temperature_and_clocks_follow_utilization(native: Path, node_root: Path,
                                                         tmp_path: Path) -> None:
    dynamics = {"utilization": {"pattern": "burst", "low": 0, "high": 100, "period_s": 10,
                                "duty": 0.5}}
    config = write_config(node_root, compile_profile(profile_with(tmp_path, dynamics),
                                                     node_name="node-a"))
    # a burst starts at each multiple of the period: 0..5 s busy, 5..10 s idle
    start = (T0 // 10) * 10
    idle, busy = (entry["0"] for entry in read_at(native, config, start + 7, start + 4))
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
