"""The built-in profiles against `nvidia-smi -q -x` captured on real nodes.

Two levels: the compiled ``State`` of each captured profile against the
capture, value by value (no client involved); then the real nvidia-smi 535
reading the mock library staged for the profile, element by element, with
the share of equal elements held to the figure ``docs/fidelity.md`` states
and every remaining difference accounted for (``tests.fidelity_support``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile
from mokka.state.model import Gpu
from tests import fidelity_support as fs

MiB = 1 << 20

#: Profiles whose PCI addresses follow their capture's node, so bus ids, board ids and
#: module ids are pinned too.  b200 keeps the DGX B200 layout and gb200 the NVL72 compute
#: tray's (one domain per GPU), which the PCI tree and IMEX tests are built on; the
#: captured nodes' firmware numbered their GPUs differently (see docs/fidelity.md).
SAME_ADDRESSES = ("a100", "h100")

#: The share of compared elements each capture must reach: the figures of docs/fidelity.md,
#: rounded down to a tenth of a percent.
DOCUMENTED_SHARE = {"a100": 0.976, "b200": 0.987, "gb200": 0.975, "gb300": 0.975,
                    "h100": 1.0, "l40s": 1.0, "t4": 1.0}

#: What nvidia-smi prints for a query the capture's driver no longer answers.
DEPRECATED = "Requested functionality has been deprecated"

#: nvidia-smi 535 asks for at most this many graphics clocks per memory clock.
SMI_535_MAX_GRAPHICS_CLOCKS = 256


def _number(text: str | None) -> float:
    """``81559 MiB`` / ``700.00 W`` / ``1980 MHz`` / ``-5 C`` → the number."""
    assert text is not None
    assert text != "N/A"
    return float(text.split()[0])


def _gpus(profile: str) -> list[tuple[Gpu, ET.Element]]:
    state = compile_profile(profile, node_name=fs.NODE_NAME)
    real = fs.load_capture(profile).findall("gpu")
    assert len(state.gpus) == len(real)
    return list(zip(state.gpus, real, strict=True))


@pytest.mark.parametrize("profile", fs.CAPTURED_PROFILES)
def test_system_versions_match(profile: str) -> None:
    state = compile_profile(profile, node_name=fs.NODE_NAME)
    capture = fs.load_capture(profile)
    assert state.system.driver_version == capture.findtext("driver_version")
    cuda = capture.findtext("cuda_version")
    assert f"{state.system.cuda_version_major}.{state.system.cuda_version_minor}" == cuda
    assert len(state.gpus) == int(capture.findtext("attached_gpus") or 0)


@pytest.mark.parametrize("profile", fs.CAPTURED_PROFILES)
def test_board_facts_match_the_capture(profile: str) -> None:
    for gpu, real in _gpus(profile):
        f = gpu.fields
        assert gpu.name == real.findtext("product_name")
        architecture = (real.findtext("product_architecture") or "").lower().replace(" ", "_")
        assert gpu.architecture == architecture
        assert gpu.minor == int(real.findtext("minor_number") or -1)
        assert f["board_part_number"] == real.findtext("board_part_number")
        assert f["gpu_part_number"] == real.findtext("gpu_part_number")
        assert f["vbios_version"] == real.findtext("vbios_version")
        assert f["gsp_firmware"]["version"] == real.findtext("gsp_firmware_version")
        assert f["inforom"]["image_version"] == real.findtext("inforom_version/img_version")
        assert f["inforom"]["oem_object"] == real.findtext("inforom_version/oem_object")
        assert f["inforom"]["ecc_object"] == real.findtext("inforom_version/ecc_object")
        assert f["addressing_mode"].upper() == (real.findtext("addressing_mode") or "").upper()
        assert f["persistence_mode"].capitalize() == real.findtext("persistence_mode")
        virtualization = f["virtualization"]["mode"].replace("passthrough", "pass-through")
        assert virtualization.title() == real.findtext(
            "gpu_virtualization_mode/virtualization_mode")
        # pci.device_id packs (device << 16) | vendor, exactly NVML's pciDeviceId
        assert f"{f['pci']['device_id']:08X}" == real.findtext("pci/pci_device_id")
        assert f"{f['pci']['subsystem_id']:08X}" == real.findtext("pci/pci_sub_system_id")


@pytest.mark.parametrize("profile", fs.CAPTURED_PROFILES)
def test_pcie_link_matches_the_capture(profile: str) -> None:
    for gpu, real in _gpus(profile):
        pcie = gpu.fields["pcie"]
        link = real.find("pci/pci_gpu_link_info")
        assert link is not None
        assert pcie["max_link_gen"] == int(link.findtext("pcie_gen/max_link_gen") or 0)
        # The GPU's own top generation: above the link's where the host is slower (GB200).
        device_max = pcie.get("max_device_link_gen", pcie["max_link_gen"])
        assert device_max == int(link.findtext("pcie_gen/max_device_link_gen") or 0)
        # The host side's top generation: stated only where the board reports one (GB300's
        # 4, below its Gen 6 link); N/A everywhere else.
        host_max = pcie.get("max_host_link_gen")
        assert str(host_max or "N/A") == link.findtext("pcie_gen/max_host_link_gen")
        assert f"{pcie['max_link_width']}x" == link.findtext("link_widths/max_link_width")


@pytest.mark.parametrize("profile", fs.CAPTURED_PROFILES)
def test_memory_matches_the_capture(profile: str) -> None:
    for gpu, real in _gpus(profile):
        f = gpu.fields
        assert f["memory"]["total_bytes"] == _number(real.findtext("fb_memory_usage/total")) * MiB
        assert f["memory"]["reserved_bytes"] == (
            _number(real.findtext("fb_memory_usage/reserved")) * MiB)
        assert f["bar1_memory"]["total_bytes"] == (
            _number(real.findtext("bar1_memory_usage/total")) * MiB)
        histogram = real.findtext("remapped_rows/row_remapper_histogram/row_remapper_histogram_max")
        if histogram is None:  # pre-Ampere: retired pages, no row remapper
            assert real.findtext("remapped_rows") == "N/A"
            assert "remapped_rows" not in f
            assert "retired_pages" in f
        else:
            assert f["remapped_rows"]["availability_histogram"]["max"] == _number(histogram)
        assert f["ecc"]["mode_current"].capitalize() == real.findtext("ecc_mode/current_ecc")
        if real.findtext("mig_mode/current_mig") == "N/A":  # a board without MIG
            assert "mig" not in f
        else:
            assert f["mig"]["mode_current"].capitalize() == real.findtext("mig_mode/current_mig")


_POWER_TAGS = (("min_limit_mw", "min_power_limit"), ("max_limit_mw", "max_power_limit"),
               ("default_limit_mw", "default_power_limit"),
               ("enforced_limit_mw", "current_power_limit"))


@pytest.mark.parametrize("profile", fs.CAPTURED_PROFILES)
def test_power_limits_match_the_capture(profile: str) -> None:
    for gpu, real in _gpus(profile):
        for block, section in (("power", "gpu_power_readings"),
                               ("module_power", "module_power_readings")):
            readings = real.find(section)
            assert readings is not None
            if readings.findtext("max_power_limit") == "N/A":
                # The board has no separate module budget: neither has the profile.
                assert block not in gpu.fields, (profile, block)
                continue
            for key, tag in _POWER_TAGS:
                assert gpu.fields[block][key] == _number(readings.findtext(tag)) * 1000, key


@pytest.mark.parametrize("profile", fs.CAPTURED_PROFILES)
def test_clocks_match_the_capture(profile: str) -> None:
    for gpu, real in _gpus(profile):
        clocks = gpu.fields["clocks"]
        for key, tag in (("graphics_max", "max_clocks/graphics_clock"),
                         ("sm_max", "max_clocks/sm_clock"),
                         ("memory_max", "max_clocks/mem_clock"),
                         ("video_max", "max_clocks/video_clock"),
                         ("graphics_app", "applications_clocks/graphics_clock"),
                         ("memory_app", "applications_clocks/mem_clock"),
                         ("graphics_app_default", "default_applications_clocks/graphics_clock"),
                         ("memory_app_default", "default_applications_clocks/mem_clock")):
            text = real.findtext(tag)
            if text == DEPRECATED:
                # Driver 595 no longer answers: the profile gives the max clock to the
                # clients that still ask (its sources say so).
                assert clocks[key] == clocks[key.split("_")[0] + "_max"], key
                continue
            assert clocks[key] == _number(text), key
        ours = gpu.fields["supported_clocks"]["memory_clocks"]
        theirs = real.findall("supported_clocks/supported_mem_clock")
        assert [m["freq_mhz"] for m in ours] == [_number(m.findtext("value")) for m in theirs]
        for mine, table in zip(ours, theirs, strict=True):
            graphics = [_number(c.text) for c in table.findall("supported_graphics_clock")]
            # The board's list, cut to what nvidia-smi 535 can read (GB200 has 260).
            assert list(mine["graphics_clocks"]) == graphics[:SMI_535_MAX_GRAPHICS_CLOCKS]


@pytest.mark.parametrize("profile", fs.CAPTURED_PROFILES)
def test_thermal_thresholds_match_the_capture(profile: str) -> None:
    pairs = (("shutdown_threshold_c", "gpu_temp_max_threshold"),
             ("slowdown_threshold_c", "gpu_temp_slow_threshold"),
             ("max_operating_c", "gpu_temp_max_gpu_threshold"),
             ("max_memory_operating_c", "gpu_temp_max_mem_threshold"),
             ("max_tlimit_threshold_c", "gpu_temp_max_tlimit_threshold"),
             ("slow_tlimit_threshold_c", "gpu_temp_slow_tlimit_threshold"),
             ("max_gpu_tlimit_threshold_c", "gpu_temp_max_gpu_tlimit_threshold"),
             ("max_mem_tlimit_threshold_c", "gpu_temp_max_mem_tlimit_threshold"))
    for gpu, real in _gpus(profile):
        compared = 0
        for key, tag in pairs:
            text = real.findtext(f"temperature/{tag}")
            if text is not None and text != "N/A":
                assert gpu.fields["thermal"][key] == _number(text), key
                compared += 1
        assert compared >= 3  # every capture reports one family of thresholds


@pytest.mark.parametrize("profile", SAME_ADDRESSES)
def test_addresses_and_slots_match_the_capture(profile: str) -> None:
    for gpu, real in _gpus(profile):
        assert gpu.nvml_bus_id == real.findtext("pci/pci_bus_id")
        assert gpu.fields["board_id"] == int(real.findtext("board_id") or "", 16)
        assert gpu.module_id == int(real.findtext("platformInfo/module_id") or 0)


@pytest.mark.parametrize("profile", ["gb200", "gb300"])
def test_board_id_is_the_profiles_not_the_bus_alone(profile: str) -> None:
    """Every GPU of a Grace tray sits on bus 01 of its own domain: the board id
    the library reports is the profile's, distinct per GPU."""
    state = compile_profile(profile, node_name=fs.NODE_NAME)
    config = render_engine_config(state)
    reported = [int(line.split(": ")[1]) for line in config.splitlines()
                if line.startswith("device.") and line.split(": ")[0].endswith(".board_id")]
    assert reported == [gpu.fields["board_id"] for gpu in state.gpus]
    assert reported == [0x80100, 0x90100, 0x180100, 0x190100]


