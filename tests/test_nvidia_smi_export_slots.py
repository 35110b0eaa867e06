"""Export-table slots 12, 75 and 108 of the real nvidia-smi 535 (docs/nvml.md).

``-i <PCI bus id>``: nvidia-smi hands every id with a ':' to slot 12, which
parses it into domain, bus, device and function, then asks slot 75 for the
domain, bus and device of each GPU index and selects the one that equals it
(function 0 only).  Slot 12's accepted spellings are NVIDIA's: its parser in
libnvidia-ml 535.309.01 tries ``%x:%x:%x.%x``, ``%x:%x:%x`` and ``%x:%x.%x``,
nothing may follow.  The messages below are nvidia-smi's own, not the
library's: what the tests rely on is that the binary prints "Invalid PCI bus
id format..." (exit 255) when slot 12 refuses a string, and for a string it
accepts that no GPU matches, the same as for any other unknown id (an unknown
UUID: "No devices were found", exit 6), as it does on a real driver.

``--query-gpu=enforced.power.limit`` reads only slot 108, which NVIDIA's table
fills with nvmlDeviceGetEnforcedPowerLimit itself: it must equal power.limit
and the public getter, whatever the profile and the overrides say.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.nvml_support import run_script, run_smi, state_with_overrides, write_config

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(300)]

FORMAT_ERROR = (
    "Problem with GPU 0: Invalid PCI bus id format. "
    "Try format [domain:]bus:device.function E.g. 0:2:0.0"
)
NO_DEVICES = "No devices were found"
UNKNOWN_UUID = "GPU-00000000-0000-0000-0000-000000000000"
BUS_ID = re.compile(r"^([0-9A-F]{8}):([0-9A-F]{2}):([0-9A-F]{2})\.([0-9A-F])$")
# gpu_power_readings/current_power_limit of the real H100 capture
# (tests/data/nvidia-smi/qx-h100.xml, every GPU): the built-in profile's limit.
H100_CAPTURE_LIMIT = "700.00 W"




def location(bus_id: str) -> tuple[int, int, int, int]:
    match = BUS_ID.match(bus_id)
    assert match, bus_id
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return domain, bus, device, function


def spellings(bus_id: str) -> list[str]:
    """Ways to write one GPU's bus id that NVIDIA's parser accepts."""
    domain, bus, device, function = location(bus_id)
    assert function == 0
    names = [
        bus_id,  # as nvidia-smi prints it
        f"{domain:04X}:{bus:02X}:{device:02X}.{function}",  # the legacy 4-digit domain
        bus_id.lower(),
        f"{domain:x}:{bus:x}:{device:x}.{function:x}",  # unpadded, the man page's 0:2:0.0
        f"{domain:04x}:{bus:02x}:{device:02x}",  # no function: function 0
    ]
    if domain == 0:
        names.append(f"{bus:02X}:{device:02X}.{function}")  # no domain: domain 0
    return names


def query(smi: Path, native: Path, config: Path, gpu_id: str) -> subprocess.CompletedProcess:
    return run_smi(smi, native, config, "-i", gpu_id, "--query-gpu=index,pci.bus_id",
                   "--format=csv,noheader")


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_each_bus_id_spelling_selects_its_gpu(native: Path, smi: Path, tmp_path: Path,
                                              profile: str):
    state = state_with_overrides(profile, tmp_path)
    config = write_config(tmp_path, state)
    for index, gpu in enumerate(state.gpus):
        for name in spellings(gpu.nvml_bus_id):
            result = query(smi, native, config, name)
            assert (result.returncode, result.stdout) == (
                0, f"{index}, {gpu.nvml_bus_id}\n"), (name, result.stdout)


def test_long_report_by_bus_id(native: Path, smi: Path, tmp_path: Path):
    state = state_with_overrides("h100", tmp_path)
    gpu = state.gpus[3]
    domain, bus, device, _ = location(gpu.nvml_bus_id)
    result = run_smi(smi, native, write_config(tmp_path, state), "-q", "-i",
                     f"{domain:04X}:{bus:02X}:{device:02X}.0")
    assert result.returncode == 0, result.stdout
    headers = [line for line in result.stdout.splitlines() if line.startswith("GPU ")]
    assert headers == [f"GPU {gpu.nvml_bus_id}"]
    assert f"GPU UUID                              : {gpu.uuid}" in result.stdout


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_a_well_formed_bus_id_no_gpu_has_is_an_unknown_gpu(native: Path, smi: Path,
                                                           tmp_path: Path, profile: str):
    state = state_with_overrides(profile, tmp_path)
    config = write_config(tmp_path, state)
    unknown = query(smi, native, config, UNKNOWN_UUID)
    assert (unknown.returncode, unknown.stdout.strip()) == (6, NO_DEVICES)
    domain, bus, device, _ = location(state.gpus[0].nvml_bus_id)
    taken = {location(gpu.nvml_bus_id)[:3] for gpu in state.gpus}
    assert (domain, bus, 0x1F) not in taken
    assert (0xFFFF, bus, device) not in taken
    names = [
        f"{domain:08X}:{bus:02X}:1F.0",  # a device no GPU sits at
        f"0000FFFF:{bus:02X}:{device:02X}.0",  # another domain
        f"{domain:08X}:{bus:02X}:{device:02X}.1",  # a GPU's address, function 1
    ]
    if domain != 0:
        # No domain means domain 0, where this machine has no GPU.
        names.append(f"{bus:02X}:{device:02X}.0")
    for name in names:
        result = query(smi, native, config, name)
        assert (result.returncode, result.stdout) == (unknown.returncode, unknown.stdout), name


def test_a_malformed_bus_id_is_a_format_error(native: Path, smi: Path, tmp_path: Path):
    config = write_config(tmp_path, state_with_overrides("h100", tmp_path))
    # bus:device without a function, a non-hex digit, too few parts, a
    # trailing character, one part too many.
    for name in ("53:00", "zz:00.0", "1:2", "0000:53:00.0 ", "0000:53:00.0.0"):
        for args in (["--query-gpu=index", "--format=csv"], ["-q"]):
            result = run_smi(smi, native, config, "-i", name, *args)
            assert (result.returncode, result.stdout) == (255, FORMAT_ERROR + "\n"), name


ENFORCED_SCRIPT = """
import json, pynvml as nv
nv.nvmlInit()
count = nv.nvmlDeviceGetCount()
print(json.dumps([nv.nvmlDeviceGetEnforcedPowerLimit(nv.nvmlDeviceGetHandleByIndex(i))
                  for i in range(count)]))
