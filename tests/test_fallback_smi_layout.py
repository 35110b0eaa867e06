"""The fallback nvidia-smi's summary table takes the layout of the driver the profile claims.

Below 550 it is 535's narrow table, checked byte for byte against the real
nvidia-smi 535 on every built-in profile (each recompiled to claim a 535
driver).  From 550 on it is the wide table, checked against public captures
of real 550 and 580 tools (``tests/data/nvidia-smi/table-*.txt``, sources
in ``tests/data/SOURCES.md``): the node is given the captured GPU's values,
so every byte of the capture must come out the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.nvml_support import run_smi, write_config

pytestmark = pytest.mark.realclient

DATA = Path(__file__).resolve().parent / "data" / "nvidia-smi"
PROFILES = Path(__file__).resolve().parents[1] / "mokka" / "state" / "profiles"
BUILT_IN = ("a100", "b200", "gb200", "gb300", "h100", "l40s", "t4")
MIB = 1 << 20


def claiming(state: State, driver: str, cuda: str) -> State:
    """``state`` with its system claiming ``driver`` and CUDA ``cuda``."""
    major, minor = (int(part) for part in cuda.split("."))
    system = attrs.evolve(
        state.system, driver_version=driver, nvml_version=f"{major}.{driver}",
        cuda_version_major=major, cuda_version_minor=minor,
    )
    return attrs.evolve(state, system=system)


def table(native: Path, smi: Path, where: Path, state: State) -> list[str]:
    """The summary table ``smi`` prints for ``state``, as lines."""
    result = run_smi(smi, native, write_config(where, state))
    assert result.returncode == 0, result.stdout
    return result.stdout.splitlines()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("profile", BUILT_IN)
def test_below_550_the_table_is_535s_byte_for_byte(
    native: Path, smi: Path, tmp_path: Path, profile: str
):
    state = claiming(compile_profile(profile, node_name="worker-1"), "535.309.01", "12.2")
    real = table(native, smi, tmp_path, state)
    ours = table(native, native / "nvidia-smi", tmp_path, state)
    # Line 0 is the clock; the banner names the same version on both sides.
    assert ours[1:] == real[1:]
    assert len(ours[1]) == 89
    assert "NVIDIA-SMI 535.309.01" in ours[2]


def t4_like(tmp_path: Path, driver: str, cuda: str, **gpu: Any) -> State:
    """The built-in t4 profile with the values of a captured board (one GPU)."""
    doc = yaml.safe_load((PROFILES / "t4.yaml").read_text())
    defaults = doc["device_defaults"]
    total = gpu.get("total_mib", 15360) * MIB
    used = gpu["used_mib"] * MIB
    defaults["name"] = gpu.get("name", defaults["name"])
    defaults["memory"].update(
        total_bytes=total, used_bytes=used,
        free_bytes=total - used - defaults["memory"]["reserved_bytes"],
    )
    defaults["thermal"]["temperature_gpu_c"] = gpu["temp_c"]
    defaults["power"].update(current_draw_mw=gpu["draw_w"] * 1000)
    limit = gpu.get("limit_w", 70) * 1000
    defaults["power"].update(
        default_limit_mw=limit, enforced_limit_mw=limit, max_limit_mw=limit,
        min_limit_mw=min(defaults["power"]["min_limit_mw"], limit),
    )
    defaults["utilization"]["gpu"] = gpu.get("util", 0)
    if "fan_percent" in gpu:
        defaults["fan"].update(count=1, speed_percent=gpu["fan_percent"],
                               target_speed_percent=gpu["fan_percent"])
    pstate = gpu.get("pstate", "P0")
    defaults["performance_state"] = pstate
    defaults["power"]["power_state"] = pstate
    defaults["persistence_mode"] = gpu["persistence"]
    defaults["compute_mode"] = gpu.get("compute_mode", "default")
    bus = gpu["bus_id"]
    doc["devices"][0]["pci"]["bus_id"] = bus
    doc["devices"][0]["board_id"] = int(bus.split(":")[1], 16) << 8
    doc["pcie_topology"]["root_complexes"][0]["devices"] = [bus]
    doc["pcie_topology"]["root_complexes"][0]["id"] = "pci0000:00"
    path = tmp_path / "board.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return claiming(compile_profile(path, node_name="worker-1"), driver, cuda)


CAPTURES = {
    # file: (driver, CUDA, the captured GPU's values)
    "table-580.105.08-t4.txt": (
        "580.105.08", "13.0",
        dict(temp_c=77, draw_w=67, used_mib=167, util=100, persistence="disabled",
             compute_mode="exclusive_process", bus_id="0000:00:04.0"),
    ),
    "table-550.127.05-a40.txt": (
        "550.127.05", "12.4",
        dict(name="NVIDIA A40", fan_percent=0, pstate="P8", temp_c=29, draw_w=23, limit_w=300,
             used_mib=1, total_mib=46068, persistence="enabled", bus_id="0000:4f:00.0"),
    ),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("capture", sorted(CAPTURES))
def test_from_550_the_table_is_the_captured_wide_one(
    native: Path, tmp_path: Path, capture: str
):
    driver, cuda, gpu = CAPTURES[capture]
    expected = (DATA / capture).read_text().splitlines()
    ours = table(native, native / "nvidia-smi", tmp_path, t4_like(tmp_path, driver, cuda, **gpu))
    # The captures start below the clock line; a cut capture is a prefix.
    assert ours[1:1 + len(expected)] == expected
    assert {len(line) for line in ours[1:] if line.strip()} == {91}


def test_the_b200_capture_s_cells(native: Path, tmp_path: Path):
    """A 4-digit power limit and a 6-digit memory total fit the wide cells whole
    (535 cuts them to "1..." and "18335...")."""
    expected = (DATA / "table-580.95.05-b200.txt").read_text().splitlines()
    state = t4_like(
        tmp_path, "580.95.05", "13.0", name="NVIDIA B200", temp_c=33, draw_w=192,
        limit_w=1000, used_mib=166593, total_mib=183359, persistence="enabled",
        bus_id="0000:05:00.0",
    )
    ours = table(native, native / "nvidia-smi", tmp_path, state)
    # Every line but the MIG cell (the T4 stand-in has no MIG; the B200 says Disabled).
    for number, line in enumerate(expected):
        if "Disabled" in line:
            assert ours[1 + number].replace("     N/A |", "Disabled |") == line
        else:
            assert ours[1 + number] == line, number


@pytest.mark.parametrize(
    ("driver", "spacer", "rule"),
    [("550.127.05", " " * 89, "|"), ("570.148.08", " " * 89, "|"), ("580.105.08", "", "+"),
     ("595.91.07", "", "+")],
)
def test_each_branch_s_spacer_and_banner_rule(
    native: Path, tmp_path: Path, driver: str, spacer: str, rule: str
):
    state = claiming(compile_profile("t4", node_name="worker-1"), driver, "13.0")
    ours = table(native, native / "nvidia-smi", tmp_path, state)
    assert ours[3].startswith(rule + "-----")
    first_process_rule = ours.index("| Processes:" + " " * 78 + "|") - 1
    assert ours[first_process_rule - 1] == spacer
    pid_header = ours[first_process_rule + 2]
    wide_pid = not driver.startswith("55")
    assert ("CI              PID" in pid_header) is wide_pid