def test_h100_module_ids_are_a_permutation_not_the_index() -> None:
    state = compile_profile("h100", node_name=fs.NODE_NAME)
    modules = [g.module_id for g in state.gpus]
    assert sorted(modules) == list(range(1, 9))
    assert modules != list(range(1, 9))


# ---- through the real nvidia-smi 535 ------------------------------------------------


@pytest.fixture(scope="module")
def comparisons(native: Path, smi: Path, tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("fidelity")
    return {p: fs.measure(p, smi, native, workdir / p) for p in fs.CAPTURED_PROFILES}


@pytest.mark.realclient
@pytest.mark.parametrize("profile", fs.CAPTURED_PROFILES)
def test_share_of_equal_elements_holds_the_documented_figure(comparisons, profile: str) -> None:
    c = comparisons[profile]
    # Enough common ground for the share to mean something: every GPU contributes.
    gpus = len(fs.load_capture(profile).findall("gpu"))
    assert c.compared >= 80 * gpus, c.compared
    assert c.share >= DOCUMENTED_SHARE[profile], (
        f"{profile}: {c.equal}/{c.compared} = {c.share:.4f} is below the documented "
        f"{DOCUMENTED_SHARE[profile]}: {sorted(c.differing_paths())}"
    )
    assert min(DOCUMENTED_SHARE.values()) >= 0.96


@pytest.mark.realclient
@pytest.mark.parametrize("profile", fs.CAPTURED_PROFILES)
def test_every_difference_is_known_and_every_known_one_still_occurs(
    comparisons, profile: str
) -> None:
    found = comparisons[profile].differing_paths()
    known = set(fs.KNOWN_DIFFERENCES[profile])
    assert found - known == set(), "differences not in KNOWN_DIFFERENCES / docs/fidelity.md"
    assert known - found == set(), "fixed: remove from KNOWN_DIFFERENCES and docs/fidelity.md"


@pytest.mark.realclient
def test_values_nvidia_smi_535_reads_only_through_the_export_table(comparisons) -> None:
    """Addressing mode, GPU part number, sparse mode, PCIe atomics and the host side's
    top PCIe generation come from private export-table slots: the mock fills them, so
    they equal the captures."""
    for profile, c in comparisons.items():
        for path in ("addressing_mode", "gpu_part_number", "sparse_operation_mode",
                     "pci/atomic_caps_inbound", "pci/atomic_caps_outbound",
                     "pci/pci_gpu_link_info/pcie_gen/max_host_link_gen"):
            assert path not in c.differing_paths(), (profile, path)


def test_comparison_counts_and_excludes_as_documented() -> None:
    """The comparison itself, on a hand-made pair: equal, different, dynamic,
    identity, one-sided and repeated elements."""
    real = ET.fromstring(
        "<nvidia_smi_log><timestamp>t1</timestamp><driver_version>580.1</driver_version>"
        "<cuda_version>13.0</cuda_version><attached_gpus>1</attached_gpus>"
        "<gpu><product_name>X</product_name><uuid>GPU-a</uuid><fan_speed>30 %</fan_speed>"
        "<vbios_version>1</vbios_version><only_real>N/A</only_real>"
        "<supported_clocks><supported_mem_clock><value>1 MHz</value>"
        "<supported_graphics_clock>2 MHz</supported_graphics_clock></supported_mem_clock>"
        "</supported_clocks><a><b>1</b><b>2</b></a></gpu></nvidia_smi_log>")
    ours = ET.fromstring(
        "<nvidia_smi_log><timestamp>t2</timestamp><driver_version>580.1</driver_version>"
        "<cuda_version>13.0</cuda_version><attached_gpus>1</attached_gpus>"
        "<gpu><product_name>X</product_name><uuid>GPU-b</uuid><fan_speed>0 %</fan_speed>"
        "<vbios_version>2</vbios_version><only_ours>1</only_ours>"
        "<supported_clocks><supported_mem_clock><value>1 MHz</value>"
        "<supported_graphics_clock>2 MHz</supported_graphics_clock></supported_mem_clock>"
        "</supported_clocks><a><b>1</b><b>3</b></a></gpu></nvidia_smi_log>")
    c = fs.compare("x", ours, real)
    # node: driver, cuda, count; gpu: name, vbios, supported_clocks (one), a/b, a/b[1];
    # excluded: timestamp, uuid, fan_speed
    assert (c.compared, c.equal, c.excluded) == (8, 6, 3)
    assert c.capture_elements == 4 + 8
    assert c.differing_paths() == {"vbios_version", "a/b"}
    assert [d.path for d in c.differences] == ["vbios_version", "a/b[1]"]
