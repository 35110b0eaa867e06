"""Profiles: built-ins compile, upstream shapes load unchanged, every rule's exact message."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from mokka.errors import SpecError
from mokka.state.compile import compile_profile
from mokka.state.profile import (
    BUILTIN_PROFILES,
    DEFAULT_PROFILE,
    Profile,
    load_profile,
    parse_profile,
)
from mokka.state.profile_files import read_profile_text
from tests.support import DATA

PROFILES = DATA / "profiles"
UPSTREAM_SHAPES = sorted(p for p in PROFILES.glob("*.yaml") if not p.name.startswith("topology-"))

#: GPU count, PCI device id, name, fabric-attached, NVSwitch, IB HCAs per built-in.
BUILTIN_FACTS = {
    "a100": (1, 0x20B0, "NVIDIA A100-SXM4-40GB", False, False, 0),
    "b200": (8, 0x2901, "NVIDIA B200", False, True, 8),
    "gb200": (4, 0x2941, "NVIDIA GB200", True, False, 4),
    "gb300": (4, 0x31C2, "NVIDIA GB300", True, False, 4),
    "h100": (8, 0x2330, "NVIDIA H100 80GB HBM3", False, True, 8),
    "l40s": (1, 0x26B9, "NVIDIA L40S", False, False, 0),
    "t4": (1, 0x1EB8, "Tesla T4", False, False, 0),
}


def base_doc() -> dict[str, Any]:
    return {
        "version": "1.0",
        "system": {"driver_version": "580.105.08", "cuda_version": "13.0"},
        "device_defaults": {"name": "NVIDIA Test", "pci": {"device_id": 0x233010DE}},
        "devices": [
            {"index": 0, "pci": {"bus_id": "0000:01:00.0"}},
            {"index": 1, "pci": {"bus_id": "0000:02:00.0"}},
            {"index": 2, "pci": {"bus_id": "0000:03:00.0"}},
            {"index": 3, "pci": {"bus_id": "0000:04:00.0"}},
        ],
    }


def problems_of(doc: Any) -> tuple[str, ...]:
    with pytest.raises(SpecError) as info:
        Profile.from_mapping(doc, source="h100.yaml")
    return info.value.problems


def with_change(path: str, value: Any, doc: dict[str, Any] | None = None) -> dict[str, Any]:
    """``base_doc`` with ``a.b[2].c`` set to ``value`` (``...`` deletes it)."""
    doc = copy.deepcopy(base_doc() if doc is None else doc)
    node: Any = doc
    keys: list[Any] = []
    for part in path.split("."):
        name, _, idx = part.partition("[")
        keys.append(name)
        if idx:
            keys.append(int(idx.rstrip("]")))
    for key in keys[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    if value is ...:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return doc


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_builtin_profile_compiles(name: str) -> None:
    count, device, product, attached, nvswitch, hcas = BUILTIN_FACTS[name]
    state = compile_profile(name, node_name="node-1")
    assert len(state.gpus) == count
    assert {g.pci_device_id for g in state.gpus} == {device}
    assert {g.pci_vendor_id for g in state.gpus} == {0x10DE}
    assert {g.name for g in state.gpus} == {product}
    assert state.fabric_attached is attached
    assert state.has_nvswitch is nvswitch
    assert (state.infiniband.hca_count if state.infiniband else 0) == hcas
    # every GPU sits under a root, and the minor numbers follow bus order
    assert sum(len(r.bdfs) for r in state.pcie_roots) == count
    assert [g.minor for g in sorted(state.gpus, key=lambda g: g.bus_id)] == list(range(count))
    assert state.profile_name == name


def test_default_profile_is_h100() -> None:
    assert DEFAULT_PROFILE == "h100"


def test_grace_boards_pair_gpus_with_grace_cpus() -> None:
    for name in ("gb200", "gb300"):
        state = compile_profile(name, node_name="node-1")
        assert [g.fields["grace_cpu_pair"] for g in state.gpus] == [0, 0, 1, 1]
        assert [g.numa_node for g in state.gpus] == [0, 0, 1, 1]
        assert state.nvlink is not None
        assert state.nvlink.c2c_enabled
        assert {g.fabric.state for g in state.gpus if g.fabric} == {"completed"}
        assert [g.module_id for g in state.gpus] == [1, 2, 3, 4]


@pytest.mark.parametrize("path", UPSTREAM_SHAPES, ids=lambda p: p.name)
def test_upstream_shape_profile_loads_unchanged(path: Path) -> None:
    profile = load_profile(path)
    state = compile_profile(path, node_name="worker-0")
    assert len(state.gpus) == len(profile.devices) >= 2
    # the document is kept whole: nothing dropped, nothing renamed
    assert set(state.profile_fields) == set(profile.document)


def test_unknown_device_fields_pass_through() -> None:
    state = compile_profile(PROFILES / "grace-pairs.yaml", node_name="worker-0")
    gpu = state.gpus[2]
    assert gpu.fields["grace_superchip"] == {"enabled": True, "cpu_cores": 72,
                                             "coherent_memory": True}
    assert gpu.fields["platform"]["chassis_serial_number"] == "1822700000200"
    assert gpu.module_id == 3
    assert state.profile_fields["dynamic_metrics_defaults"]["power"]["base_mw"] == 600000
    assert state.infiniband is not None
    assert state.infiniband.hca_count == 8  # 4 GPUs x 2


def test_helm_rendered_profile_reads_numbers_and_bus_ids() -> None:
    state = compile_profile(PROFILES / "helm-rendered.yaml", node_name="worker-0")
    gpu = state.gpus[1]
    # 0000:41:00.0 unquoted is a base-60 float under YAML 1.1
    assert gpu.bus_id == "0000:41:00.0"
    assert gpu.fields["memory"]["total_bytes"] == 206158430208
    assert isinstance(gpu.fields["memory"]["total_bytes"], int)
    assert (gpu.pci_device_id, gpu.pci_subsystem_device_id) == (0x2941, 0x2046)
    assert state.infiniband is None
    assert [r.id for r in state.pcie_roots] == ["pci0000:00", "pci0000:40"]


def test_a_cpulist_is_kept_as_the_kernel_spells_it() -> None:
    """sysfs and the engine config's ``cpu_affinity`` (which the library parses) must name
    the same CPUs: the profile's spelling is normalised once, where it is read."""
    doc = with_change("pcie_topology", {"root_complexes": [
        {"id": "pci0000:00", "devices": ["0000:01:00.0", "0000:02:00.0"],
         "cpulist": " 112-167 , 0 - 55,56"},
        {"id": "pci0000:80", "devices": ["0000:03:00.0", "0000:04:00.0"], "cpulist": "9,8,7"}]})
    profile = Profile.from_mapping(doc, source="p.yaml")
    assert [r.cpulist for r in profile.roots] == ["0-56,112-167", "7-9"]
    from mokka.simulators.gpudriver.engine_config import render_engine_config
    from mokka.state.compile import NodeMeta, compile_state
    text = render_engine_config(compile_state(profile, node=NodeMeta(node_name="n")))
    assert 'device.0.cpu_affinity: "0-56,112-167"\n' in text
    assert 'device.3.cpu_affinity: "7-9"\n' in text


