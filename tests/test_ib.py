"""The ib simulator: the mock InfiniBand tree as the real ``ibstat``, ``ibstatus``
and ``ibv_devinfo`` read it, its exact contents and device numbers,
convergence, the tool wrappers (running the machine's tools; the image's
bundle staged into the driver tree is ``test_ib_tools.py``), the verbs shim
(whose ABI declarations are checked against rdma-core's own header), and
teardown back to the exact starting tree."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from mokka import layout
from mokka.errors import NativeArtifactMissing, SpecError
from mokka.noderoot.host import Host
from mokka.simulators import registry
from mokka.simulators.base import Simulator
from mokka.simulators.ib import PLUGIN, IbSettings, IbSimulator
from mokka.simulators.ib.bundle import STAGED_DIR
from mokka.simulators.ib.hca import plan_hcas
from mokka.simulators.ib.settings import DEFAULT_TOOLS_DIR
from mokka.simulators.ib.tools import IBSTAT, Tool, wrapper_script
from mokka.simulators.pcibus import PcibusSimulator
from mokka.state.compile import compile_profile
from mokka.state.model import State
from mokka.state.profile import read_profile_text
from tests.ib_support import (
    NO_TOOLS,
    discard_with_pcibus,
    ib_native_fixture,  # noqa: F401  (a fixture: tests name it ib_native)
    native_env_fixture,  # noqa: F401  (a fixture: tests name it native_env)
    stage,
    stage_with_pcibus,
    state_of,
)
from tests.nvml_support import compiler
from tests.support import ROOT, require_tool, snapshot

IB = layout.IB_ROOT.lstrip("/")
BIN = layout.DRIVER_BIN.lstrip("/")
STAGED = STAGED_DIR
PREFIXES = "/sys/class/infiniband:/sys/class/infiniband_mad:/sys/class/infiniband_verbs:" \
    "/dev/infiniband"
def words(text: str) -> list[str]:
    return text.split()


COUNTERS = words(
    "VL15_dropped excessive_buffer_overrun_errors link_downed link_error_recovery "
    "local_link_integrity_errors multicast_rcv_packets multicast_xmit_packets "
    "port_rcv_constraint_errors port_rcv_data port_rcv_errors port_rcv_packets "
    "port_rcv_remote_physical_errors port_rcv_switch_relay_errors "
    "port_xmit_constraint_errors port_xmit_data port_xmit_discards port_xmit_packets "
    "port_xmit_wait symbol_error unicast_rcv_packets unicast_xmit_packets"
)


def groups(value: int, width: int) -> str:
    digits = f"{value:0{width * 4}x}"
    return ":".join(digits[i : i + 4] for i in range(0, len(digits), 4))


def expected_tree(state: State) -> dict[str, tuple]:
    """The ib subtree of ``snapshot`` for ``state``, written out independently."""
    ib = state.infiniband
    assert ib is not None
    ro = 0o444
    tree: dict[str, tuple] = {
        "sys/class/infiniband_mad/abi_version": ("file", ro, b"5\n"),
        "sys/class/infiniband_verbs/abi_version": ("file", ro, b"6\n"),
    }
    device_id = int(ib.hca_type[2:])
    # A node without a topology document is a fabric of its own: its leaf
    # switch has LID 2 (the spine and SM have 1), its HCAs 3 upwards.
    lids = [3 + i for i in range(ib.hca_count)]
    for i, guid_text in enumerate(ib.node_guids):
        guid = groups(int(guid_text, 16), 4)
        hca = f"sys/class/infiniband/mlx5_{i}"
        files = {
            "node_type": "1: CA", "node_guid": guid, "sys_image_guid": guid,
            "fw_ver": ib.fw_version, "hw_rev": ib.hw_rev, "board_id": ib.board_id,
            "hca_type": ib.hca_type,
            "device/modalias": f"pci:v000015B3d{device_id:08X}sv000015B3sd00000000bc02sc07i00",
            "device/vendor": "0x15b3", "device/device": f"0x{device_id:04x}",
            "device/subsystem_vendor": "0x15b3", "device/subsystem_device": "0x0000",
            "device/class": "0x020700",
            "ports/1/state": "4: ACTIVE", "ports/1/phys_state": "5: LinkUp",
            "ports/1/rate": f"{ib.rate_gbps} Gb/sec (4X "
            f"{ {100: 'EDR', 200: 'HDR', 400: 'NDR', 800: 'XDR'}[ib.rate_gbps]})",
            "ports/1/lid": f"0x{lids[i]:04x}", "ports/1/lid_mask_count": "0",
            "ports/1/sm_lid": "0x0001", "ports/1/sm_sl": "0", "ports/1/cap_mask": "0xa751e848",
            "ports/1/link_layer": "InfiniBand",
            "ports/1/gids/0": "fe80:0000:0000:0000:" + guid, "ports/1/pkeys/0": "0xffff",
            "ports/1/gid_attrs/types/0": "IB/RoCE v1",
            **{f"ports/1/counters/{c}": "0" for c in COUNTERS},
        }
        for name, text in files.items():
            tree[f"{hca}/{name}"] = ("file", ro, f"{text}\n".encode())
        tree[f"{hca}/node_desc"] = ("file", 0o644, f"node-a mlx5_{i}\n".encode())
        for kind, minor in (("umad", i), ("issm", 64 + i)):
            entry = f"sys/class/infiniband_mad/{kind}{i}"
            tree[f"{entry}/ibdev"] = ("file", ro, f"mlx5_{i}\n".encode())
            tree[f"{entry}/port"] = ("file", ro, b"1\n")
            tree[f"{entry}/dev"] = ("file", ro, f"231:{minor}\n".encode())
            tree[f"dev/infiniband/{kind}{i}"] = ("dev", 0o600, 231, minor)
        entry = f"sys/class/infiniband_verbs/uverbs{i}"
        tree[f"{entry}/ibdev"] = ("file", ro, f"mlx5_{i}\n".encode())
        tree[f"{entry}/abi_version"] = ("file", ro, b"1\n")
        tree[f"{entry}/dev"] = ("file", ro, f"231:{192 + i}\n".encode())
        tree[f"dev/infiniband/uverbs{i}"] = ("dev", 0o666, 231, 192 + i)
    return tree


def ib_files(root: Path) -> dict[str, tuple]:
    """Everything but directories in the staged ib subtree, relative to it."""
    return {k: v for k, v in snapshot(root / IB).items() if v[0] != "dir"}


# --------------------------------------------------------------------------
# The tree
# --------------------------------------------------------------------------


@pytest.mark.parametrize(("profile", "hcas"), [("h100", 8), ("gb200", 4)])
async def test_stage_writes_exactly_the_documented_tree(
    node_root: Path, profile: str, hcas: int
) -> None:
    before = snapshot(node_root)
    state = state_of(profile)
    assert state.infiniband is not None
    assert state.infiniband.hca_count == hcas
    sim = await stage(node_root, state)
    assert sim.readiness.ready
    assert f"{hcas} HCA(s)" in sim.readiness.reason
    assert ib_files(node_root) == expected_tree(state)
    # Every directory is 0755, and the classes hold exactly the HCAs.
    tree = snapshot(node_root / IB)
    assert {v for v in tree.values() if v[0] == "dir"} == {("dir", 0o755)}
    names = sorted(p.name for p in (node_root / IB / "sys/class/infiniband").iterdir())
    assert names == sorted(f"mlx5_{i}" for i in range(hcas))
    lids = [int((node_root / IB / f"sys/class/infiniband/mlx5_{i}/ports/1/lid").read_text(), 16)
            for i in range(hcas)]
    assert len(set(lids)) == hcas
    assert all(2 <= lid <= 0xBFFF for lid in lids)
    for tool in ("ibstat", "ibstatus"):
        assert os.stat(node_root / BIN / tool).st_mode & 0o777 == 0o755
    assert not (node_root / BIN / "ibv_devinfo").exists()  # full mode only
    await sim.discard(Host(node_root))
    assert not sim.readiness.ready
    assert snapshot(node_root) == before


async def test_second_stage_rewrites_nothing(node_root: Path) -> None:
    state = state_of("h100")
    sim = await stage(node_root, state)
    staged = node_root / layout.STATE_ROOT.lstrip("/")  # not the manifests' directory
    mtimes = {p: p.lstat().st_mtime_ns for p in staged.rglob("*")}
    assert len(mtimes) > 500
    report = Host(node_root).converge("ib", sim.plan(state).artifacts)
    assert not report.changed
    await sim.stage(Host(node_root), state)
    assert {p: p.lstat().st_mtime_ns for p in staged.rglob("*")} == mtimes
    await sim.discard(Host(node_root))
    assert snapshot(node_root) == {}


async def test_fewer_gpus_remove_their_hcas(node_root: Path, tmp_path: Path) -> None:
    full, half = state_of("h100"), state_of("h100", gpus=4, tmp=tmp_path)
    assert half.infiniband is not None
    assert half.infiniband.hca_count == 4
    sim = await stage(node_root, full)
    await sim.stage(Host(node_root), half)
    assert ib_files(node_root) == expected_tree(half)
    for gone in ("sys/class/infiniband/mlx5_4", "sys/class/infiniband_mad/umad7",
                 "sys/class/infiniband_verbs/uverbs5", "dev/infiniband/issm4"):
        assert not (node_root / IB / gone).exists(), gone
    await sim.stage(Host(node_root), full)
    assert ib_files(node_root) == expected_tree(full)
    await sim.discard(Host(node_root))
    assert snapshot(node_root) == {}


async def test_discard_restores_a_foreign_file_byte_for_byte(node_root: Path) -> None:
    """A file already standing where a wrapper goes is backed up and put back."""
    foreign = node_root / BIN / "ibstat"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"#!/bin/sh\necho site-local ibstat\n")
    foreign.chmod(0o700)
    before = snapshot(node_root)
    sim = await stage(node_root, state_of("h100"))
    assert foreign.read_text().startswith("#!/bin/sh\n# ibstat against the mock")
    await sim.discard(Host(node_root))
    assert snapshot(node_root) == before


async def test_mode_off_and_profiles_without_ib(node_root: Path) -> None:
    # auto on a profile without HCAs: nothing at all, and ready.
    sim = await stage(node_root, state_of("a100"))
    assert sim.readiness.ready
    assert "no enabled infiniband block" in sim.readiness.reason
    assert snapshot(node_root) == {}
    # forced sysfs on it: empty classes (readers find no HCA, not "no kernel support").
    await sim.discard(Host(node_root))
    sim = await stage(node_root, state_of("a100"), mode="sysfs")
    assert ib_files(node_root) == {
        "sys/class/infiniband_mad/abi_version": ("file", 0o444, b"5\n"),
        "sys/class/infiniband_verbs/abi_version": ("file", 0o444, b"6\n"),
    }
    assert (node_root / IB / "sys/class/infiniband").is_dir()
    assert "empty InfiniBand classes" in sim.readiness.reason
    await sim.discard(Host(node_root))
    # off on h100 removes a staged tree (switching off at run time).
    sim = await stage(node_root, state_of("h100"))
    off = IbSimulator(IbSettings(mode="off", tools_dir=NO_TOOLS))
    await off.stage(Host(node_root), state_of("h100"))
    assert off.readiness.ready
    assert "--ib-mode off" in off.readiness.reason
    assert snapshot(node_root) == {}


async def test_bad_profile_values_fail_before_anything_is_written(
    node_root: Path, tmp_path: Path
) -> None:
    doc = yaml.safe_load(read_profile_text("h100")[1])
    doc["infiniband"].update(
        hca_type="ConnectX-7", port_state="UP", phys_state="Linked",
        link_layer="Ethernet", node_desc_template="{node_name} {port}",
    )
    path = tmp_path / "bad-ib.yaml"
    path.write_text(yaml.safe_dump(doc))
    state = compile_profile(path, node_name="node-a")
    sim = IbSimulator(IbSettings(tools_dir=NO_TOOLS))
    with pytest.raises(SpecError) as info:
        await sim.stage(Host(node_root), state)
    text = str(info.value)
    for field in ("infiniband.hca_type", "infiniband.port_state", "infiniband.phys_state",
                  "infiniband.link_layer", "infiniband.node_desc_template"):
        assert f"{path}: {field}" in text, (field, text)
    assert "expected one of NOP, DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER" in text
    assert not sim.readiness.ready
    assert "stage failed" in sim.readiness.reason
    assert snapshot(node_root) == {}


def test_hca_values_follow_the_profile_and_node() -> None:
    state = state_of("gb300")
    hcas = plan_hcas(state)
    assert [h.name for h in hcas] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert hcas[0].pci_device == 0x1023  # MT4131: ConnectX-8
    assert hcas[0].rate_text == "800 Gb/sec (4X XDR)"
    other = plan_hcas(compile_profile("gb300", node_name="node-b"))
    assert {h.guid for h in hcas}.isdisjoint({h.guid for h in other})
    assert [h.lid for h in plan_hcas(state)] == [h.lid for h in hcas]  # stable
    # Alone in its fabric (no topology document), each node's HCAs follow its
    # leaf switch (LID 2): node-b's equal node-a's, as two separate subnets do.
    assert [h.lid for h in hcas] == [3, 4, 5, 6]
    assert [h.lid for h in other] == [3, 4, 5, 6]


def test_plugin_registration_and_flag() -> None:
    assert "mokka.simulators.ib" in registry.PLUGIN_MODULES
    assert "ib" in [p.name for p in registry.load_plugins()]
    from mokka.cli import build_parser

    args = build_parser().parse_args(["daemon", "--ib-mode", "full"])
    sim = PLUGIN.build(args)
    assert isinstance(sim, Simulator)
    assert sim.settings.mode == "full"
    default = PLUGIN.build(build_parser().parse_args(["daemon"])).settings
    assert default.mode == "auto"
    assert default.tools_dir == DEFAULT_TOOLS_DIR == Path("/usr/local/lib/mokka/ib")
    other = PLUGIN.build(build_parser().parse_args(["daemon", "--ib-tools-dir", "/opt/ib"]))
    assert other.settings.tools_dir == Path("/opt/ib")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["daemon", "--ib-mode", "on"])
    with pytest.raises(SpecError, match=r"--ib-mode: 'on', expected one of auto, off"):
        IbSettings(mode="on")


# --------------------------------------------------------------------------
# Real clients
# --------------------------------------------------------------------------


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "MOKKA_"))}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={**base, **(env or {})}, check=False)


def parse_ibstat(text: str) -> dict[str, dict[str, str]]:
    """``ibstat`` output → CA name → {field: value} (port fields included)."""
    cas: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^CA '(.+)'$", line)
        if match:
            current = cas.setdefault(match.group(1), {})
        elif ":" in line and line.strip() != "Port 1:":
            key, _, value = line.strip().partition(":")
            current[key] = value.strip()
    return cas


async def test_real_ibstat_and_ibstatus_read_the_tree(node_root: Path, native_env: Path) -> None:
    ibstat, ibstatus = require_tool("ibstat"), require_tool("ibstatus")
    host_view = run([ibstat, "-l"])
    before = snapshot(node_root)
    state = state_of("h100")
    sim = await stage(node_root, state)
    ib = state.infiniband
    assert ib is not None
    env = {"LD_PRELOAD": str(native_env / "libmockfs.so"),
           "MOKKA_MOCKFS_ROOT": str(node_root / IB)}
    listed = run([ibstat, "-l"], env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [f"mlx5_{i}" for i in range(8)]
    full = run([ibstat], env)
    assert full.returncode == 0, full.stderr
    cas = parse_ibstat(full.stdout)
    assert sorted(cas) == [f"mlx5_{i}" for i in range(8)]
    for i, guid in enumerate(ib.node_guids):
        ca = cas[f"mlx5_{i}"]
        lid = int((node_root / IB / f"sys/class/infiniband/mlx5_{i}/ports/1/lid").read_text(), 16)
        assert ca == {
            "CA type": "MT4129", "Number of ports": "1", "Firmware version": ib.fw_version,
            "Hardware version": "0x0", "Node GUID": guid, "System image GUID": guid,
            "State": "Active", "Physical state": "LinkUp", "Rate": "400",
            "Base lid": str(lid), "LMC": "0", "SM lid": "1",
            "Capability mask": "0xa751e848", "Port GUID": guid, "Link layer": "InfiniBand",
        }, f"mlx5_{i}"
    status = run([ibstatus, "mlx5_2"], env)
    assert status.returncode == 0, status.stderr
    gid = "fe80:0000:0000:0000:" + groups(int(ib.node_guids[2], 16), 4)
    assert f"default gid:\t {gid}" in status.stdout
    assert "rate:\t\t 400 Gb/sec (4X NDR)" in status.stdout
    assert "state:\t\t 4: ACTIVE" in status.stdout
    every = run([ibstatus], env)
    assert every.stdout.count("Infiniband device 'mlx5_") == 8
    # Without the preload the machine's own view is what it was.
    assert run([ibstat, "-l"]).stdout == host_view.stdout
    assert "mlx5_0" not in host_view.stdout
    await sim.discard(Host(node_root))
    assert snapshot(node_root) == before


async def test_staged_wrappers_run_the_real_tools(node_root: Path, native_env: Path) -> None:
    """The driver tree's ibstat/ibstatus find the shim (pcibus) and the tree by themselves."""
    require_tool("ibstat")
    before = snapshot(node_root)
    host = Host(node_root)
    state = state_of("gb200")
    pcibus = PcibusSimulator()
    await pcibus.stage(host, state)
    sim = await stage(node_root, state)
    bin_dir = node_root / BIN
    result = run([str(bin_dir / "ibstat"), "-l"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    card = run([str(bin_dir / "ibstat"), "mlx5_3"])
    assert "Firmware version: 28.44.1036" in card.stdout
    status = run([str(bin_dir / "ibstatus"), "mlx5_0:1"])
    assert "Infiniband device 'mlx5_0' port 1 status:" in status.stdout
    # The wrapper keeps the machine's PCI view: only the IB prefixes are redirected.
    assert f"MOKKA_MOCKFS_PREFIXES={PREFIXES}\n" in (bin_dir / "ibstat").read_text()
    # Without the image's tools the wrappers run the machine's, and say so.
    assert "\nreal=/usr/sbin/ibstat\n" in (bin_dir / "ibstat").read_text()
    assert sim.readiness.reason.endswith(
        f"wrappers run the machine's own /usr/sbin/ibstat, /usr/sbin/ibstatus (no {NO_TOOLS})")
    assert not (node_root / STAGED.lstrip("/")).exists()
    await pcibus.discard(host)
    missing = run([str(bin_dir / "ibstat")])
    assert missing.returncode == 1
    assert "libmockfs.so is missing" in missing.stderr
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_wrappers_work_under_a_root_whose_path_has_spaces(
    tmp_path: Path, native_env: Path
) -> None:
    """ld.so splits ``LD_PRELOAD`` at spaces: a shim named by its full path
    under such a root would not load, and the real tool would read the
    machine's own (empty) IB classes instead of the mock tree."""
    require_tool("ibstat")
    require_tool("ibv_devices")
    root = tmp_path / "a node root ☃" / "node"
    root.mkdir(parents=True)
    before = snapshot(root)
    host = Host(root)
    state = state_of("gb200")
    sim = await stage_with_pcibus(host, state, mode="full")
    bin_dir = root / BIN
    listed = run([str(bin_dir / "ibstat"), "-l"])
    assert listed.returncode == 0, listed.stderr
    assert "cannot be preloaded" not in listed.stderr
    assert listed.stdout.split() == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    status = run([str(bin_dir / "ibstatus"), "mlx5_2"])
    assert "Infiniband device 'mlx5_2' port 1 status:" in status.stdout, status.stderr
    devices = run([str(bin_dir / "ibv_devices")])
    assert devices.returncode == 0, devices.stderr
    assert re.findall(r"mlx5_\d", devices.stdout) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    await discard_with_pcibus(host, sim)
    assert snapshot(root) == before


def test_wrapper_failures_are_clear_and_the_script_is_clean(tmp_path: Path) -> None:
    shellcheck = require_tool("shellcheck")
    script = tmp_path / "usr/bin/ibtool"
    script.parent.mkdir(parents=True)
    script.write_text(wrapper_script(Tool("ibtool", "/nonexistent/ibtool", "pkg-x", ("a.so",))))
    script.chmod(0o755)
    absent = run([str(script)])
    assert absent.returncode == 127
    assert "/nonexistent/ibtool is not installed; install the Debian package pkg-x" in (
        absent.stderr)
    real = tmp_path / "real.sh"
    real.write_text(wrapper_script(IBSTAT))
    no_tree = run(["sh", str(real)], {"MOKKA_IB_ROOT": str(tmp_path / "nowhere")})
    assert no_tree.returncode == 1
    assert "no mock InfiniBand tree at" in no_tree.stderr
    lint = run([shellcheck, "-s", "sh", str(real)])
    assert lint.returncode == 0, lint.stdout
    staged = tmp_path / "staged.sh"
    staged.write_text(wrapper_script(IBSTAT, staged=True))
    lint = run([shellcheck, "-s", "sh", str(staged)])
    assert lint.returncode == 0, lint.stdout
    # A staged copy that went missing is named, with a shell's "not found" code.
    gone = tmp_path / "driver/usr/bin/ibstat"
    gone.parent.mkdir(parents=True)
    gone.write_text(wrapper_script(IBSTAT, staged=True))
    gone.chmod(0o755)
    missing = run([str(gone)])
    assert missing.returncode == 127
    assert "/local/lib/mokka-ib/bin/ibstat is missing (the mokka daemon stages it" in (
        missing.stderr)


# --------------------------------------------------------------------------
# full mode: the verbs shim under the real ibv_devinfo
# --------------------------------------------------------------------------


def parse_devinfo(text: str) -> dict[str, dict[str, str]]:
    devices: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "hca_id":
            current = devices.setdefault(value.strip(), {})
        elif key:
            current[key] = value.strip()
    return devices


async def test_full_mode_ibv_devinfo(node_root: Path, native_env: Path) -> None:
    devinfo = require_tool("ibv_devinfo")
    devices_tool = require_tool("ibv_devices")
    host_view = run([devinfo])
    before = snapshot(node_root)
    host = Host(node_root)
    state = state_of("h100")
    sim = await stage_with_pcibus(host, state, mode="full")
    assert sim.readiness.reason.startswith("full: 8 HCA(s)")
    ib = state.infiniband
    assert ib is not None
    wrapper = str(node_root / BIN / "ibv_devinfo")
    result = run([wrapper])
    assert result.returncode == 0, result.stderr
    devices = parse_devinfo(result.stdout)
    assert sorted(devices) == [f"mlx5_{i}" for i in range(8)]
    for i, guid in enumerate(ib.node_guids):
        lid = int((node_root / IB / f"sys/class/infiniband/mlx5_{i}/ports/1/lid").read_text(), 16)
        dev = devices[f"mlx5_{i}"]
        assert dev["transport"] == "InfiniBand (0)"
        assert dev["fw_ver"] == ib.fw_version
        assert dev["node_guid"] == groups(int(guid, 16), 4)
        assert dev["vendor_id"] == "0x02c9"
        assert dev["vendor_part_id"] == "4129"
        assert dev["board_id"] == ib.board_id  # read by libibverbs itself, through libmockfs
        assert dev["phys_port_cnt"] == "1"
        assert dev["state"] == "PORT_ACTIVE (4)"
        assert dev["port_lid"] == str(lid)
        assert dev["sm_lid"] == "1"
        assert dev["link_layer"] == "InfiniBand"
    listed = run([wrapper, "-l"])
    assert listed.stdout.split()[:3] == ["8", "HCAs", "found:"]
    verbose = run([wrapper, "-v", "-d", "mlx5_5"])
    gid = "fe80:0000:0000:0000:" + groups(int(ib.node_guids[5], 16), 4)
    assert re.search(rf"GID\[\s*0\]:\s+{gid}", verbose.stdout), verbose.stdout
    assert "active_width:\t\t4X (2)" in verbose.stdout
    assert "active_speed:\t\t100.0 Gbps (128)" in verbose.stdout  # NDR: 100 Gb/s per lane
    shims = {"LD_PRELOAD": f"{native_env / 'libibshim.so'} {native_env / 'libmockfs.so'}",
             "MOKKA_MOCKFS_ROOT": str(node_root / IB)}
    guids = run([devices_tool], shims)
    assert re.findall(r"(mlx5_\d)\s+([0-9a-f]{16})", guids.stdout) == [
        (f"mlx5_{i}", g[2:]) for i, g in enumerate(ib.node_guids)
    ]
    # The ibv_devices wrapper gives the same list.
    wrapped = run([str(node_root / BIN / "ibv_devices")])
    assert wrapped.returncode == 0, wrapped.stderr
    assert wrapped.stdout == guids.stdout
    # Inert without a root: exactly the machine's own answer.
    inert = run([devinfo], {"LD_PRELOAD": str(native_env / "libibshim.so")})
    assert (inert.returncode, inert.stdout, inert.stderr) == (
        host_view.returncode, host_view.stdout, host_view.stderr)
    await discard_with_pcibus(host, sim)
    assert snapshot(node_root) == before


async def test_full_mode_without_the_shim_fails_before_writing(
    node_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "no-native"
    empty.mkdir()
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(empty))
    sim = IbSimulator(IbSettings(mode="full", tools_dir=NO_TOOLS))
    with pytest.raises(NativeArtifactMissing, match=r"libibshim\.so"):
        await sim.stage(Host(node_root), state_of("h100"))
    assert not sim.readiness.ready
    assert snapshot(node_root) == {}


def test_shim_abi_matches_rdma_core_header(tmp_path: Path) -> None:
    """Every offset, size and constant the shim shares with applications equals
    rdma-core's own ``<infiniband/verbs.h>`` (Debian libibverbs-dev)."""
    header = Path("/usr/include/infiniband/verbs.h")
    if not header.is_file():
        pytest.fail(f"{header} is missing; run ./scripts/install-system-deps (libibverbs-dev)")
    fields = {
        "struct ibv_device": "_ops node_type transport_type name dev_name dev_path ibdev_path",
        "struct ibv_context": "device ops cmd_fd async_fd num_comp_vectors mutex abi_compat",
        "struct ibv_device_attr": "fw_ver node_guid sys_image_guid max_mr_size page_size_cap "
        "vendor_id vendor_part_id hw_ver max_qp max_qp_wr device_cap_flags max_sge max_sge_rd "
        "max_cq max_cqe max_mr max_pd max_qp_rd_atom max_ee_rd_atom max_res_rd_atom "
        "max_qp_init_rd_atom max_ee_init_rd_atom atomic_cap max_ee max_rdd max_mw "
        "max_raw_ipv6_qp max_raw_ethy_qp max_mcast_grp max_mcast_qp_attach "
        "max_total_mcast_qp_attach max_ah max_fmr max_map_per_fmr max_srq max_srq_wr "
        "max_srq_sge max_pkeys local_ca_ack_delay phys_port_cnt",
        "struct ibv_port_attr": "state max_mtu active_mtu gid_tbl_len port_cap_flags "
        "max_msg_sz bad_pkey_cntr qkey_viol_cntr pkey_tbl_len lid sm_lid lmc max_vl_num sm_sl "
        "subnet_timeout init_type_reply active_width active_speed phys_state link_layer flags",
        "struct ibv_gid_entry": "gid gid_index port_num gid_type ndev_ifindex",
    }
    lines = [f'P("{t}.{f}", offsetof({t}, {f}));' for t, fs in fields.items() for f in fs.split()]
    lines += [f'P("sizeof {t}", sizeof({t}));' for t in fields if t != "struct ibv_port_attr"]
    lines += ['P("sizeof ops", sizeof(((struct ibv_context *)0)->ops));',
              'P("sizeof gid", sizeof(union ibv_gid));']
    lines += [f'P("{c}", {c});' for c in words(
        "IBV_NODE_CA IBV_TRANSPORT_IB IBV_TRANSPORT_IWARP IBV_ATOMIC_HCA IBV_MTU_4096 "
        "IBV_PORT_ACTIVE IBV_LINK_LAYER_INFINIBAND IBV_LINK_LAYER_ETHERNET IBV_GID_TYPE_IB "
        "IBV_SYSFS_NAME_MAX IBV_SYSFS_PATH_MAX")]
    body = "\n".join(lines)
    outputs = []
    for include in ("<infiniband/verbs.h>", f'"{ROOT}/native/ibshim/ibshim_abi.h"'):
        source = tmp_path / "probe.c"
        source.write_text(
            f"#include <stdio.h>\n#include <stddef.h>\n#include {include}\n"
            '#define P(n, v) printf("%s %zu\\n", n, (size_t)(v))\n'
            f"int main(void) {{\n{body}\nreturn 0;\n}}\n"
        )
        binary = tmp_path / "probe"
        subprocess.run([compiler(), "-o", str(binary), str(source)], check=True)
        outputs.append(subprocess.run([str(binary)], capture_output=True, text=True,
                                      check=True).stdout)
    assert outputs[0].count("\n") == len(lines)
    assert outputs[1] == outputs[0]
    # The shim fills only the compat prefix of the port attributes: it ends
    # where rdma-core's newer fields begin.
    sizes = dict(line.rsplit(" ", 1) for line in outputs[0].splitlines())
    assert int(sizes["struct ibv_port_attr.flags"]) + 1 <= 48


def test_shim_exports_only_the_interposed_calls(ib_native: Path) -> None:
    nm = require_tool("nm")
    out = run([nm, "-D", "--defined-only", str(ib_native / "libibshim.so")]).stdout
    exported = sorted(line.split()[-1] for line in out.splitlines() if " T " in line)
    assert exported == sorted(words(
        "_ibv_query_gid_ex _ibv_query_gid_table ibv_alloc_pd ibv_close_device "
        "ibv_create_comp_channel ibv_create_cq ibv_free_device_list ibv_get_async_event "
        "ibv_get_device_guid ibv_get_device_index ibv_get_device_list ibv_get_device_name "
        "ibv_get_pkey_index ibv_import_device ibv_open_device ibv_query_device ibv_query_gid "
        "ibv_query_gid_type ibv_query_pkey ibv_query_port"
    ))
    assert stat.S_IMODE(os.stat(ib_native / "libibshim.so").st_mode) & 0o111


async def test_shim_under_valgrind(node_root: Path, native_env: Path) -> None:
    """The real ibv_devinfo -v through the shims: no memory error, nothing leaked."""
    valgrind, devinfo = require_tool("valgrind"), require_tool("ibv_devinfo")
    sim = await stage(node_root, state_of("gb200"), mode="full")
    env = {"LD_PRELOAD": f"{native_env / 'libibshim.so'} {native_env / 'libmockfs.so'}",
           "MOKKA_MOCKFS_ROOT": str(node_root / IB)}
    result = run([valgrind, "--leak-check=full", "--errors-for-leak-kinds=definite",
                  "--error-exitcode=9", devinfo, "-v"], env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("hca_id:") == 4
    assert "ERROR SUMMARY: 0 errors" in result.stderr
    await sim.discard(Host(node_root))
    assert snapshot(node_root) == {}
