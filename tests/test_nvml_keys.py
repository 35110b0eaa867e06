"""The fields the hot getters read by key (``MOCK_KEYS`` in native/nvml/mock.h).

The library resolves those fields once per config snapshot, parsed, into a
per-device table, and the getters read the table instead of looking the
field up.  Here every getter that reads through the table is compared, on
every built-in profile, with what the engine config itself says, so a key
that names the wrong field, a value parsed differently from a lookup, or a
device's table mixed up with another's shows.  The boards are idle (no
workload, no pattern): every reading is the profile's own value.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mokka.state.compile import compile_profile
from mokka.state.profile import BUILTIN_PROFILES
from tests.nvml_support import nvml_env, write_config

MOCK_H = Path(__file__).resolve().parent.parent / "native" / "nvml" / "mock.h"

#: The clock types and figures the clock getters read, as NVML numbers them.
CLOCK_TYPES = {"graphics": 0, "sm": 1, "memory": 2, "video": 3}
CLOCK_FIGURES = {
    "current": "nvmlDeviceGetClockInfo",
    "max": "nvmlDeviceGetMaxClockInfo",
    "app": "nvmlDeviceGetApplicationsClock",
    "app_default": "nvmlDeviceGetDefaultApplicationsClock",
}
NOT_SUPPORTED = {"error": 3}
PSTATE_UNKNOWN = 32

#: Every getter that reads through the table, per device, as nvidia-ml-py
#: answers it (a value, or the NVML error code).
PROBE = r"""
import json, sys
import pynvml as nv

def attempt(call):
    try:
        value = call()
    except nv.NVMLError as error:
        return {"error": error.value}
    return value.decode() if isinstance(value, bytes) else value