def test_an_empty_pass_through_string_is_still_accepted() -> None:
    """The one-line check of every device string does not make an empty one an error."""
    doc = with_change("devices[1].inforom", {"oem_object": "", "ecc_object": "7.16"})
    profile = Profile.from_mapping(doc, source="p.yaml")
    assert profile.devices[1].config["inforom"]["oem_object"] == ""


def test_several_roots_keep_numa_and_order() -> None:
    state = compile_profile(PROFILES / "hgx-8gpu.yaml", node_name="worker-0")
    assert [(r.id, r.numa_node, len(r.bdfs)) for r in state.pcie_roots] == [
        ("pci0000:00", 0, 4), ("pci0000:80", 1, 4)]
    assert state.gpu(6).bus_id == "0000:ca:00.0"
    assert state.gpu(6).nvml_bus_id == "00000000:CA:00.0"
    assert len(state.nvlink.switches) == 4
    assert state.gpu(0).fabric.state == "auto"


def test_minimal_profile_fills_defaults() -> None:
    state = compile_profile(PROFILES / "minimal.yaml", node_name="worker-0")
    assert [g.minor for g in state.gpus] == [0, 1]
    assert state.system.nvml_version == "13.580.105.08"
    assert (state.system.cuda_version_major, state.system.cuda_version_minor) == (13, 0)
    assert state.system.cuda_driver_version == 13000
    # no pcie_topology: one root per PCI domain, NUMA 0
    assert [(r.id, r.numa_node, r.bdfs) for r in state.pcie_roots] == [
        ("pci0000:00", 0, ("0000:01:00.0", "0000:02:00.0"))]
    assert state.nvlink is None
    assert state.infiniband is None


