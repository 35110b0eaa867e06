"""The real nvidia-smi 535 (Debian non-free, unpacked) against the mock library.

nvidia-smi is the strictest consumer: it resolves 234 NVML names lazily,
insists on its private export table, and prints whatever a call leaves in
its buffers.  Every command must exit 0 and print no "Function Not Found",
"Unknown Error" or "Uninitialized"; values must be the profile's.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs
import pytest

from mokka import layout
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.nvml_support import compiler, load_target, node_path, run_smi, write_config
from tests.support import DATA

pytestmark = pytest.mark.realclient

FORBIDDEN = ("Function Not Found", "Unknown Error", "Uninitialized", "ERR!")


def state_of(profile: str) -> State:
    return compile_profile(profile, node_name="worker-1")


def check_clean(result) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    for word in FORBIDDEN:
        assert word not in result.stdout, word
    return result.stdout


def test_list_gpus(native: Path, smi: Path, tmp_path: Path):
    state = state_of("h100")
    out = check_clean(run_smi(smi, native, write_config(tmp_path, state), "-L"))
    assert out.splitlines() == [
        f"GPU {i}: {g.name} (UUID: {g.uuid})" for i, g in enumerate(state.gpus)
    ]


@pytest.mark.parametrize("profile", ["h100", "gb200", "a100", "t4"])
def test_summary_table(native: Path, smi: Path, tmp_path: Path, profile: str):
    state = state_of(profile)
    out = check_clean(run_smi(smi, native, write_config(tmp_path, state)))
    major, minor = state.system.cuda_version_major, state.system.cuda_version_minor
    assert f"Driver Version: {state.system.driver_version}" in out
    assert f"CUDA Version: {major}.{minor}" in out
    for gpu in state.gpus:
        assert gpu.nvml_bus_id in out
        total_mib = gpu.fields["memory"]["total_bytes"] >> 20
        cap = gpu.fields["power"]["enforced_limit_mw"] // 1000
        # nvidia-smi cuts a cell that does not fit to "<prefix>...".
        assert re.search(rf"/ ({total_mib}MiB|{str(total_mib)[:3]}\d*\.\.\.)", out)
        assert re.search(rf"/ +({cap}W|{str(cap)[:1]}\.\.\.)", out)
    assert "No running processes found" in out


@pytest.mark.parametrize("profile", ["h100", "gb200", "a100", "t4", "l40s"])
def test_long_report(native: Path, smi: Path, tmp_path: Path, profile: str):
    state = state_of(profile)
    out = check_clean(run_smi(smi, native, write_config(tmp_path, state), "-q"))
    assert f"Attached GPUs                             : {len(state.gpus)}" in out
    for gpu in state.gpus:
        assert f"GPU {gpu.nvml_bus_id}" in out
        assert f"GPU UUID                              : {gpu.uuid}" in out
    # Power limits come from field values in 535: a missing entry prints stack garbage.
    limit = state.gpus[0].fields["power"]["max_limit_mw"] / 1000
    assert f"Max Power Limit                   : {limit:.2f} W" in out


# `-q -x` elements whose values the engine config defines, with how the
# profile spells them.  Values follow real hardware in the built-in H100
# profile, so they must equal the real capture's too.
H100_VALUES = {
    "product_name": "NVIDIA H100 80GB HBM3",
    "product_brand": "NVIDIA",
    "product_architecture": "Hopper",
    "persistence_mode": "Enabled",
    "mig_mode/current_mig": "Disabled",
    "accounting_mode": "Disabled",
    "accounting_mode_buffer_size": "4000",
    "minor_number": "0",
    "vbios_version": "96.00.99.00.01",
    "board_id": "0x5300",
    "board_part_number": "692-2G520-0200-000",
    "inforom_version/img_version": "G520.0200.00.05",
    "inforom_version/oem_object": "2.1",
    "inforom_version/ecc_object": "7.16",
    "gpu_virtualization_mode/virtualization_mode": "Pass-Through",
    "gsp_firmware_version": "580.105.08",
    "pci/pci_bus": "53",
    "pci/pci_device_id": "233010DE",
    "pci/pci_bus_id": "00000000:53:00.0",
    "pci/pci_sub_system_id": "16C110DE",
    "pci/pci_gpu_link_info/pcie_gen/max_link_gen": "5",
    "pci/pci_gpu_link_info/link_widths/max_link_width": "16x",
    "performance_state": "P0",
    "fb_memory_usage/total": "81559 MiB",
    "fb_memory_usage/reserved": "480 MiB",
    "bar1_memory_usage/total": "131072 MiB",
    "compute_mode": "Default",
    "ecc_mode/current_ecc": "Enabled",
    "remapped_rows/row_remapper_histogram/row_remapper_histogram_max": "2560 bank(s)",
    "temperature/gpu_temp": "29 C",
    "temperature/memory_temp": "37 C",
    "gpu_power_readings/current_power_limit": "700.00 W",
    "gpu_power_readings/default_power_limit": "700.00 W",
    "gpu_power_readings/min_power_limit": "200.00 W",
    "gpu_power_readings/max_power_limit": "700.00 W",
    "max_clocks/graphics_clock": "1980 MHz",
    "max_clocks/sm_clock": "1980 MHz",
    "max_clocks/mem_clock": "2619 MHz",
    "max_clocks/video_clock": "1545 MHz",
    "applications_clocks/graphics_clock": "1980 MHz",
    "fabric/state": "Completed",
    "fabric/status": "Success",
    # 535 reads these through private export-table slots (docs/nvml.md)
    "addressing_mode": "HMM",
    "gpu_part_number": "2330-885-A1",
    "sparse_operation_mode": "Disabled",
    "temperature/gpu_temp_tlimit": "58 C",
}

# Values the real board reports but the mock prints as N/A: none left (the
# InfoROM black-box flush is timed from the boot: tests/test_nvml_bbx_flush.py).
KNOWN_NA: set[str] = set()


def element_paths(gpu: ET.Element) -> set[str]:
    paths: set[str] = set()

    def walk(element: ET.Element, prefix: str) -> None:
        for child in element:
            path = f"{prefix}{child.tag}"
            paths.add(path)
            walk(child, path + "/")

    walk(gpu, "")
    return paths


def test_xml_report_matches_the_real_h100_capture(native: Path, smi: Path, tmp_path: Path):
    state = state_of("h100")
    config = write_config(tmp_path, state)
    # The fabric manager is up (fabric state Completed): the library reads the
    # marker's mirror beside the engine config.
    node_path(tmp_path, layout.FABRIC_READY_MIRROR).touch()
    ours = ET.fromstring(check_clean(run_smi(smi, native, config, "-q", "-x")))
    real = ET.parse(DATA / "nvidia-smi" / "qx-h100.xml").getroot()
    assert ours.findtext("driver_version") == state.system.driver_version
    assert ours.findtext("attached_gpus") == "8"
    ours_gpu, real_gpu = ours.findall("gpu")[0], real.findall("gpu")[0]
    assert ours_gpu.get("id") == real_gpu.get("id") == "00000000:53:00.0"
    common = element_paths(ours_gpu) & element_paths(real_gpu)
    # 535 writes the v12 vocabulary, the capture v13: most elements are shared.
    assert len(common) >= 200, sorted(element_paths(real_gpu) - common)
    for path, expected in H100_VALUES.items():
        assert (ours_gpu.findtext(path) or "<missing>").strip() == expected, path
        if path in common:
            assert (real_gpu.findtext(path) or "").strip() == expected, f"capture differs: {path}"
    missing = set()
    for path in common:
        element = ours_gpu.find(path)
        if len(element) or (real_gpu.find(path).text or "N/A").strip() in ("N/A", ""):
            continue
        if (element.text or "").strip() == "N/A":
            missing.add(path)
    # Where the real board reports a value, so does the mock (with known exceptions).
    assert missing == KNOWN_NA
    for gpu, element in zip(state.gpus, ours.findall("gpu"), strict=True):
        assert element.findtext("uuid") == gpu.uuid
        assert element.findtext("serial") == gpu.serial


def test_query_gpu_csv(native: Path, smi: Path, tmp_path: Path):
    state = state_of("h100")
    query = "name,uuid,pci.bus_id,memory.total,driver_version,power.limit,clocks.max.sm"
    out = check_clean(
        run_smi(smi, native, write_config(tmp_path, state), f"--query-gpu={query}", "--format=csv")
    )
    rows = list(csv.reader(io.StringIO(out), skipinitialspace=True))
    assert rows[0] == [
        "name",
        "uuid",
        "pci.bus_id",
        "memory.total [MiB]",
        "driver_version",
        "power.limit [W]",
        "clocks.max.sm [MHz]",
    ]
    for gpu, row in zip(state.gpus, rows[1:], strict=True):
        assert row == [
            gpu.name,
            gpu.uuid,
            gpu.nvml_bus_id,
            f"{gpu.fields['memory']['total_bytes'] >> 20} MiB",
            state.system.driver_version,
            f"{gpu.fields['power']['enforced_limit_mw'] / 1000:.2f} W",
            f"{gpu.fields['clocks']['sm_max']} MHz",
        ]


def test_topology_matrix_over_nvswitch(native: Path, smi: Path, tmp_path: Path):
    state = state_of("h100")
    out = check_clean(run_smi(smi, native, write_config(tmp_path, state), "topo", "-m"))
    rows = [line.split("\t") for line in out.splitlines() if line.startswith("GPU")]
    assert len(rows) == 8
    for i, row in enumerate(rows):
        cells = [c.strip() for c in row[1:9]]
        assert cells[i] == "X"
        assert all(c == "NV18" for j, c in enumerate(cells) if j != i)
        cpus = next(r.cpulist for r in state.pcie_roots if r.id == state.gpus[i].root_complex)
        assert row[9].strip() == cpus
        assert row[10].strip() == str(state.gpus[i].numa_node)


def test_topology_matrix_uses_export_table_slot_23(native: Path, smi: Path, tmp_path: Path):
    """Without NVLink, topo -m asks the PCI path through slot 23 of the export table."""
    state = attrs.evolve(state_of("h100"), nvlink=None)
    out = check_clean(run_smi(smi, native, write_config(tmp_path, state), "topo", "-m"))
    rows = [line.split("\t") for line in out.splitlines() if line.startswith("GPU")]
    for i, row in enumerate(rows):
        for j, cell in enumerate(row[1:9]):
            a, b = state.gpus[i], state.gpus[j]
            if i == j:
                expected = "X"
            elif a.root_complex == b.root_complex:
                expected = "PHB"
            elif a.numa_node == b.numa_node:
                expected = "NODE"
            else:
                expected = "SYS"
            assert cell.strip() == expected, (i, j)


def test_export_table_is_the_smallest_that_works(smi: Path, tmp_path: Path):
    """0x7a0 bytes prints everything; one slot less leaves a field Uninitialized."""
    config = write_config(tmp_path, state_of("h100"))
    nvml = load_target("nvml")
    outputs = {}
    for size in ("0x7a0", "0x798"):
        out = tmp_path / size
        nvml.build(out, compiler(), [f"-DMOCK_EXPORT_TABLE_BYTES={size}"])
        result = run_smi(smi, out, config, "-q", "-i", "0")
        assert result.returncode == 0
        outputs[size] = result.stdout
    assert "Uninitialized" not in outputs["0x7a0"]
    assert "Uninitialized" in outputs["0x798"]
    # The shipped default is that smallest size.
    source = (load_target("nvml").HERE / "export_table.c").read_text()
    assert re.search(r"#define MOCK_EXPORT_TABLE_BYTES 0x7a0\b", source)


def test_missing_config_reports_no_driver(native: Path, smi: Path, tmp_path: Path):
    result = run_smi(smi, native, tmp_path / "absent.yaml", "-L")
    assert result.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in result.stdout
