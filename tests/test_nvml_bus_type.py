"""Bus type and PCIe link max speed of the mock NVML library.

``nvmlDeviceGetBusType`` and ``nvmlDeviceGetPcieLinkMaxSpeed`` through
NVIDIA's own Python bindings (nvidia-ml-py) and, for the error paths,
through the C ABI with ctypes; the PCIe figures against the real
nvidia-smi's report of the same node.  ``nvmlDeviceGetAttributes(_v2)``
serves MIG device handles only (nvml.h), and the library has none: a
whole GPU's stays NOT_SUPPORTED, as on a real one.  Each check runs in a child
interpreter because NVML state is process-global.  Expected values come
from the compiled State of the built-in profiles, so a profile change and
the library stay in step.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import attrs
import pytest

from mokka.state.compile import compile_profile
from mokka.state.model import Failure, Gpu, State
from tests.nvml_support import run_script, run_smi, write_config

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, GPU_IS_LOST = 0, 1, 2, 3, 15
BUS_TYPE_PCIE = 2  # NVML_BUS_TYPE_PCIE
#: nvml.h's NVML_PCIE_LINK_MAX_SPEED_* codes by PCIe generation (1: 2500 MB/s ... 6: 64000 MB/s).
MAX_SPEED_CODE = {1: 0x1, 2: 0x2, 3: 0x3, 4: 0x4, 5: 0x5, 6: 0x6}

#: The child: one command, one JSON document on stdout.
CHILD = r"""
import ctypes, json, sys
import pynvml as nv

def attempt(call):
    try:
        value = call()
    except nv.NVMLError as error:
        return {"error": error.value}
    if hasattr(value, "_fields_"):
        return {name: getattr(value, name) for name, *_ in value._fields_}
    return value