def test_num_devices_selects_the_first_gpus() -> None:
    doc = with_change("system.num_devices", 2)
    doc["pcie_topology"] = {"root_complexes": [
        {"id": "pci0000:00", "numa_node": 0, "devices": ["0000:01:00.0", "0000:02:00.0"]},
        {"id": "pci0000:80", "numa_node": 1, "devices": ["0000:03:00.0", "0000:04:00.0"]},
    ]}
    profile = Profile.from_mapping(doc, source="p.yaml")
    assert [d.index for d in profile.selected_devices()] == [0, 1]
    from mokka.state.compile import NodeMeta, compile_state
    state = compile_state(profile, node=NodeMeta(node_name="n"))
    # the PCI tree follows the GPU count: the second root holds no GPU and goes
    assert [r.id for r in state.pcie_roots] == ["pci0000:00"]


# ---- validation: one test per rule, exact messages -------------------------

RULES = [
    ("version", ..., 'h100.yaml: version: missing, expected a schema version like "1.0"'),
    ("version", "2.0", "h100.yaml: version: '2.0' is not supported, expected 1.x"),
    ("system", ..., "h100.yaml: system: missing, expected a mapping with driver_version"),
    ("system.driver_version", ...,
     "h100.yaml: system.driver_version: missing, expected a driver version like 580.105.08"),
    ("system.driver_version", "580",
     "h100.yaml: system.driver_version: '580' is not a driver version of 2-3 dot-separated "
     "numbers like 580.105.08"),
    ("system.driver_version", "1.2.3.4",
     "h100.yaml: system.driver_version: '1.2.3.4' is not a driver version of 2-3 "
     "dot-separated numbers like 580.105.08"),
    ("system.cuda_version", "thirteen",
     "h100.yaml: system.cuda_version: 'thirteen' is not a CUDA version like \"13.0\""),
    ("system.cuda_version_major", 12,
     "h100.yaml: system.cuda_version_major: 12 contradicts cuda_version '13.0'"),
    ("system.driver", "x",
     "h100.yaml: system.driver: unknown key, expected one of: cuda_version, cuda_version_major, "
     "cuda_version_minor, dmi, driver_version, num_devices, nvml_version"),
    ("system.dmi", {"product": "X"},
     "h100.yaml: system.dmi.product: unknown key, expected one of: board_name, board_vendor, "
     "product_family, product_name, sys_vendor"),
    ("system.dmi", {"product_name": 7},
     "h100.yaml: system.dmi.product_name: 7 is not a string"),
    ("system.dmi", {"sys_vendor": "NVIDIA\nCorp"},
     "h100.yaml: system.dmi.sys_vendor: 'NVIDIA\\nCorp' holds a control character (a line "
     "break, tab, escape...), expected text on one line"),
    ("system.dmi", {"board_name": "B" * 65},
     "h100.yaml: system.dmi.board_name: is 65 bytes long, expected at most 64"),
    ("system.dmi", "DGXH100", "h100.yaml: system.dmi: 'DGXH100' is not a mapping"),
    ("system.num_devices", 9,
     "h100.yaml: system.num_devices: 9 is more than the 4 devices declared, expected at most 4"),
    ("gpus", [], "h100.yaml: gpus: unknown key, expected one of: device_defaults, devices, "
     "dynamic_metrics_defaults, infiniband, nvlink, pcie_topology, sources, system, version"),
    ("devices", [], "h100.yaml: devices: empty list, expected at least one device"),
    ("devices", ..., "h100.yaml: devices: missing, expected a list of device entries with "
     "index and pci.bus_id"),
    ("devices[3].pci.bus_id", "0000:1A:00",
     "h100.yaml: devices[3].pci.bus_id: '0000:1A:00' is not a PCI address DDDD:BB:DD.F"),
    ("devices[3].pci.bus_id", "0000:1A:20.0",
     "h100.yaml: devices[3].pci.bus_id: '0000:1A:20.0': PCI device number above 1f, "
     "expected a PCI address DDDD:BB:DD.F"),
    ("devices[3].pci.bus_id", "00010000:1A:00.0",
     "h100.yaml: devices[3].pci.bus_id: '00010000:1A:00.0': PCI domain above ffff, "
     "expected a PCI address DDDD:BB:DD.F"),
    ("devices[1].index", 0,
     "h100.yaml: devices[1].index: 0 repeats devices[0], expected a unique value per device"),
    ("devices[2].index", -1, "h100.yaml: devices[2].index: -1 is out of range, expected >= 0"),
    ("devices[2].minor_number", 0,
     "h100.yaml: devices[2].minor_number: 0 repeats devices[0], expected a unique value "
     "per device"),
    ("devices[2].minor_number", 254,
     "h100.yaml: devices[2].minor_number: 254 is out of range, expected 0..253"),
    ("devices[2].minor_number", "two",
     "h100.yaml: devices[2].minor_number: 'two' is not an integer"),
    ("devices[3].pci.bus_id", "0000:01:00.0",
     "h100.yaml: devices[3].pci.bus_id: '0000:01:00.0' repeats devices[0], expected a unique "
     "value per device"),
    ("devices[0].uuid", "GPU-1234",
     "h100.yaml: devices[0].uuid: 'GPU-1234' is not a GPU UUID "
     "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"),
    ("device_defaults.name", ...,
     "h100.yaml: device_defaults.name: missing (and in every device), expected the product "
     'name, e.g. "NVIDIA H100 80GB HBM3"'),
    ("device_defaults.pci.device_id", "0x2330",
     "h100.yaml: device_defaults.pci.device_id: '0x2330' is not an integer"),
    ("devices[1].compute_capability", {"major": "9", "minor": 0},
     "h100.yaml: devices[1].compute_capability.major: '9' is not an integer"),
    ("devices[1].memory", {"total_bytes": -1},
     "h100.yaml: devices[1].memory.total_bytes: -1 is out of range, expected "
     "0..18446744073709551615"),
    # NVML's counters are 64-bit: 10**30 bytes read as N/A in nvidia-smi
    ("devices[1].memory", {"total_bytes": 10**30},
     "h100.yaml: devices[1].memory.total_bytes: 1000000000000000000000000000000 is out of "
     "range, expected 0..18446744073709551615"),
    ("devices[1].fabric", {"state": "completed", "clique_id": 2**32},
     "h100.yaml: devices[1].fabric.clique_id: 4294967296 is out of range, expected "
     "0..4294967295"),
    # Every string of a device reaches the engine config: refused here, naming the profile's
    # field, rather than by the gpudriver stage after the PCI and IB trees were staged.
    ("device_defaults.name", "NVIDIA\nH100",
     "h100.yaml: device_defaults.name: 'NVIDIA\\nH100' holds a control character (a line "
     "break, tab, escape...), expected text on one line"),
    ("devices[1].inforom", {"oem_object": "2.1\x9b31m"},
     "h100.yaml: devices[1].inforom.oem_object: '2.1\\x9b31m' holds a control character (a "
     "line break, tab, escape...), expected text on one line"),
    ("devices[1].vbios_version", "9" * 4097,
     "h100.yaml: devices[1].vbios_version: is 4097 bytes long, expected at most 4096"),
    ("devices[1].fabric", {"state": "completed", "health": {"bandwidth": "Degradd"}},
     "h100.yaml: devices[1].fabric.health.bandwidth: 'Degradd' is not one of: full, degraded, "
     "n/a"),
    ("devices[1].pcie", {"max_link_gen": 7},
     "h100.yaml: devices[1].pcie.max_link_gen: found 7, expected an integer 1..6"),
    ("devices[1].pcie", {"current_link_width": 3},
     "h100.yaml: devices[1].pcie.current_link_width: found 3, expected one of 1, 2, 4, 8, 12, "
     "16, 32"),
    ("devices[1].pcie", {"current_link_gen": True},
     "h100.yaml: devices[1].pcie.current_link_gen: found True, expected an integer 1..6"),
    ("devices[1].pcie", {"max_host_link_gen": 0},
     "h100.yaml: devices[1].pcie.max_host_link_gen: found 0, expected an integer 1..6"),
    ("devices[1].encoder", {"engines": 0, "codecs": ["h264"]},
     "h100.yaml: devices[1].encoder.engines: 0 is out of range, expected 1..4294967295"),
    ("devices[1].encoder", {"engines": 1, "codecs": ["h264", "vp9"]},
     "h100.yaml: devices[1].encoder.codecs[1]: 'vp9' is not one of: h264, hevc, av1"),
    ("devices[1].encoder", {"engines": 1, "codecs": ["h264", "H264"]},
     "h100.yaml: devices[1].encoder.codecs[1]: 'H264' repeats an earlier codec, expected each "
     "codec once"),
    ("devices[1].encoder", {"engines": 1, "codecs": []},
     "h100.yaml: devices[1].encoder.codecs: empty list, expected a list of the codecs NVENC "
     "encodes, of: h264, hevc, av1"),
    ("devices[1].encoder", {"engines": 1},
     "h100.yaml: devices[1].encoder.codecs: missing, expected a list of the codecs NVENC "
     "encodes, of: h264, hevc, av1"),
    ("devices[1].encoder", {"engines": 1, "codecs": ["h264"], "decoders": 2},
     "h100.yaml: devices[1].encoder.decoders: unknown key, expected one of: codecs, engines"),
    ("pcie_topology", {"root_complexes": [{"id": "pci0000:00", "devices": [],
                                           "numa_node": 1024}]},
     "h100.yaml: pcie_topology.root_complexes[0].numa_node: 1024 is out of range, expected "
     "-1..1023"),
    ("devices[1].fabric", {"state": "ready"},
     "h100.yaml: devices[1].fabric.state: 'ready' is not one of: completed, in_progress, "
     "not_started, not_supported, auto"),
    ("devices[1].fabric", {"state": "auto", "cluster_uuid": "abc"},
     "h100.yaml: devices[1].fabric.cluster_uuid: 'abc' is not a UUID "
     "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"),
    ("devices[1].failure", {"mode": "melted"},
     "h100.yaml: devices[1].failure.mode: 'melted' is not one of: healthy, lost, "
     "fallen_off_bus, ecc_uncorrectable"),
    ("devices[1].failure", {"mode": "lost", "after": 3},
     "h100.yaml: devices[1].failure.after: unknown key, expected one of: after_calls, mode, "
     "probability, seed, xid"),
    ("devices[1].failure", {"probability": 1.5},
     "h100.yaml: devices[1].failure.probability: 1.5 is out of range, expected 0.0..1.0"),
    ("devices[1].xids", [{"code": 0}],
     "h100.yaml: devices[1].xids[0].code: 0 is out of range, expected 1..65535"),
    ("devices[1].platform", {"module_id": "one"},
     "h100.yaml: devices[1].platform.module_id: 'one' is not an integer"),
    ("nvlink", {"version": 4, "links_per_gpu": 18, "bandwidth_per_link_mbps": 1, "speed": 1},
     "h100.yaml: nvlink.speed: unknown key, expected one of: bandwidth_per_link_mbps, "
     "c2c_enabled, links_per_gpu, switches, version"),
    ("nvlink", {"version": 4, "bandwidth_per_link_mbps": 1},
     "h100.yaml: nvlink.links_per_gpu: missing, expected an integer >= 0"),
    ("nvlink", {"version": 4, "links_per_gpu": 18, "bandwidth_per_link_mbps": 1,
                "c2c_enabled": "yes"},
     "h100.yaml: nvlink.c2c_enabled: 'yes' is not true or false"),
    ("nvlink", {"version": 4, "links_per_gpu": 18, "bandwidth_per_link_mbps": 1,
                "switches": [{"bdf": "5:0.0", "uuid": "s"}]},
     "h100.yaml: nvlink.switches[0].bdf: '5:0.0' is not a PCI address DDDD:BB:DD.F"),
    ("infiniband", {"enabled": True, "rate": 400},
     "h100.yaml: infiniband.rate: unknown key, expected one of: board_id, enabled, fw_version, "
     "guid_prefix, hca_count, hca_type, hcas_per_gpu, hw_rev, link_layer, node_desc_template, "
     "phys_state, port_state, rate_gbps"),
    ("infiniband", {"rate_gbps": 300},
     "h100.yaml: infiniband.rate_gbps: 300 is not one of: 100, 200, 400, 800 (EDR, HDR, NDR, XDR)"),
    ("infiniband", {"hcas_per_gpu": 0},
     "h100.yaml: infiniband.hcas_per_gpu: 0 is out of range, expected 1..127"),
    ("pcie_topology", {"roots": []},
     "h100.yaml: pcie_topology.roots: unknown key, expected one of: root_complexes"),
    ("pcie_topology", {"root_complexes": [{"id": "pci0000:0", "devices": []}]},
     "h100.yaml: pcie_topology.root_complexes[0].id: 'pci0000:0' is not a root complex id "
     "pciDDDD:BB"),
    ("pcie_topology", {"root_complexes": [{"id": "pci0000:00", "devices": [], "numa": 0}]},
     "h100.yaml: pcie_topology.root_complexes[0].numa: unknown key, expected one of: cpulist, "
     "devices, id, numa_node"),
    # Python's int() reads other scripts' digits; the library and the kernel do not.
    ("pcie_topology", {"root_complexes": [
        {"id": "pci0000:00", "devices": [], "cpulist": "\u0660-\u0665\u0665"}]},
     "h100.yaml: pcie_topology.root_complexes[0].cpulist: '\u0660-\u0665\u0665' in CPU list "
     "'\u0660-\u0665\u0665' is not a CPU number or range like 0-55"),
    ("pcie_topology", {"root_complexes": [
        {"id": "pci0000:00", "devices": [], "cpulist": ",".join(map(str, range(0, 8000, 2)))}]},
     "h100.yaml: pcie_topology.root_complexes[0].cpulist: is 19444 bytes as the kernel spells "
     "it (0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,...), expected at most 4095 (one sysfs page)"),
    ("nvlink", {"version": 4, "links_per_gpu": 19, "bandwidth_per_link_mbps": 1},
     "h100.yaml: nvlink.links_per_gpu: 19 is out of range, expected 0..18"),
    ("pcie_topology", {"root_complexes": [
        {"id": "pci0000:00", "devices": []}, {"id": "pci0000:00", "devices": []}]},
     "h100.yaml: pcie_topology.root_complexes[1].id: 'pci0000:00' repeats an earlier root, "
     "expected unique ids"),
    ("pcie_topology", {"root_complexes": [
        {"id": "pci0000:00", "devices": ["0000:01:00.0"]},
        {"id": "pci0000:80", "devices": ["0000:01:00.0"]}]},
     "h100.yaml: pcie_topology.root_complexes[1].devices[0]: '0000:01:00.0' is already under "
     "pci0000:00, expected each device under at most one root"),
    ("pcie_topology", {"root_complexes": [{"id": "pci0000:00", "devices": ["0000:09:00.0"]}]},
     "h100.yaml: pcie_topology.root_complexes[0].devices[0]: '0000:09:00.0' is not the "
     "pci.bus_id of any entry in devices"),
    ("pcie_topology", {"root_complexes": [{"id": "pci0000:00", "devices": ["0000:1A:00"]}]},
     "h100.yaml: pcie_topology.root_complexes[0].devices[0]: '0000:1A:00' is not a PCI address "
     "DDDD:BB:DD.F"),
    # A bad value every device inherits is reported once, where it was written,
    # and never crashes the duplicate check it would have fed.
    ("devices[1].board_id", "0x6400",
     "h100.yaml: devices[1].board_id: '0x6400' is not an integer"),
    ("devices[1].board_id", 1 << 32,
     "h100.yaml: devices[1].board_id: 4294967296 is out of range, expected 0..4294967295"),
    ("device_defaults.minor_number", [1],
     "h100.yaml: device_defaults.minor_number: a list is not an integer"),
    ("device_defaults.minor_number", {"a": 1},
     "h100.yaml: device_defaults.minor_number: a mapping is not an integer"),
    # Without a minor_number the index is the minor, so it must fit one (254 is
    # nvidia-modeset's, 255 nvidiactl's).
    ("devices[3].index", 254,
     "h100.yaml: devices[3].index: 254 is also the minor number (no minor_number given), "
     "expected 0..253 or a minor_number"),
    ("system.cuda_version", -3, 'h100.yaml: system.cuda_version: -3 is not a CUDA version like '
     '"13.0"'),
    # NVML hands versions out in 80-byte buffers, and the driver version names files.
    ("system.driver_version", "580.105." + "0" * 80,
     "h100.yaml: system.driver_version: is 88 bytes long, expected at most 79"),
    ("system.driver_version", "580.105." + "0" * 70,
     "h100.yaml: system.driver_version: is 78 bytes long, too long for the NVML version "
     "<cuda major>.<driver version> of at most 79 bytes (or give system.nvml_version)"),
    ("system.nvml_version", "13.580\n",
     "h100.yaml: system.nvml_version: '13.580\\n' holds a control character (a line break, "
     "tab, escape...), expected text on one line"),
    ("system.nvml_version", "13.580\x9b31m",
     "h100.yaml: system.nvml_version: '13.580\\x9b31m' holds a control character (a line "
     "break, tab, escape...), expected text on one line"),
    ("system.nvml_version", "1" * 80,
     "h100.yaml: system.nvml_version: is 80 bytes long, expected at most 79"),
    # NVML's integer form is major * 1000 + minor * 10: 12.100 would read as 13.0.
    ("system.cuda_version", "12.100",
     "h100.yaml: system.cuda_version: minor version 100, expected at most 99"),
    ("system.cuda_version", 1000,
     "h100.yaml: system.cuda_version: major version 1000, expected at most 999"),
    # A block scalar's final newline, and digits of other scripts, are no driver version.
    ("system.driver_version", "580.105.08\n",
     "h100.yaml: system.driver_version: '580.105.08\\n' is not a driver version of 2-3 "
     "dot-separated numbers like 580.105.08"),
    ("system.driver_version", "\u0665\u0668\u0660.\u0661\u0660\u0665",
     "h100.yaml: system.driver_version: '\u0665\u0668\u0660.\u0661\u0660\u0665' is not a "
     "driver version of 2-3 dot-separated numbers like 580.105.08"),
    ("devices[1].failure", {"probability": float("nan")},
     "h100.yaml: devices[1].failure.probability: nan is not a number"),
    ("devices[1].pci.bus_id", "0000:02:00.0\n",
     "h100.yaml: devices[1].pci.bus_id: '0000:02:00.0\\n' is not a PCI address DDDD:BB:DD.F"),
]