"""


def public_enforced_limits(native: Path, config: Path) -> list[int]:
    return run_script(native, config, ENFORCED_SCRIPT)


BY_BUS_ID_SCRIPT = """
import json, sys, pynvml as nv
nv.nvmlInit()
out = {}
for name in json.loads(sys.argv[1]):
    try:
        out[name] = nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByPciBusId(name))
    except nv.NVMLError as exc:
        out[name] = exc.value
print(json.dumps(out))
"""
INVALID_ARGUMENT, NOT_FOUND = 2, 6


def test_the_public_bus_id_lookup_parses_as_the_option_does(native: Path, tmp_path: Path):
    """``nvmlDeviceGetHandleByPciBusId`` reads a bus id with the parser ``-i`` goes
    through: the same spellings find the GPU, a well-formed id of no GPU is NOT_FOUND,
    and a string that is no bus id (which the lookup used to read leniently) is
    INVALID_ARGUMENT."""
    state = state_with_overrides("h100", tmp_path)
    config = write_config(tmp_path, state)
    domain, bus, device, _ = location(state.gpus[3].nvml_bus_id)
    found = [f"{domain:08X}:{bus:02X}:{device:02X}.0", f"{domain:04x}:{bus:02x}:{device:02x}.0",
             f"{domain:x}:{bus:x}:{device:x}", f"{bus:02X}:{device:02X}.0"]
    absent = [f"{domain:08X}:{bus:02X}:1F.0", f"{domain:08X}:{bus:02X}:{device:02X}.1"]
    malformed = [f"{bus:02X}:{device:02X}", f"{bus:02X}:{device:02X}.0 ", "zz:00.0", "1:2",
                 f"{domain:08X}:{bus:02X}:{device:02X}.0.0"]
    got = run_script(native, config, BY_BUS_ID_SCRIPT, json.dumps(found + absent + malformed))
    assert {name: got[name] for name in found} == dict.fromkeys(found, 3)
    assert {name: got[name] for name in absent} == dict.fromkeys(absent, NOT_FOUND)
    assert {name: got[name] for name in malformed} == dict.fromkeys(malformed, INVALID_ARGUMENT)


def limits(smi: Path, native: Path, config: Path) -> list[tuple[str, str]]:
    result = run_smi(smi, native, config, "--query-gpu=enforced.power.limit,power.limit",
                     "--format=csv,noheader")
    assert result.returncode == 0, result.stdout
    return [tuple(row.split(", ")) for row in result.stdout.splitlines()]


@pytest.mark.parametrize(("profile", "override_mw"), [("h100", 450000), ("gb200", 900000)])
def test_enforced_power_limit_is_the_public_getters(native: Path, smi: Path, tmp_path: Path,
                                                    profile: str, override_mw: int):
    for case, calls in (
        ("profile", []),
        ("override", [["set", "--gpu", "1", f"power.enforced_limit_mw={override_mw}"]]),
    ):
        where = tmp_path / case
        where.mkdir()
        state = state_with_overrides(profile, where, *calls)
        config = write_config(where, state)
        expected = [gpu.fields["power"]["enforced_limit_mw"] for gpu in state.gpus]
        if case == "override":
            assert expected[1] == override_mw
        assert public_enforced_limits(native, config) == expected
        watts = [f"{mw / 1000:.2f} W" for mw in expected]
        assert limits(smi, native, config) == list(zip(watts, watts, strict=True))
        if profile == "h100" and case == "profile":
            assert set(watts) == {H100_CAPTURE_LIMIT}
        # `-q` prints the same limit, read through the field values.
        report = run_smi(smi, native, config, "-q", "-d", "POWER", "-i", "1")
        assert report.returncode == 0, report.stdout
        current = re.findall(r"^        Current Power Limit +: (.*)$", report.stdout, re.M)
        assert current[0] == watts[1]