def queries(h):
    return {
        "bus_type": attempt(lambda: nv.nvmlDeviceGetBusType(h)),
        "max_speed": attempt(lambda: nv.nvmlDeviceGetPcieLinkMaxSpeed(h)),
        "max_gen": attempt(lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        "gpu_max_gen": attempt(lambda: nv.nvmlDeviceGetGpuMaxPcieLinkGeneration(h)),
        "attributes": attempt(lambda: nv.nvmlDeviceGetAttributes_v2(h)),
    }

lib = ctypes.CDLL("libnvidia-ml.so.1")
ENTRY = ("nvmlDeviceGetBusType", "nvmlDeviceGetPcieLinkMaxSpeed")
for name in ENTRY:
    getattr(lib, name).argtypes = (ctypes.c_void_p, ctypes.c_void_p)

def raw(name, handle, out):
    return getattr(lib, name)(handle, out)

command, *args = sys.argv[1:]
if command == "devices":
    nv.nvmlInit()
    out = [queries(nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]
    nv.nvmlShutdown()
elif command == "repeat":
    index, calls = int(args[0]), int(args[1])
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(index)
    out = {
        "calls": [queries(h) for _ in range(calls)],
        "uuid": attempt(lambda: nv.nvmlDeviceGetUUID(h)),
    }
    nv.nvmlShutdown()
elif command == "errors":
    buf = ctypes.create_string_buffer(64)
    out = {"uninitialized": [raw(n, None, buf) for n in ENTRY]}
    nv.nvmlInit()
    h = ctypes.cast(nv.nvmlDeviceGetHandleByIndex(0), ctypes.c_void_p)
    stray = ctypes.addressof(buf)  # an address that is no device handle
    out["null_output"] = [raw(n, h, None) for n in ENTRY]
    out["null_handle"] = [raw(n, None, buf) for n in ENTRY]
    out["stray_handle"] = [raw(n, stray, buf) for n in ENTRY]
    nv.nvmlShutdown()
print(json.dumps(out))
"""


def child(native: Path, config: Path, *args: str) -> Any:
    return run_script(native, config, CHILD, *args)


def state_of(profile: str) -> State:
    return compile_profile(profile, node_name="worker-1")


def with_gpu(state: State, index: int, **changes) -> State:
    gpus = tuple(attrs.evolve(g, **changes) if g.index == index else g for g in state.gpus)
    return attrs.evolve(state, gpus=gpus)


def pcie(gpu: Gpu) -> dict[str, int]:
    return gpu.fields["pcie"]


@pytest.mark.parametrize("profile", ["h100", "gb200", "a100", "b200", "gb300", "t4", "l40s"])
def test_bus_type_and_link_speed_follow_the_profile(
    native: Path, tmp_path: Path, profile: str
):
    state = state_of(profile)
    devices = child(native, write_config(tmp_path, state), "devices")
    assert len(devices) == len(state.gpus)
    for gpu, dev in zip(state.gpus, devices, strict=True):
        link = pcie(gpu)
        # SXM modules and GB200's Grace-attached GPUs are PCI Express devices.
        assert dev["bus_type"] == BUS_TYPE_PCIE
        # The link's top rate is the code of the generation the library
        # reports as the link's maximum; the GPU's own maximum is never below.
        assert dev["max_gen"] == link["max_link_gen"]
        assert dev["max_speed"] == MAX_SPEED_CODE[dev["max_gen"]]
        assert dev["gpu_max_gen"] == link.get("max_device_link_gen", link["max_link_gen"])
        assert dev["gpu_max_gen"] >= dev["max_gen"]

        # a whole GPU has no attributes record (MIG device handles only)
        assert dev["attributes"] == {"error": NOT_SUPPORTED}


def test_gb200_is_a_gen6_gpu_on_a_gen5_link(native: Path, tmp_path: Path):
    """The link's top rate is the link's (Grace's Gen 5 port), not the GPU's Gen 6."""
    devices = child(native, write_config(tmp_path, state_of("gb200")), "devices")
    # (max generation, GPU's max generation, NVML_PCIE_LINK_MAX_SPEED_32000MBPS)
    assert [(d["max_gen"], d["gpu_max_gen"], d["max_speed"]) for d in devices] == [(5, 6, 0x5)] * 4


def test_error_paths(native: Path, tmp_path: Path):
    got = child(native, write_config(tmp_path, state_of("h100")), "errors")
    # bus type, link max speed
    assert got["uninitialized"] == [UNINITIALIZED] * 2
    assert got["null_output"] == [INVALID_ARGUMENT] * 2
    assert got["null_handle"] == [INVALID_ARGUMENT] * 2
    assert got["stray_handle"] == [INVALID_ARGUMENT] * 2


def test_a_gpu_fallen_off_the_bus_fails_them(native: Path, tmp_path: Path):
    state = with_gpu(state_of("gb200"), 2, failure=Failure(mode="fallen_off_bus"))
    config = write_config(tmp_path, state)
    lost = child(native, config, "repeat", "2", "1")
    calls = lost["calls"][0]
    for name in ("bus_type", "max_speed", "max_gen", "gpu_max_gen"):
        assert calls[name] == {"error": GPU_IS_LOST}, name
    assert lost["uuid"] == state.gpus[2].uuid  # identity still answers
    healthy = child(native, config, "repeat", "1", "1")["calls"][0]
    assert healthy["bus_type"] == BUS_TYPE_PCIE
    assert healthy["max_speed"] == MAX_SPEED_CODE[5]


def test_they_count_as_guarded_calls(native: Path, tmp_path: Path):
    """`after_calls: N` lets N guarded calls through; these two count among them."""
    state = with_gpu(state_of("h100"), 0, failure=Failure(mode="lost", after_calls=3))
    calls = child(native, write_config(tmp_path, state), "repeat", "0", "1")["calls"][0]
    # queries() calls bus type, link max speed and max generation first.
    assert calls["bus_type"] == BUS_TYPE_PCIE
    assert calls["max_speed"] == MAX_SPEED_CODE[5]
    assert calls["max_gen"] == 5
    assert calls["gpu_max_gen"] == {"error": GPU_IS_LOST}


def smi_generations(report: str) -> list[tuple[int, int]]:
    """(Max, Device Max) of every GPU's "PCIe Generation" block in `nvidia-smi -q`."""
    blocks = re.findall(
        r"PCIe Generation\n\s+Max\s+: (\d+)\n\s+Current\s+: \d+\n"
        r"\s+Device Current\s+: \d+\n\s+Device Max\s+: (\d+)\n",
        report,
    )
    return [(int(a), int(b)) for a, b in blocks]


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_nvidia_smi_reports_the_generations_the_link_speed_follows(
    native: Path, smi: Path, tmp_path: Path, profile: str
):
    """The real nvidia-smi 535 prints no bus type or link max speed (its report
    is the same before and after these calls were implemented); its PCIe
    generations are the ones the link speed follows."""
    config = write_config(tmp_path, state_of(profile))
    devices = child(native, config, "devices")
    text = run_smi(smi, native, config, "-q")
    assert text.returncode == 0, text.stdout + text.stderr
    assert "Unknown Error" not in text.stdout
    expected = [(d["max_gen"], d["gpu_max_gen"]) for d in devices]
    assert smi_generations(text.stdout) == expected
    assert [MAX_SPEED_CODE[smi_max] for smi_max, _ in expected] == [d["max_speed"] for d in devices]
    xml = run_smi(smi, native, config, "-q", "-x")
    assert xml.returncode == 0, xml.stderr
    gpus = ET.fromstring(xml.stdout).findall("gpu")
    assert [
        (
            int(g.findtext("pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
            int(g.findtext("pci/pci_gpu_link_info/pcie_gen/max_device_link_gen")),
        )
        for g in gpus
    ] == expected