nv.nvmlInit()
clock_types, clock_figures = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = []
for index in range(nv.nvmlDeviceGetCount()):
    h = nv.nvmlDeviceGetHandleByIndex(index)
    memory = attempt(lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2))
    util = attempt(lambda: nv.nvmlDeviceGetUtilizationRates(h))
    got = {
        "name": attempt(lambda: nv.nvmlDeviceGetName(h)),
        "uuid": attempt(lambda: nv.nvmlDeviceGetUUID(h)),
        "minor": attempt(lambda: nv.nvmlDeviceGetMinorNumber(h)),
        "power": attempt(lambda: nv.nvmlDeviceGetPowerUsage(h)),
        "temperature": attempt(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        "utilization": util if isinstance(util, dict) else [util.gpu, util.memory],
        "memory": memory if isinstance(memory, dict)
                  else [memory.total, memory.reserved, memory.used],
        "performance_state": attempt(lambda: nv.nvmlDeviceGetPerformanceState(h)),
        "power_state": attempt(lambda: nv.nvmlDeviceGetPowerState(h)),
    }
    for kind, number in clock_types.items():
        for figure, getter in clock_figures.items():
            got[f"clocks.{kind}_{figure}"] = attempt(lambda: getattr(nv, getter)(h, number))
    out.append(got)
print(json.dumps(out))
"""


def engine_config(text: str) -> dict[str, str]:
    """The engine config's ``key: value`` lines, strings unquoted."""
    entries = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(": ")
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        entries[key.rstrip(":")] = value
    return entries


def key_fields() -> list[str]:
    """The fields MOCK_KEYS lists, from the header itself."""
    fields = re.findall(r'X\(\w+, "([^"]+)"\)', MOCK_H.read_text())
    assert len(fields) > 20, "MOCK_KEYS not found in mock.h"
    return fields


def u32(value: str | None) -> Any:
    """A uint field as the getters answer it: its number, else NOT_SUPPORTED."""
    if value is None or not value.isdigit() or int(value) > 0xFFFFFFFF:
        return NOT_SUPPORTED
    return int(value)


def pstate(value: str | None) -> int:
    match = re.fullmatch(r"[Pp](\d+)", value or "")
    return int(match.group(1)) if match and int(match.group(1)) <= 15 else PSTATE_UNKNOWN


#: Getters the claimed driver branch has removed (``native/nvml/deprecation.c``):
#: from that branch on they answer NVML_ERROR_DEPRECATED.
REMOVED_IN = {"power_state": 595, "app": 595, "app_default": 595}
DEPRECATED = {"error": 26}


def expected(dev: dict[str, str], branch: int) -> dict[str, Any]:
    """What each getter must answer for a device whose fields are `dev` (idle)."""
    def raw(field: str, default: int = 0) -> int:
        return int(dev[field]) if dev.get(field, "").isdigit() else default

    total = raw("memory.total_bytes")
    reserved = min(raw("memory.reserved_bytes"), total)
    used = min(raw("memory.used_bytes"), total - reserved)
    busy = raw("utilization.gpu") > 5  # an idle board's own utilization decides (P0 if busy)
    state = pstate(dev.get("performance_state"))
    power_state = pstate(dev.get("power.power_state", dev.get("performance_state")))
    want = {
        "name": dev.get("name", NOT_SUPPORTED),
        "uuid": dev.get("uuid", NOT_SUPPORTED),
        "minor": u32(dev.get("minor")),
        "power": u32(dev.get("power.current_draw_mw")),
        "temperature": u32(dev.get("thermal.temperature_gpu_c")),
        "utilization": [raw("utilization.gpu"), raw("utilization.memory")]
        if "utilization.gpu" in dev else NOT_SUPPORTED,
        "memory": [total, reserved, used] if "memory.total_bytes" in dev else NOT_SUPPORTED,
        "performance_state": 0 if busy and state != PSTATE_UNKNOWN else state,
        "power_state": 0 if busy and power_state != PSTATE_UNKNOWN else power_state,
    }
    for kind in CLOCK_TYPES:
        for figure in CLOCK_FIGURES:
            field = f"clocks.{kind}_{figure}"
            value = u32(dev.get(field))
            if value == NOT_SUPPORTED and kind == "sm":  # SM and graphics: one clock domain
                value = u32(dev.get(f"clocks.graphics_{figure}"))
            removed = branch >= REMOVED_IN.get(figure, 1 << 30)
            want[field] = DEPRECATED if removed else value
    if branch >= REMOVED_IN["power_state"]:
        want["power_state"] = DEPRECATED
    return want


#: Each answer above and the fields it reads (the pinned ones: only with an
#: override, see tests/test_nvml_dynamics.py's performance state test).
READS = {
    "name": ["name"], "uuid": ["uuid"], "minor": ["minor"],
    "power": ["power.current_draw_mw"], "temperature": ["thermal.temperature_gpu_c"],
    "utilization": ["utilization.gpu", "utilization.memory"],
    "memory": ["memory.total_bytes", "memory.reserved_bytes", "memory.used_bytes"],
    "performance_state": ["performance_state", "pinned.performance_state"],
    "power_state": ["power.power_state", "pinned.power.power_state"],
    **{f"clocks.{kind}_{figure}": [f"clocks.{kind}_{figure}"]
       for kind in CLOCK_TYPES for figure in CLOCK_FIGURES},
}


def test_every_key_is_checked() -> None:
    """A field added to MOCK_KEYS without a getter compared here fails."""
    checked = {field for fields in READS.values() for field in fields}
    assert set(key_fields()) == checked


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_keyed_getters_answer_the_config_values(native: Path, node_root: Path,
                                                profile: str) -> None:
    config = write_config(node_root, compile_profile(profile, node_name="node-a"))
    entries = engine_config(config.read_text())
    count = int(entries["device_count"])
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(CLOCK_TYPES), json.dumps(CLOCK_FIGURES)],
        env=nvml_env(native, config), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert len(got) == count > 0
    branch = int(entries["system.driver_version"].split(".")[0])
    for index, answers in enumerate(got):
        prefix = f"device.{index}."
        dev = {key[len(prefix):]: value for key, value in entries.items()
               if key.startswith(prefix)}
        assert answers == expected(dev, branch), f"{profile}: GPU {index}"
    # the comparison has teeth: each profile reports the figures most getters read
    first = got[0]
    assert isinstance(first["power"], int)
    assert isinstance(first["memory"], list)
    assert isinstance(first["clocks.sm_max"], int)
