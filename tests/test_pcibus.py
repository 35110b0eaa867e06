"""The pcibus simulator: the mock PCI tree as real ``lspci`` reads it, its
hierarchy and config space, convergence, the shim copy, the NFD feature
file, and teardown back to the exact starting tree."""

from __future__ import annotations

import argparse
import importlib.util
import os
import struct
import subprocess
from pathlib import Path

import attrs
import pytest

from mokka import layout
from mokka.errors import NativeArtifactMissing, SpecError
from mokka.noderoot.host import Host
from mokka.simulators import registry
from mokka.simulators.base import Applier, Simulator
from mokka.simulators.pcibus import PLUGIN, PcibusSettings, PcibusSimulator
from mokka.simulators.pcibus.config_space import build_config
from mokka.simulators.pcibus.hierarchy import plan_tree, split_bdf
from mokka.state.compile import compile_profile
from mokka.state.cpulists import format_cpulist, format_cpumask, parse_cpulist
from mokka.state.model import Gpu, Nvlink, NvlinkSwitch, RootComplex, State, System
from tests.support import ROOT, require_tool, snapshot

#: Upstream HGX H100 layout (its profile's pcie_topology): two root
#: complexes, four GPUs each, four NVSwitches.
H100_BDFS = (
    "0000:1a:00.0", "0000:1b:00.0", "0000:4a:00.0", "0000:4b:00.0",
    "0000:8a:00.0", "0000:8b:00.0", "0000:ca:00.0", "0000:cb:00.0",
)
H100_SWITCHES = ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0")


def _gpu(index: int, bdf: str, root: str, numa: int, *, device: int = 0x2330,
         subsystem: int = 0x16C1, arch: str = "hopper", gen: int = 5) -> Gpu:
    return Gpu(
        index=index, minor=index, uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        serial=f"165432100000{index}", name="NVIDIA GPU", brand="Nvidia", architecture=arch,
        bus_id=bdf, pci_vendor_id=0x10DE, pci_device_id=device, pci_subsystem_vendor_id=0x10DE,
        pci_subsystem_device_id=subsystem, root_complex=root, numa_node=numa,
        fields={"pcie": {"max_link_gen": gen, "current_link_gen": gen,
                         "max_link_width": 16, "current_link_width": 16}},
    )


def h100_state(gpus: int = 8) -> State:
    """An HGX H100 node (upstream's layout, real ids 10de:2330 / 10de:16c1), built by hand."""
    bdfs = H100_BDFS[:gpus]
    roots = (
        RootComplex(id="pci0000:00", numa_node=0, bdfs=tuple(b for b in bdfs if b < "0000:80")),
        RootComplex(id="pci0000:80", numa_node=1, bdfs=tuple(b for b in bdfs if b >= "0000:80")),
    )
    return State(
        generation=1, content_hash="test", node_name="node-a", profile_name="h100",
        system=System(driver_version="580.105.08", nvml_version="13.580.105.08",
                      cuda_version_major=13, cuda_version_minor=0),
        gpus=tuple(
            _gpu(i, bdf, "pci0000:00" if bdf < "0000:80" else "pci0000:80", int(bdf >= "0000:80"))
            for i, bdf in enumerate(bdfs)
        ),
        pcie_roots=roots,
        nvlink=Nvlink(version=4, links_per_gpu=18, bandwidth_per_link_mbps=26562,
                      switches=tuple(NvlinkSwitch(bdf=b, uuid=f"NVSwitch-{b}")
                                     for b in H100_SWITCHES)),
    )