@pytest.mark.parametrize(("path", "value", "message"), RULES, ids=[r[2][11:60] for r in RULES])
def test_validation_rule_message(path: str, value: Any, message: str) -> None:
    assert problems_of(with_change(path, value)) == (message,)


def test_every_problem_is_reported_at_once() -> None:
    doc = with_change("devices[3].pci.bus_id", "0000:1A:00")
    doc = with_change("system.driver_version", "x", doc)
    doc = with_change("nvlink", {"version": 4, "links_per_gpu": 18,
                                 "bandwidth_per_link_mbps": 1, "speed": 9}, doc)
    assert problems_of(doc) == (
        "h100.yaml: system.driver_version: 'x' is not a driver version of 2-3 dot-separated "
        "numbers like 580.105.08",
        "h100.yaml: devices[3].pci.bus_id: '0000:1A:00' is not a PCI address DDDD:BB:DD.F",
        "h100.yaml: nvlink.speed: unknown key, expected one of: bandwidth_per_link_mbps, "
        "c2c_enabled, links_per_gpu, switches, version",
    )


def test_document_that_is_not_a_mapping() -> None:
    assert problems_of(["a"]) == ("h100.yaml: (document): a list is not a mapping",)


def test_yaml_syntax_error_names_line_and_column() -> None:
    with pytest.raises(SpecError) as info:
        parse_profile("version: '1.0'\nsystem: [\n", source="bad.yaml")
    (problem,) = info.value.problems
    assert problem.startswith("bad.yaml: line 3 column 1: not valid YAML (")


