"""The driver a profile claims decides which calls answer (native/nvml/deprecation.c).

A driver branch that removed an NVML call still exports it, and the call
answers NVML_ERROR_DEPRECATED; nvidia-smi prints "Requested functionality
has been deprecated" for it.  Every built-in profile is checked through
nvidia-ml-py (every GPU) and the real nvidia-smi 535 (``-q``, ``-q -x``)
against the branches below, which are this test's own record of the real
boards (the captures in tests/data/nvidia-smi and the 595 boards), kept
apart from the library's table on purpose.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import attrs
import pytest

from mokka.state.compile import compile_profile
from mokka.state.model import State
from mokka.state.profile import BUILTIN_PROFILES
from tests.engine_config_oracle import parse_engine_config
from tests.nvml_support import (
    PYNVML_ATTEMPT,
    run_script,
    run_smi,
    state_with_overrides,
    write_config,
)

pytestmark = pytest.mark.realclient

#: The first driver branch that removed each call.
REMOVED_IN = {
    "display_mode": 580,
    "app_clock": 595,
    "default_app_clock": 595,
    "power_state": 595,
    "reset_status": 570,  # field values NVML_FI_DEV_RESET_STATUS, ..._DRAIN_AND_RESET_STATUS
}
DEPRECATED = {"error": 26}  # NVML_ERROR_DEPRECATED
SMI_DEPRECATED = "Requested functionality has been deprecated"
CLOCK_TYPES = range(4)  # graphics, SM, memory, video

#: What nvidia-ml-py answers, per GPU: the calls a branch may remove, and the
#: calls reading the same fields that no branch removed (their answers are
#: what a driver still having the call would give).
PROBE = r"""
import json
import pynvml as nv

""" + PYNVML_ATTEMPT + r"""
nv.nvmlInit()
out = []
for index in range(nv.nvmlDeviceGetCount()):
    h = nv.nvmlDeviceGetHandleByIndex(index)
    out.append({
        "display_mode": attempt(lambda: nv.nvmlDeviceGetDisplayMode(h)),
        "display_active": attempt(lambda: nv.nvmlDeviceGetDisplayActive(h)),
        "app_clock": [attempt(lambda: nv.nvmlDeviceGetApplicationsClock(h, t)) for t in range(4)],
        "default_app_clock": [attempt(lambda: nv.nvmlDeviceGetDefaultApplicationsClock(h, t))
                              for t in range(4)],
        "power_state": attempt(lambda: nv.nvmlDeviceGetPowerState(h)),
        "app_target": [attempt(lambda: nv.nvmlDeviceGetClock(
            h, t, nv.NVML_CLOCK_ID_APP_CLOCK_TARGET)) for t in range(4)],
        "app_default": [attempt(lambda: nv.nvmlDeviceGetClock(
            h, t, nv.NVML_CLOCK_ID_APP_CLOCK_DEFAULT)) for t in range(4)],
        "performance_state": attempt(lambda: nv.nvmlDeviceGetPerformanceState(h)),
    })
