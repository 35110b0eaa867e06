"""The built-in h100 profile against `nvidia-smi -q -x` of a real 8x H100 node."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from mokka.state.compile import compile_profile
from tests.support import DATA

MiB = 1 << 20
CAPTURE = DATA / "nvidia-smi" / "qx-h100.xml"


def _number(text: str | None) -> float:
    """``81559 MiB`` / ``700.00 W`` / ``1980 MHz`` → the number."""
    assert text is not None
    return float(text.split()[0])


@pytest.fixture(scope="module")
def capture() -> ET.Element:
    return ET.parse(CAPTURE).getroot()


def test_system_versions_match(capture: ET.Element) -> None:
    state = compile_profile("h100", node_name="node-1")
    assert state.system.driver_version == capture.findtext("driver_version")
    cuda = capture.findtext("cuda_version")
    assert f"{state.system.cuda_version_major}.{state.system.cuda_version_minor}" == cuda
    assert len(state.gpus) == int(capture.findtext("attached_gpus") or 0)


def test_every_gpu_matches_the_capture(capture: ET.Element) -> None:
    state = compile_profile("h100", node_name="node-1")
    real_gpus = capture.findall("gpu")
    assert len(real_gpus) == 8
    for gpu, real in zip(state.gpus, real_gpus, strict=True):
        f = gpu.fields
        assert gpu.name == real.findtext("product_name")
        assert gpu.architecture == (real.findtext("product_architecture") or "").lower()
        assert gpu.nvml_bus_id == real.findtext("pci/pci_bus_id")
        assert gpu.minor == int(real.findtext("minor_number") or -1)
        assert f["board_id"] == int(real.findtext("board_id") or "", 16)
        assert f["board_id"] == gpu.bus << 8
        assert gpu.module_id == int(real.findtext("platformInfo/module_id") or 0)
        assert f["board_part_number"] == real.findtext("board_part_number")
        # pci.device_id packs (device << 16) | vendor, exactly NVML's pciDeviceId
        assert f"{f['pci']['device_id']:08X}" == real.findtext("pci/pci_device_id")
        assert f"{f['pci']['subsystem_id']:08X}" == real.findtext("pci/pci_sub_system_id")
        assert f["memory"]["total_bytes"] == _number(real.findtext("fb_memory_usage/total")) * MiB
        assert f["memory"]["reserved_bytes"] == (
            _number(real.findtext("fb_memory_usage/reserved")) * MiB)
        assert f["bar1_memory"]["total_bytes"] == (
            _number(real.findtext("bar1_memory_usage/total")) * MiB)
        power = f["power"]
        readings = real.find("gpu_power_readings")
        assert readings is not None
        for key, tag in (("min_limit_mw", "min_power_limit"), ("max_limit_mw", "max_power_limit"),
                         ("default_limit_mw", "default_power_limit"),
                         ("enforced_limit_mw", "current_power_limit")):
            assert power[key] == _number(readings.findtext(tag)) * 1000, key
        clocks = f["clocks"]
        for key, tag in (("graphics_max", "graphics_clock"), ("sm_max", "sm_clock"),
                         ("memory_max", "mem_clock"), ("video_max", "video_clock")):
            assert clocks[key] == _number(real.findtext(f"max_clocks/{tag}")), key
        assert f["vbios_version"] == real.findtext("vbios_version")
        assert f["addressing_mode"].upper() == real.findtext("addressing_mode")


def test_module_ids_are_a_permutation_not_the_index() -> None:
    state = compile_profile("h100", node_name="node-1")
    modules = [g.module_id for g in state.gpus]
    assert sorted(modules) == list(range(1, 9))
    assert modules != list(range(1, 9))