def test_missing_profile_file_lists_the_builtins(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_profile(tmp_path / "nope.yaml")
    assert info.value.problems == (
        f"{tmp_path / 'nope.yaml'}: no such profile file, expected a readable YAML file or one "
        "of the built-in profiles a100, b200, gb200, gb300, h100, l40s, t4",)


def test_nvml_spelling_of_bus_ids_is_accepted() -> None:
    doc = with_change("devices[0].pci.bus_id", "00000000:1A:00.0")
    profile = Profile.from_mapping(doc, source="p.yaml")
    assert profile.devices[0].bus_id == "0000:1a:00.0"


def test_a_bad_bus_id_in_the_defaults_is_reported_not_raised() -> None:
    doc = base_doc()
    doc["device_defaults"]["pci"]["bus_id"] = "zz"
    for device in doc["devices"]:
        del device["pci"]
    assert problems_of(doc) == (
        "h100.yaml: device_defaults.pci.bus_id: 'zz' is not a PCI address DDDD:BB:DD.F",)
    doc["device_defaults"]["pci"]["bus_id"] = ["0000:01:00.0"]
    assert problems_of(doc) == (
        "h100.yaml: device_defaults.pci.bus_id: a list is not a PCI address DDDD:BB:DD.F",)


def test_a_null_minor_number_means_the_index() -> None:
    doc = with_change("devices[2].minor_number", None)
    profile = Profile.from_mapping(doc, source="p.yaml")
    assert [d.minor_number for d in profile.devices] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("!!binary AAEC", "device_defaults.vbios_version: b'\\x00\\x01\\x02' (a bytes value), "
                          "expected a string, number or boolean"),
        ("2024-01-01", "device_defaults.vbios_version: datetime.date(2024, 1, 1) (a date value), "
                       "expected a string, number or boolean"),
        ("!!set {a: null}", "device_defaults.vbios_version: {'a'} (a set value), expected a "
                            "string, number or boolean"),
        (".inf", "device_defaults.vbios_version: inf, expected a finite number"),
    ],
)
def test_a_value_the_engine_config_cannot_spell_is_refused_by_the_parser(
    written: str, message: str
) -> None:
    """YAML reads these to values no engine config line can carry: refused here, as
    a bad input (the last good state stays), not by the Stage wave (the node unready)."""
    _, text = read_profile_text("t4")
    text = text.replace("vbios_version: 90.04.96.00.02", f"vbios_version: {written}", 1)
    with pytest.raises(SpecError) as info:
        parse_profile(text, source="t4.yaml")
    assert info.value.problems == (f"t4.yaml: {message}",)