def gb200_state() -> State:
    """A GB200 compute tray: four Blackwell GPUs (10de:2941) on four root complexes in
    their own PCI domains, two per Grace CPU, Gen 6 links, CPU lists per root."""
    layout_ = (("0008", 0), ("0009", 0), ("0018", 1), ("0019", 1))
    cpulists = ("0-71", "72-143")
    return State(
        generation=1, content_hash="test", node_name="node-a", profile_name="gb200",
        system=System(driver_version="580.173.02", nvml_version="13.580.173.02",
                      cuda_version_major=13, cuda_version_minor=0),
        gpus=tuple(
            _gpu(i, f"{dom}:01:00.0", f"pci{dom}:00", numa, device=0x2941, subsystem=0x2046,
                 arch="blackwell", gen=6)
            for i, (dom, numa) in enumerate(layout_)
        ),
        pcie_roots=tuple(
            RootComplex(id=f"pci{dom}:00", numa_node=numa, bdfs=(f"{dom}:01:00.0",),
                        cpulist=cpulists[numa])
            for dom, numa in layout_
        ),
        nvlink=Nvlink(version=5, links_per_gpu=18, bandwidth_per_link_mbps=53125, c2c_enabled=True,
                      switches=(NvlinkSwitch(bdf="0000:01:00.0", uuid="NVSwitch-0"),)),
    )


def build_mockfs(out_dir: Path) -> Path:
    """Build libmockfs.so with its own native target (what native/build.py runs)."""
    spec = importlib.util.spec_from_file_location("mockfs_target", ROOT / "native/mockfs/target.py")
    assert spec is not None
    assert spec.loader is not None
    target = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(target)
    (built,) = target.build(out_dir, require_tool("cc"))
    return built


@pytest.fixture(scope="session")
def mockfs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("native")
    build_mockfs(out)
    return out


@pytest.fixture
def native(mockfs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(mockfs_dir))
    return mockfs_dir / "libmockfs.so"


@pytest.fixture
def sim() -> PcibusSimulator:
    return PcibusSimulator(PcibusSettings(fallback_cpus=8))


def sys_root(root: Path) -> Path:
    return root / layout.SYS_ROOT.lstrip("/")