print(json.dumps(out))
"""


def branch_of(state: State) -> int:
    return int(state.system.driver_version.split(".")[0])


def removed(call: str, branch: int) -> bool:
    return branch >= REMOVED_IN[call]


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[State, Path]]:
    """One engine config per built-in profile, written once for the module."""
    out = {}
    for profile in BUILTIN_PROFILES:
        state = compile_profile(profile, node_name="worker-1")
        out[profile] = state, write_config(tmp_path_factory.mktemp(profile), state)
    return out


def entries(config: Path) -> dict[str, str]:
    parsed = parse_engine_config(config.read_bytes())
    assert parsed is not None, f"{config}: the library would refuse it"
    return {k.decode(): v.decode() for k, v in parsed.items()}


def check_answers(got: list[dict[str, Any]], config: Path, branch: int) -> None:
    values = entries(config)
    assert len(got) == int(values["device_count"]) > 0
    for index, dev in enumerate(got):
        words = {"enabled": 1, "disabled": 0}
        display = words[values[f"device.{index}.display.mode"]]
        assert dev["display_mode"] == (DEPRECATED if removed("display_mode", branch) else display)
        # display active no branch removed: the 580 captures still print it
        assert dev["display_active"] == words[values[f"device.{index}.display.active"]]
        for call, same in (("app_clock", "app_target"), ("default_app_clock", "app_default")):
            assert all(isinstance(v, int) for v in dev[same][:3]), dev[same]
            want = [DEPRECATED] * 4 if removed(call, branch) else dev[same]
            assert dev[call] == want, f"GPU {index}: {call}"
        assert isinstance(dev["performance_state"], int)
        want = DEPRECATED if removed("power_state", branch) else dev["performance_state"]
        assert dev["power_state"] == want, f"GPU {index}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_removed_calls_answer_deprecated_per_claimed_driver(
    native: Path, configs: dict[str, tuple[State, Path]], profile: str
):
    state, config = configs[profile]
    check_answers(run_script(native, config, PROBE), config, branch_of(state))


def test_the_profiles_cover_every_branch_of_the_table(configs):
    """Each branch the table names is some built-in profile's; a driver predating every
    row (no built-in profile claims one) is read in ``VERSIONS``."""
    branches = {branch_of(state) for state, _ in configs.values()}
    assert set(REMOVED_IN.values()) <= branches
    assert 0 < min(b for b in VERSIONS.values() if b) < min(REMOVED_IN.values())


def smi_field(text: str, label: str, after: str = "") -> str:
    """The value of the first ``label : value`` line of ``-q`` past ``after``."""
    start = text.index(after) if after else 0
    match = re.search(rf"^ +{re.escape(label)} +: (.*)$", text[start:], re.M)
    assert match, f"{label!r} (after {after!r}) not in nvidia-smi -q"
    return match.group(1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_nvidia_smi_prints_what_the_claimed_driver_answers(
    native: Path, smi: Path, configs: dict[str, tuple[State, Path]], profile: str
):
    state, config = configs[profile]
    branch = branch_of(state)
    gpu = entries(config)
    report = run_smi(smi, native, config, "-q", "-i", "0")
    assert report.returncode == 0, report.stdout + report.stderr
    out = report.stdout
    display = smi_field(out, "Display Mode")
    want = SMI_DEPRECATED if removed("display_mode", branch) else gpu["device.0.display.mode"]
    assert display.lower() == want.lower()
    assert smi_field(out, "Display Active").lower() == gpu["device.0.display.active"]
    for call, heading, field in (
        ("app_clock", "\n    Applications Clocks", "app"),
        ("default_app_clock", "\n    Default Applications Clocks", "app_default"),
    ):
        for label, kind in (("Graphics", "graphics"), ("Memory", "memory")):
            shown = smi_field(out, label, after=heading)
            mhz = f"{gpu[f'device.0.clocks.{kind}_{field}']} MHz"
            assert shown == (SMI_DEPRECATED if removed(call, branch) else mhz), (heading, label)

    xml = run_smi(smi, native, config, "-q", "-x", "-i", "0")
    assert xml.returncode == 0, xml.stderr
    readings = ET.fromstring(xml.stdout).find("gpu/gpu_power_readings/power_state")
    assert readings is not None
    performance = ET.fromstring(xml.stdout).findtext("gpu/performance_state")
    assert readings.text == (SMI_DEPRECATED if removed("power_state", branch) else performance)
    for element in ("reset_required", "drain_and_reset_recommended"):
        shown = ET.fromstring(xml.stdout).findtext(f"gpu/gpu_reset_status/{element}")
        assert shown == (SMI_DEPRECATED if removed("reset_status", branch) else "No"), element


#: Driver versions the library must read as no branch that removed anything,
#: or as one past every row.
VERSIONS = {
    "535.54.03": 535,  # older than every row: nothing removed
    "580": 580,  # a bare branch is a version
    "610.1.2": 610,  # newer than every row: all of them removed
    "not-a-version": 0,  # unparsable: nothing removed
    "58x.1": 0,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", VERSIONS)
def test_driver_versions_are_read_by_their_branch(native: Path, tmp_path: Path, version: str):
    state = compile_profile("t4", node_name="worker-1")
    state = attrs.evolve(state, system=attrs.evolve(state.system, driver_version=version))
    config = write_config(tmp_path, state)
    check_answers(run_script(native, config, PROBE), config, VERSIONS[version])


LOST_PROBE = r"""
import json
import pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
out = {}
for name, call in (("display_mode", lambda: nv.nvmlDeviceGetDisplayMode(h)),
                   ("power_state", lambda: nv.nvmlDeviceGetPowerState(h)),
                   ("display_active", lambda: nv.nvmlDeviceGetDisplayActive(h))):
    try:
        out[name] = call()
    except nv.NVMLError as error:
        out[name] = error.value
print(json.dumps(out))
"""


@pytest.mark.timeout(60)
def test_a_removed_call_answers_deprecated_even_for_a_lost_gpu(native: Path, tmp_path: Path):
    """A removed function asks the GPU nothing; a call the driver still has fails."""
    state = state_with_overrides("t4", tmp_path, ["fail", "--gpu", "0", "--mode", "lost"])
    config = write_config(tmp_path / "root", state)
    got = run_script(native, config, LOST_PROBE)
    assert got == {"display_mode": 26, "power_state": 26, "display_active": 15}  # 15: GPU is lost


def test_a_removed_call_before_init_is_uninitialized(native: Path, tmp_path: Path):
    """Before nvmlInit a removed call is uninitialized, as every call is."""
    script = (
        "import ctypes, json; lib = ctypes.CDLL('libnvidia-ml.so.1');"
        "out = ctypes.c_uint(7);"
        "print(json.dumps([lib.nvmlDeviceGetPowerState(None, ctypes.byref(out)), out.value]))"
    )
    config = write_config(tmp_path, compile_profile("t4", node_name="worker-1"))
    assert run_script(native, config, script) == [1, 7]  # NVML_ERROR_UNINITIALIZED, untouched