def lspci(root: Path, *args: str) -> str:
    """Real lspci on the staged tree through libpci's own sysfs path option."""
    result = subprocess.run(
        [require_tool("lspci"), "-A", "linux-sysfs", "-O",
         f"sysfs.path={sys_root(root)}/bus/pci", *args],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# --------------------------------------------------------------------------
# Real lspci on the staged tree
# --------------------------------------------------------------------------


async def test_lspci_lists_exactly_the_h100_node(host: Host, node_root: Path, native: Path,
                                                  sim: PcibusSimulator) -> None:
    before = snapshot(node_root)
    await sim.stage(host, h100_state())

    lines = lspci(node_root, "-nn").splitlines()
    gpus = [ln for ln in lines if "[0302]" in ln]
    assert [ln.split()[0] for ln in gpus] == [b[5:] for b in H100_BDFS]
    for line in gpus:
        assert "3D controller [0302]: NVIDIA Corporation GH100[H100 SXM5 80GB] [10de:2330]" in line
    switches = [ln for ln in lines if "[0680]" in ln]
    assert [ln.split()[0] for ln in switches] == [b[5:] for b in H100_SWITCHES]
    assert all("NVIDIA Corporation Device [10de:22a3]" in ln for ln in switches)
    bridges = [ln for ln in lines if "[0604]" in ln]
    assert len(bridges) == 12
    assert all("Broadcom / LSI PEX890xx PCIe Gen 5 Switch [1000:c030]" in ln for ln in bridges)
    assert len(lines) == 8 + 4 + 12

    verbose = lspci(node_root, "-vv", "-s", "8a:00.0")
    assert "NUMA node: 1" in verbose
    assert "Subsystem: NVIDIA Corporation Device 16c1" in verbose
    assert "LnkCap:\tPort #0, Speed 32GT/s, Width x16" in verbose
    assert "LnkSta:\tSpeed 32GT/s, Width x16" in verbose
    assert "Kernel driver in use: nvidia" in verbose
    assert "NUMA node: 0" in lspci(node_root, "-vv", "-s", "1a:00.0")

    # Tree view: every GPU hangs off its own switch port, under its root bus.
    tree = lspci(node_root, "-t")
    assert tree.startswith("-+-[0000:00]-+-01.0-[05]----00.0\n")
    assert "+-05.0-[1a]----00.0" in tree
    assert "\\-[0000:80]-+-01.0-[8a]----00.0" in tree
    assert "\\-04.0-[cb]----00.0" in tree

    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_lspci_lists_the_gb200_tray_in_its_domains(
    host: Host, node_root: Path, native: Path, sim: PcibusSimulator
) -> None:
    before = snapshot(node_root)
    await sim.stage(host, gb200_state())

    lines = lspci(node_root, "-nn").splitlines()
    gpus = [ln.split()[0] for ln in lines if "[0302]" in ln]
    assert gpus == ["0008:01:00.0", "0009:01:00.0", "0018:01:00.0", "0019:01:00.0"]
    assert all("NVIDIA Corporation Device [10de:2941]" in ln for ln in lines if "[0302]" in ln)
    assert [ln.split()[0] for ln in lines if "[0680]" in ln] == ["0000:01:00.0"]
    assert len(lines) == 4 + 1 + 5  # GPUs, NVSwitch, a switch port in front of each

    verbose = lspci(node_root, "-vv", "-s", "0018:01:00.0")
    assert "NUMA node: 1" in verbose
    assert "LnkSta:\tSpeed 64GT/s, Width x16" in verbose
    tree = lspci(node_root, "-t")
    for domain in ("0008", "0009", "0018", "0019"):
        assert f"[{domain}:00]---01.0-[01]----00.0" in tree

    gpu_dir = sys_root(node_root) / "bus/pci/devices/0018:01:00.0"
    assert (gpu_dir / "local_cpulist").read_text() == "72-143\n"
    # 144 CPUs: four 32-bit chunks and a 16-bit one; bits 72..143 set.
    assert (gpu_dir / "local_cpus").read_text() == "ffff,ffffffff,ffffff00,00000000,00000000\n"

    await sim.discard(host)
    assert snapshot(node_root) == before


#: Names bookworm's pci.ids gives the built-in profiles' GPUs (others print "Device xxxx").
PCI_IDS_NAMES = {
    0x2330: "GH100[H100 SXM5 80GB]",
    0x20B0: "GA100 [A100 SXM4 40GB]",
    0x1EB8: "TU104GL [Tesla T4]",
}


@pytest.mark.parametrize("profile", ["a100", "b200", "gb200", "gb300", "h100", "l40s", "t4"])
async def test_builtin_profiles_through_lspci(
    profile: str, host: Host, node_root: Path, native: Path, sim: PcibusSimulator
) -> None:
    state = compile_profile(profile, node_name="node-a")
    before = snapshot(node_root)
    await sim.stage(host, state)

    lines = lspci(node_root, "-D", "-nn").splitlines()
    gpus = {ln.split()[0]: ln for ln in lines if "[0302]" in ln}
    assert sorted(gpus) == sorted(g.bus_id for g in state.gpus)
    switches = [ln.split()[0] for ln in lines if "[0680]" in ln]
    assert switches == sorted(s.bdf for s in (state.nvlink.switches if state.nvlink else ()))
    bridges = [ln for ln in lines if "[0604]" in ln]
    assert len(lines) == len(gpus) + len(switches) + len(bridges)
    tree = lspci(node_root, "-t")
    for gpu in state.gpus:
        line = gpus[gpu.bus_id]
        assert f"NVIDIA Corporation {PCI_IDS_NAMES.get(gpu.pci_device_id, 'Device')}" in line
        assert f"[{gpu.pci_vendor_id:04x}:{gpu.pci_device_id:04x}]" in line
        assert f"NUMA node: {gpu.numa_node}" in lspci(node_root, "-vv", "-s", gpu.bus_id)
        # Behind a switch port whose secondary bus is the GPU's.
        _, bus, device, function = split_bdf(gpu.bus_id)
        assert f"-[{bus:02x}]----{device:02x}.{function}" in tree

    await sim.discard(host)
    assert snapshot(node_root) == before


# --------------------------------------------------------------------------
# The tree's files and links
# --------------------------------------------------------------------------


async def test_sysfs_files_links_and_driver(host: Host, node_root: Path, native: Path,
                                            sim: PcibusSimulator) -> None:
    before = snapshot(node_root)
    await sim.stage(host, h100_state())
    sysfs = sys_root(node_root)

    link = sysfs / "bus/pci/devices/0000:1a:00.0"
    assert os.readlink(link) == "../../../devices/pci0000:00/0000:00:05.0/0000:1a:00.0"
    gpu = link.resolve()
    assert gpu == sysfs / "devices/pci0000:00/0000:00:05.0/0000:1a:00.0"
    expected = {
        "vendor": "0x10de\n", "device": "0x2330\n", "subsystem_vendor": "0x10de\n",
        "subsystem_device": "0x16c1\n", "class": "0x030200\n", "revision": "0x00\n",
        "numa_node": "0\n", "local_cpulist": "0-7\n", "local_cpus": "ff\n",
    }
    for name, content in expected.items():
        assert (gpu / name).read_text() == content, name
    assert (gpu / "irq").read_text().strip().isdigit()
    assert (gpu / "resource").read_text().splitlines() == [
        "0x0000000000000000 0x0000000000000000 0x0000000000000000"] * 13
    assert oct((gpu / "vendor").stat().st_mode & 0o777) == "0o444"
    # The link as the kernel spells it: a Gen 5 x16 GPU behind a port of the same link.
    for device in (gpu, gpu.parent):
        for kind in ("max", "current"):
            assert (device / f"{kind}_link_speed").read_text() == "32.0 GT/s PCIe\n"
            assert (device / f"{kind}_link_width").read_text() == "16\n"

    assert os.readlink(gpu / "driver") == "../../../../bus/pci/drivers/nvidia"
    assert (gpu / "driver").resolve() == sysfs / "bus/pci/drivers/nvidia"
    bound = sorted(p.name for p in (sysfs / "bus/pci/drivers/nvidia").iterdir())
    assert bound == sorted(H100_BDFS + H100_SWITCHES)
    assert (sysfs / "bus/pci/drivers/nvidia/0000:1a:00.0").resolve() == gpu

    bridge = sysfs / "devices/pci0000:00/0000:00:05.0"
    assert (bridge / "class").read_text() == "0x060400\n"
    assert not (bridge / "driver").exists()
    assert len((bridge / "resource").read_text().splitlines()) == 17
    # Everything under bus/pci/devices resolves, and nothing else is there.
    listed = sorted(os.listdir(sysfs / "bus/pci/devices"))
    assert len(listed) == 24
    assert all((sysfs / "bus/pci/devices" / n / "config").stat().st_size == 256 for n in listed)
    # Beside the bus: the DMI identity (class/dmi and devices/virtual/dmi).
    assert sorted(os.listdir(sysfs)) == ["bus", "class", "devices"]
    assert sorted(os.listdir(sysfs / "devices")) == ["pci0000:00", "pci0000:80", "virtual"]

    await sim.discard(host)
    assert snapshot(node_root) == before


def test_config_space_bytes() -> None:
    tree = plan_tree(h100_state(), fallback_cpus=4)
    gpu = next(f for f in tree.functions if f.bdf == "0000:cb:00.0")
    config = build_config(gpu)
    assert len(config) == 256
    assert struct.unpack_from("<HH", config, 0) == (0x10DE, 0x2330)
    assert config[0x09:0x0C] == bytes([0x00, 0x02, 0x03])
    assert config[0x0E] == 0
    assert struct.unpack_from("<HH", config, 0x2C) == (0x10DE, 0x16C1)
    # Capability list: status bit 4, pointer at 0x34, PCIe capability there.
    assert config[0x06] & 0x10
    cap = config[0x34]
    assert (config[cap], config[cap + 1]) == (0x10, 0)
    lnkcap = struct.unpack_from("<I", config, cap + 0x0C)[0]
    assert (lnkcap & 0xF, (lnkcap >> 4) & 0x3F) == (5, 16)

    bridge = next(f for f in tree.functions if f.bdf == "0000:80:04.0")
    config = build_config(bridge)
    assert config[0x0E] == 1
    assert config[0x09:0x0C] == bytes([0x00, 0x04, 0x06])
    assert (config[0x18], config[0x19], config[0x1A]) == (0x80, 0xCB, 0xCB)


# --------------------------------------------------------------------------
# Hierarchy: bridge addresses, roots, validation
# --------------------------------------------------------------------------


def test_bridge_addresses_never_collide_with_endpoints() -> None:
    """A GPU on the root bus itself takes a slot; bridges allocate around it."""
    state = attrs.evolve(
        h100_state(2),
        gpus=(
            _gpu(0, "0000:00:01.0", "pci0000:00", 0),  # directly on the root bus
            _gpu(1, "0000:00:03.0", "pci0000:00", 0),
            _gpu(2, "0000:1a:00.0", "pci0000:00", 0),
            _gpu(3, "0000:1a:00.1", "pci0000:00", 0),  # same bus: shares the port
            _gpu(4, "0000:1b:00.0", "pci0000:00", 0),
        ),
        pcie_roots=(RootComplex(id="pci0000:00", numa_node=0),),
        nvlink=None,
    )
    tree = plan_tree(state, fallback_cpus=1)
    bdfs = [f.bdf for f in tree.functions]
    assert len(bdfs) == len(set(bdfs))
    bridges = {f.bdf: f.secondary_bus for f in tree.by_role("bridge")}
    assert bridges == {"0000:00:02.0": 0x1A, "0000:00:04.0": 0x1B}
    paths = {f.bdf: f.path for f in tree.functions}
    assert paths["0000:00:01.0"] == "devices/pci0000:00/0000:00:01.0"
    assert paths["0000:1a:00.1"] == "devices/pci0000:00/0000:00:02.0/0000:1a:00.1"


def _one_root_state(gpus: int) -> State:
    """``gpus`` GPUs on buses 01.. under the one default root (a profile without topology)."""
    return attrs.evolve(
        h100_state(1), nvlink=None, pcie_roots=(RootComplex(id="pci0000:00", numa_node=0),),
        gpus=tuple(_gpu(i, f"0000:{i + 1:02x}:00.0", "pci0000:00", 0) for i in range(gpus)),
    )


async def test_sixty_four_gpus_under_one_root_complex(
    host: Host, node_root: Path, native: Path, sim: PcibusSimulator
) -> None:
    """As many GPUs as the engine config takes (64), with no ``pcie_topology``.

    A root bus has 32 device numbers, so past 32 switch ports the ports are
    further functions of the first ones (multi-function root ports, as real
    root complexes have), function 0 of each device first: the layout of
    nodes with up to 32 ports is unchanged.
    """
    before = snapshot(node_root)
    state = _one_root_state(64)
    await sim.stage(host, state)
    assert sim.readiness.ready, sim.readiness.reason
    lines = lspci(node_root, "-n").splitlines()
    assert [ln.split()[0] for ln in lines if " 0302: " in ln] == [
        f"{i + 1:02x}:00.0" for i in range(64)
    ]
    bridges = [ln.split()[0] for ln in lines if " 0604: " in ln]
    assert len(bridges) == 64
    assert bridges[:2] == ["00:00.0", "00:00.1"]  # device 0 last, so in BDF order first
    assert "00:01.0" in bridges
    assert "00:01.1" in bridges
    assert "00:02.0" in bridges
    # Every GPU sits below its own port: secondary bus = the GPU's bus.
    tree = plan_tree(state, fallback_cpus=1)
    ports = {f.secondary_bus: f for f in tree.by_role("bridge")}
    assert sorted(ports) == list(range(1, 65))
    for gpu in tree.by_role("gpu"):
        assert gpu.path.split("/")[2] == ports[split_bdf(gpu.bdf)[1]].bdf
    # Function 0 of a device with more functions says so in its header type.
    header = (sys_root(node_root) / "devices/pci0000:00/0000:00:01.0/config").read_bytes()[0x0E]
    assert header == 0x81
    single = plan_tree(_one_root_state(8), fallback_cpus=1).by_role("bridge")
    assert [f.bdf for f in single] == [f"0000:00:{d:02x}.0" for d in range(1, 9)]
    assert {build_config(f)[0x0E] for f in single} == {0x01}
    await sim.discard(host)
    assert snapshot(node_root) == before


def test_a_root_bus_without_a_free_device_number_is_a_clear_error() -> None:
    # GPUs on all 32 device numbers of the root bus leave none for a port.
    on_root = [_gpu(i, f"0000:00:{i:02x}.0", "pci0000:00", 0) for i in range(32)]
    state = attrs.evolve(_one_root_state(1), gpus=(
        *on_root, _gpu(32, "0000:01:00.0", "pci0000:00", 0)))
    with pytest.raises(SpecError, match=r"pci0000:00 has no free device number on its bus"):
        plan_tree(state, fallback_cpus=1)


def test_switch_goes_under_the_root_owning_its_bus() -> None:
    state = attrs.evolve(
        h100_state(),
        nvlink=Nvlink(version=4, links_per_gpu=18, bandwidth_per_link_mbps=1,
                      switches=(NvlinkSwitch(bdf="0000:85:00.0", uuid="s0"),
                                NvlinkSwitch(bdf="0000:05:00.0", uuid="s1"))),
    )
    tree = plan_tree(state, fallback_cpus=1)
    switches = {f.bdf: (f.root, f.numa_node) for f in tree.by_role("nvswitch")}
    assert switches == {"0000:05:00.0": ("pci0000:00", 0), "0000:85:00.0": ("pci0000:80", 1)}


def test_no_topology_means_one_root_on_numa_zero() -> None:
    state = attrs.evolve(h100_state(2), pcie_roots=(), nvlink=None,
                         gpus=tuple(attrs.evolve(g, root_complex="pci0000:00", numa_node=0)
                                    for g in h100_state(2).gpus))
    tree = plan_tree(state, fallback_cpus=2)
    assert {f.root for f in tree.functions} == {"pci0000:00"}
    assert {f.numa_node for f in tree.functions} == {0}
    assert {f.cpulist for f in tree.functions} == {"0-1"}


def test_bad_pcie_generation_is_a_clear_spec_error() -> None:
    state = h100_state(1)
    bad = attrs.evolve(state.gpus[0], fields={"pcie": {"max_link_gen": 9}})
    with pytest.raises(SpecError, match=r"h100: devices\[0\]\.pcie\.max_link_gen: found 9, "
                                        r"expected an integer 1\.\.6"):
        plan_tree(attrs.evolve(state, gpus=(bad,)), fallback_cpus=1)


@pytest.mark.parametrize(("pcie", "message"), [
    ({"max_link_gen": 1, "current_link_gen": 6}, r"current_link_gen: found 6, expected at most "
                                                 r"the max_link_gen"),
    ({"max_link_width": 1, "current_link_width": 32}, r"current_link_width: found 32, expected "
                                                      r"at most the max_link_width"),
])
def test_a_link_faster_than_its_capability_is_refused(pcie: dict, message: str) -> None:
    """lspci calls such a link "overdriven": no real device reports one."""
    state = h100_state(1)
    bad = attrs.evolve(state.gpus[0], fields={"pcie": pcie})
    with pytest.raises(SpecError, match=r"h100: devices\[0\]\.pcie\." + message):
        plan_tree(attrs.evolve(state, gpus=(bad,)), fallback_cpus=1)


def test_bad_cpulist_names_the_field() -> None:
    state = gb200_state()
    roots = (attrs.evolve(state.pcie_roots[0], cpulist="0-x"), *state.pcie_roots[1:])
    with pytest.raises(SpecError, match=r"gb200: pcie_topology\.root_complexes\[0\]\.cpulist: "
                                        r"'0-x' in CPU list"):
        plan_tree(attrs.evolve(state, pcie_roots=roots), fallback_cpus=1)


def test_duplicate_address_is_rejected() -> None:
    state = attrs.evolve(
        h100_state(1),
        nvlink=Nvlink(version=4, links_per_gpu=18, bandwidth_per_link_mbps=1,
                      switches=(NvlinkSwitch(bdf="0000:1a:00.0", uuid="s0"),)),
    )
    with pytest.raises(SpecError, match=r"0000:1a:00\.0 is used by both a gpu and a nvswitch"):
        plan_tree(state, fallback_cpus=1)


@pytest.mark.parametrize(
    ("cpus", "nbits", "mask"),
    [
        ((0, 1), 2, "3"),
        (tuple(range(56)), 56, "ffffff,ffffffff"),
        (tuple(range(64)), 64, "ffffffff,ffffffff"),
        ((0,), 33, "0,00000001"),
        ((32,), 40, "01,00000000"),
    ],
)
def test_cpumask_matches_the_kernel_spelling(cpus: tuple[int, ...], nbits: int, mask: str) -> None:
    assert format_cpumask(cpus, nbits) == mask


def test_cpulist_round_trip_and_errors() -> None:
    assert parse_cpulist("0-3, 8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpulist(parse_cpulist("0-3,8,10-11")) == "0-3,8,10-11"
    assert parse_cpulist(" 0 - 3 ,8") == (0, 1, 2, 3, 8)
    for bad, message in (("", "empty item"), ("3-1", "empty or negative"),
                         ("0-99999", "exceeds the kernel limit"), ("a", "not a CPU number"),
                         # other scripts' digits: Python's int() reads them, no kernel does
                         ("\u0660-\u0665", "not a CPU number"), ("0-\uff15", "not a CPU number"),
                         ("1-2-3", "not a CPU number"), ("-1", "not a CPU number")):
        with pytest.raises(ValueError, match=message):
            parse_cpulist(bad)


# --------------------------------------------------------------------------
# Convergence, idempotence, the shim copy, failure without the shim
# --------------------------------------------------------------------------


async def test_shrinking_eight_to_four_removes_the_rest(
    host: Host, node_root: Path, native: Path, sim: PcibusSimulator, tmp_path: Path
) -> None:
    before = snapshot(node_root)
    await sim.stage(host, h100_state(8))
    await sim.stage(host, h100_state(4))

    gpus = [ln.split()[0] for ln in lspci(node_root, "-n").splitlines() if " 0302: " in ln]
    assert gpus == ["1a:00.0", "1b:00.0", "4a:00.0", "4b:00.0"]
    sysfs = sys_root(node_root)
    assert not (sysfs / "devices/pci0000:80").exists()
    assert not (sysfs / "bus/pci/drivers/nvidia/0000:8a:00.0").exists()

    # The shrunk tree equals a tree staged with four GPUs from scratch.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    await sim.stage(Host(fresh), h100_state(4))
    assert snapshot(sys_root(node_root)) == snapshot(sys_root(fresh))
    await sim.discard(Host(fresh))

    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_second_stage_rewrites_nothing(host: Host, node_root: Path, native: Path,
                                             sim: PcibusSimulator) -> None:
    before = snapshot(node_root)
    await sim.stage(host, h100_state())
    # The staged surface (the host's own manifest bookkeeping aside).
    staged = node_root / layout.STATE_ROOT.lstrip("/")
    first = {p: p.lstat().st_mtime_ns for p in staged.rglob("*")}
    tree = snapshot(staged)
    await sim.stage(host, h100_state())
    assert snapshot(staged) == tree
    assert {p: p.lstat().st_mtime_ns for p in staged.rglob("*")} == first
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_shim_is_staged_in_the_driver_tree(host: Host, node_root: Path, native: Path,
                                                 sim: PcibusSimulator) -> None:
    before = snapshot(node_root)
    await sim.stage(host, h100_state(1))
    staged = node_root / layout.DRIVER_LOCAL_LIB.lstrip("/") / "libmockfs.so"
    assert staged.read_bytes() == native.read_bytes()  # noqa: ASYNC240 (a test's own check)
    assert staged.stat().st_mode & 0o777 == 0o755
    assert sim.readiness.ready
    assert "1 GPU(s), 5 bridge(s), 4 NVSwitch(es)" in sim.readiness.reason
    await sim.discard(host)
    assert not sim.readiness.ready
    assert snapshot(node_root) == before


async def test_stage_without_the_shim_fails_and_writes_nothing(
    host: Host, node_root: Path, sim: PcibusSimulator, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    empty = tmp_path / "no-native"
    empty.mkdir()
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(empty))
    before = snapshot(node_root)
    with pytest.raises(NativeArtifactMissing, match=r"'libmockfs\.so' not built"):
        await sim.stage(host, h100_state())
    assert not sim.readiness.ready
    assert "libmockfs.so" in sim.readiness.reason
    await sim.revoke(host)
    await sim.discard(host)
    assert snapshot(node_root) == before


# --------------------------------------------------------------------------
# NFD feature file (Apply / Revoke)
# --------------------------------------------------------------------------


async def test_feature_file_apply_and_revoke_leave_other_files(
    host: Host, node_root: Path, native: Path, sim: PcibusSimulator
) -> None:
    features = node_root / layout.NFD_FEATURES_DIR.lstrip("/")
    features.mkdir(parents=True)
    (features / "other-vendor.features").write_text("vendor-x.present=true\n")
    before = snapshot(node_root)

    await sim.stage(host, h100_state())
    await sim.apply(host, h100_state())
    assert (features / "mokka.features").read_text() == "pci-10de.present=true\n"
    assert sorted(os.listdir(features)) == ["mokka.features", "other-vendor.features"]
    await sim.apply(host, h100_state())  # idempotent

    await sim.revoke(host)
    assert sorted(os.listdir(features)) == ["other-vendor.features"]
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_feature_file_in_a_configured_directory(host: Host, node_root: Path,
                                                      native: Path) -> None:
    parser = argparse.ArgumentParser()
    PLUGIN.add_arguments(parser)
    custom = PLUGIN.build(parser.parse_args(["--nfd-features-dir", "/var/lib/nfd/features.d"]))
    before = snapshot(node_root)
    await custom.apply(host, h100_state())
    assert (node_root / "var/lib/nfd/features.d/mokka.features").read_text() == \
        "pci-10de.present=true\n"
    # A state without GPUs announces nothing.
    await custom.apply(host, attrs.evolve(h100_state(), gpus=()))
    assert not (node_root / "var/lib/nfd/features.d/mokka.features").exists()
    await custom.revoke(host)
    await custom.discard(host)
    assert snapshot(node_root) == before


# --------------------------------------------------------------------------
# Wiring
# --------------------------------------------------------------------------


def test_plugin_is_registered_and_speaks_both_protocols() -> None:
    assert "mokka.simulators.pcibus" in registry.PLUGIN_MODULES
    assert PLUGIN.name == "pcibus"
    parser = argparse.ArgumentParser()
    PLUGIN.add_arguments(parser)
    built = PLUGIN.build(parser.parse_args([]))
    assert isinstance(built, Simulator)
    assert isinstance(built, Applier)
    assert built.name == "pcibus"
    assert built.settings.nfd_features_dir == layout.NFD_FEATURES_DIR
    assert built.settings.fallback_cpus >= 1


def test_settings_reject_a_relative_features_dir() -> None:
    with pytest.raises(SpecError, match=r"--nfd-features-dir: got 'features\.d', expected an "
                                        r"absolute node path"):
        PcibusSettings(nfd_features_dir="features.d")
    with pytest.raises(SpecError, match=r"fallback_cpus: got 0, expected 1\.\.8192"):
        PcibusSettings(fallback_cpus=0)


def test_masks_span_the_profiles_cpus_not_this_machines() -> None:
    """With every root's CPU list given, the machine's own CPU count plays no part."""
    tree = plan_tree(attrs.evolve(gb200_state(), nvlink=None), fallback_cpus=512)
    assert {f.cpumask for f in tree.functions if f.root == "pci0008:00"} == {
        "0000,00000000,000000ff,ffffffff,ffffffff"}
