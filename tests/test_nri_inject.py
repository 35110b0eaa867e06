"""The NRI plugin's policy: which GPUs a container sees, and what it then gets.

Pure: no containerd.  The view is the h100 profile's (8 GPUs, NVSwitches,
two NUMA nodes) as ``view.build_view`` makes it from a node root holding the
overlays other simulators stage.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import attrs
import pytest

from mokka import layout
from mokka.noderoot.host import Host
from mokka.simulators.gpudriver.nvml_socket import SOCKET
from mokka.simulators.nri import inject
from mokka.simulators.nri import view as view_module
from mokka.simulators.nri.inject import (
    ANNOTATION,
    NodeDevices,
    NodeView,
    SysDevices,
    adjustment,
    visible_gpus,
)
from mokka.simulators.nri.model import Adjustment, Container, Device, Mount
from mokka.simulators.nri.settings import NriSettings
from mokka.simulators.nri.view import build_view, plan_gpus, read_node_devices
from mokka.state.compile import compile_profile
from tests.support import snapshot

pytestmark = pytest.mark.timeout(60)

STATE = compile_profile("h100", node_name="node-a", generation=1)
GPUS, SWITCHES = plan_gpus(STATE)


def make_view(**changes) -> NodeView:
    view = NodeView(
        gpus=GPUS,
        switches=SWITCHES,
        sys_root=layout.SYS_ROOT,
        driver_roots=(layout.DRIVER_ROOT, layout.RUN_DRIVER),
        config_dir=layout.CONFIG_DIR,
        container_config_dir=layout.CONFIG_DIR,
        engine_config=layout.ENGINE_CONFIG,
        nvml_socket=SOCKET,
        nvml_library=f"{layout.DRIVER_LIB}/libnvidia-ml.so.1",
        nvidia_smi=f"{layout.DRIVER_BIN}/nvidia-smi",
        proc_driver=layout.DRIVER_PROC,
        imex_proc_devices=layout.IMEX_PROC_DEVICES,
        topology=(layout.TOPOLOGY_OVERLAY, layout.TOPOLOGY_OVERLAY),
        host_pci_roots=frozenset({"pci0000:00"}),
    )
    return attrs.evolve(view, **changes)


VIEW = make_view()


def box(**fields) -> Container:
    return Container(id="c1", name="ctr", pod_name="pod", pod_namespace="ns", pod_uid="u",
                     **fields)


def seen(container: Container, view: NodeView = VIEW) -> list[int]:
    return [g.index for g in visible_gpus(container, view)]


def destinations(adj: Adjustment) -> set[str]:
    return {m.destination for m in adj.mounts}


# ---- which GPUs ----------------------------------------------------------------


def test_the_profile_has_what_these_tests_assume() -> None:
    assert len(GPUS) == 8
    assert SWITCHES
    assert {g.numa_node for g in GPUS} == {0, 1}
    assert all(g.sysfs_path.startswith("devices/pci") and g.sysfs_path.endswith(g.bdf)
               for g in GPUS)


@pytest.mark.parametrize(("value", "expected"), [
    ("nvidia.com/gpu=1", [1]),
    ("mokka.nvidia.com/gpu=2,mokka.nvidia.com/gpu=5", [2, 5]),
    (f"k8s.device-plugin.nvidia.com/gpu={GPUS[3].uuid}", [3]),
    (f"nvidia.com/gpu={GPUS[4].uuid.upper()}", [4]),
    ("nvidia.com/gpu=all", list(range(8))),
    ("nvidia.com/gpu=9", []),          # no such GPU
    ("vendor.com/net=1", []),          # another class
    ("gpu=1", []),                     # not a qualified name
    ("nvidia.com/gpu=", []),
])
def test_cdi_annotations_name_gpus(value: str, expected: list[int]) -> None:
    assert seen(box(annotations={"cdi.k8s.io/nvidia-device-plugin_x": value})) == expected


def test_cdi_annotations_on_the_pod_count_and_other_keys_do_not() -> None:
    assert seen(box(pod_annotations={"cdi.k8s.io/req": "nvidia.com/gpu=6"})) == [6]
    assert seen(box(annotations={"other.io/x": "nvidia.com/gpu=6"})) == []


@pytest.mark.parametrize(("value", "expected"), [
    ("0", [0]),
    ("1,3", [1, 3]),
    (f" {GPUS[7].uuid} , 2", [2, 7]),
    ("all", list(range(8))),
    ("void", []), ("none", []), ("", []), ("NONE", []),
    ("GPU-nonexistent", []),
])
def test_nvidia_visible_devices(value: str, expected: list[int]) -> None:
    assert seen(box(env=("PATH=/bin", f"NVIDIA_VISIBLE_DEVICES={value}"))) == expected


def test_the_last_nvidia_visible_devices_wins() -> None:
    env = ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void")
    assert seen(box(env=env)) == []


def test_device_nodes_name_gpus_by_minor() -> None:
    gpu = GPUS[5]
    devices = (
        Device(f"/dev/nvidia{gpu.minor}", "c", 195, gpu.minor),
        Device("/dev/nvidiactl", "c", 195, 255),
        Device("/dev/nvidia-modeset", "c", 195, 254),
        Device("/dev/other", "c", 10, GPUS[1].minor),   # another major
        Device("/dev/blk", "b", 195, GPUS[2].minor),    # a block device
    )
    assert seen(box(devices=devices)) == [5]
    assert seen(box(devices=devices[1:])) == []


@pytest.mark.parametrize("source", [
    "/", "/run/nvidia/driver", "/run/nvidia", layout.DRIVER_ROOT, layout.STATE_ROOT,
    "/run/nvidia/driver/",
])
def test_a_mount_of_the_driver_root_or_the_host_root_sees_every_gpu(source: str) -> None:
    mount = Mount(destination="/host", source=source, type="bind", options=("rbind", "ro"))
    assert seen(box(mounts=(mount,))) == list(range(8))


@pytest.mark.parametrize("mount", [
    Mount("/data", "/srv/data", "bind"),
    Mount("/run/nvidia/driver", "tmpfs", "tmpfs", ()),       # not a bind
    Mount("/x", "/run/nvidia/driverX", "bind"),            # a sibling, not the root
    Mount("/x", f"{layout.DRIVER_ROOT}/usr/lib64", "bind"),  # inside it: no GPU by itself
])
def test_other_mounts_see_no_gpu(mount: Mount) -> None:
    assert seen(box(mounts=(mount,))) == []


def test_the_ways_of_asking_add_up() -> None:
    container = box(annotations={"cdi.k8s.io/a": "nvidia.com/gpu=0"},
                    env=("NVIDIA_VISIBLE_DEVICES=2",),
                    devices=(Device("/dev/nvidia", "c", 195, GPUS[4].minor),))
    assert seen(container) == [0, 2, 4]


# ---- what they get ---------------------------------------------------------------


def test_a_container_with_no_gpu_gets_nothing() -> None:
    adj = adjustment(box(env=("PATH=/bin",)), VIEW)
    assert adj == Adjustment()
    assert not adj


def test_one_gpu_gets_exactly_its_sysfs_entry_at_both_paths() -> None:
    gpu = GPUS[1]
    adj = adjustment(box(annotations={"cdi.k8s.io/a": "nvidia.com/gpu=1"}), VIEW)
    by_dest = {m.destination: m for m in adj.mounts}
    bus = by_dest[f"/sys/bus/pci/devices/{gpu.bdf}"]
    assert bus.source == f"{layout.SYS_ROOT}/{gpu.sysfs_path}"
    assert "ro" in bus.options
    # The bus directory is a fresh tmpfs, mounted before the GPU's entry.
    dests = [m.destination for m in adj.mounts]
    assert by_dest["/sys/bus/pci/devices"].type == "tmpfs"
    assert dests.index("/sys/bus/pci/devices") < dests.index(bus.destination)
    # No other GPU nor switch is on the bus.
    others = {g.bdf for g in GPUS if g is not gpu} | {p.rpartition("/")[2] for p in SWITCHES}
    assert not any(d.rpartition("/")[2] in others for d in dests)
    root = gpu.sysfs_path.split("/")[1]
    if root in VIEW.host_pci_roots:
        assert by_dest[f"/sys/{gpu.sysfs_path}"].source == bus.source
        assert by_dest[f"/sys/devices/{root}"].type == "tmpfs"


def test_the_real_path_is_bound_under_a_root_the_node_has_and_only_there() -> None:
    roots = {g.sysfs_path.split("/")[1] for g in GPUS}
    container = box(env=("NVIDIA_VISIBLE_DEVICES=all",))
    none = destinations(adjustment(container, make_view(host_pci_roots=frozenset())))
    assert not any(d.startswith("/sys/devices/") for d in none)
    every = destinations(adjustment(container, make_view(host_pci_roots=frozenset(roots))))
    for gpu in GPUS:
        assert f"/sys/{gpu.sysfs_path}" in every
        assert f"/sys/bus/pci/devices/{gpu.bdf}" in every
    for path in SWITCHES:  # switches come with all GPUs
        assert f"/sys/bus/pci/devices/{path.rpartition('/')[2]}" in every


def test_the_engine_config_its_socket_and_the_topology_come_along() -> None:
    adj = adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=0",)), VIEW)
    by_dest = {m.destination: m.source for m in adj.mounts}
    assert by_dest[layout.CONFIG_DIR] == layout.CONFIG_DIR
    assert by_dest["/run/nvidia-persistenced/socket"] == SOCKET
    assert by_dest[layout.TOPOLOGY_OVERLAY] == layout.TOPOLOGY_OVERLAY
    assert f"MOCK_NVML_CONFIG={layout.ENGINE_CONFIG}" in adj.env


def test_a_container_setting_the_config_itself_keeps_it() -> None:
    adj = adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=0", "MOCK_NVML_CONFIG=/mine")), VIEW)
    assert adj
    assert adj.env == ()


@pytest.mark.parametrize(("lib", "beside"), [
    ("/usr/lib64/libnvidia-ml.so.1", "/config"),
    ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.104.05", "/usr/config"),
])
def test_the_config_goes_beside_a_library_another_spec_mounted(lib: str, beside: str) -> None:
    library = Mount(lib, "/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1", "bind")
    adj = adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=0",), mounts=(library,)), VIEW)
    by_dest = {m.destination: m.source for m in adj.mounts}
    assert by_dest[beside] == layout.CONFIG_DIR


def test_nothing_is_mounted_where_the_container_already_has_a_mount() -> None:
    ours = Mount(layout.CONFIG_DIR, "/elsewhere", "bind")
    adj = adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=0",), mounts=(ours,)), VIEW)
    assert [m for m in adj.mounts if m.destination == layout.CONFIG_DIR] == []
    assert len(destinations(adj)) == len(adj.mounts)  # and no destination twice


def test_proc_files_only_when_asked_and_only_those_the_node_has() -> None:
    container = box(env=("NVIDIA_VISIBLE_DEVICES=0",))
    assert not {"/proc/driver/nvidia", "/proc/devices"} & destinations(adjustment(container, VIEW))
    on = destinations(adjustment(container, make_view(proc_mounts=True)))
    assert {"/proc/driver/nvidia", "/proc/devices"} <= on
    no_imex = make_view(proc_mounts=True, imex_proc_devices=None, topology=None)
    dests = destinations(adjustment(container, no_imex))
    assert "/proc/devices" not in dests
    assert layout.TOPOLOGY_OVERLAY not in dests


# ---- ambient mode ------------------------------------------------------------------


def test_ambient_gives_every_container_nvidia_smi_and_nvml_but_no_gpu_sysfs() -> None:
    adj = adjustment(box(), make_view(ambient=True))
    by_dest = {m.destination: m.source for m in adj.mounts}
    assert by_dest["/usr/bin/nvidia-smi"] == f"{layout.DRIVER_BIN}/nvidia-smi"
    assert by_dest["/usr/lib64/libnvidia-ml.so.1"] == f"{layout.DRIVER_LIB}/libnvidia-ml.so.1"
    assert layout.CONFIG_DIR in by_dest
    assert "/run/nvidia-persistenced/socket" in by_dest
    assert not any(d.startswith("/sys/") for d in by_dest)


def test_the_annotation_opts_in_and_out() -> None:
    on, off = {ANNOTATION: "on"}, {ANNOTATION: " Off "}
    assert adjustment(box(pod_annotations=on), VIEW)                        # opt in
    assert not adjustment(box(pod_annotations=off), make_view(ambient=True))  # opt out
    gpu = {"env": ("NVIDIA_VISIBLE_DEVICES=all",)}
    assert not adjustment(box(pod_annotations=off, **gpu), VIEW)            # out of all of it
    # The container's own annotation wins over the pod's; junk values are ignored.
    assert adjustment(box(pod_annotations=off, annotations=on), VIEW)
    assert not adjustment(box(pod_annotations={ANNOTATION: "yes"}), VIEW)


def test_ambient_without_nvidia_smi_staged_mounts_what_there_is() -> None:
    adj = adjustment(box(), make_view(ambient=True, nvidia_smi=None, nvml_socket=None))
    dests = destinations(adj)
    assert "/usr/bin/nvidia-smi" not in dests
    assert "/run/nvidia-persistenced/socket" not in dests
    assert "/usr/lib64/libnvidia-ml.so.1" in dests


# ---- hostile input -----------------------------------------------------------------


def test_hostile_containers_never_raise_and_stay_bounded() -> None:
    huge = "x" * 10_000_000
    cases = [
        box(env=(*(f"V{i}=1" for i in range(200_000)), "NVIDIA_VISIBLE_DEVICES=0")),
        box(env=("NVIDIA_VISIBLE_DEVICES=" + ",".join(["0"] * 1_000_000),)),
        box(env=("NVIDIA_VISIBLE_DEVICES=" + huge,)),
        box(annotations={f"cdi.k8s.io/{i}": "nvidia.com/gpu=0" for i in range(100_000)}),
        box(annotations={"cdi.k8s.io/a": ",".join(["=", "/gpu=", "a/gpu==", "/"] * 500_000)}),
        box(annotations={"cdi.k8s.io/a": huge}),
        box(annotations={"cdi.k8s.io/a": None, 3: "x"}),  # type: ignore[dict-item]
        box(pod_annotations=None),  # type: ignore[arg-type]
        box(env=(None, b"NVIDIA_VISIBLE_DEVICES=0", "=")),  # type: ignore[arg-type]
        box(devices=(Device("/dev/nvidia0", "c", 195, -1),) * 100_000),
        box(mounts=(Mount("\0", "\0" * 100_000, "bind"), Mount("", "", ""),
                    Mount("/x", "relative", "bind"))),
        box(mounts=tuple(Mount(f"/m{i}", f"/s{i}", "bind") for i in range(200_000))),
    ]
    for container in cases:
        start = time.monotonic()
        result = adjustment(container, VIEW)
        assert isinstance(result, Adjustment)
        assert time.monotonic() - start < 2.0, container.annotations.keys() if isinstance(
            container.annotations, dict) else container


def test_a_policy_bug_answers_nothing_rather_than_raise(monkeypatch) -> None:
    def broken(container, node):
        raise RuntimeError("bug")

    monkeypatch.setattr(inject, "_adjustment", broken)
    assert adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=all",)), VIEW) == Adjustment()


# ---- the view from a node root ---------------------------------------------------


def test_the_view_names_only_the_overlays_the_node_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    host = Host(root)
    sysfs = tmp_path / "sys"
    (sysfs / "devices" / "pci0000:00").mkdir(parents=True)
    (sysfs / "devices" / "system").mkdir()
    settings = NriSettings(mount_root="/node", sysfs=sysfs)

    bare = build_view(STATE, host, settings)
    assert bare.gpus == GPUS
    assert (bare.nvml_socket, bare.nvidia_smi, bare.proc_driver, bare.imex_proc_devices,
            bare.topology, bare.nvml_library) == (None,) * 6
    assert bare.host_pci_roots == {"pci0000:00"}
    assert bare.sys_root == f"/node{layout.SYS_ROOT}"
    assert bare.driver_roots == (f"/node{layout.DRIVER_ROOT}", f"/node{layout.RUN_DRIVER}")
    assert bare.container_config_dir == layout.CONFIG_DIR  # never prefixed

    for path in (layout.TOPOLOGY_OVERLAY, layout.IMEX_PROC_DEVICES,
                 f"{layout.DRIVER_BIN}/nvidia-smi", f"{layout.DRIVER_LIB}/libnvidia-ml.so.1"):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text("x")
    (root / layout.DRIVER_PROC.lstrip("/")).mkdir(parents=True)
    sock_path = root / SOCKET.lstrip("/")
    sock_path.parent.mkdir(parents=True)
    monkeypatch.chdir(sock_path.parent)  # a socket path has at most 107 bytes
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(sock_path.name)
        full = build_view(STATE, host, settings)
    assert full.nvml_socket == f"/node{SOCKET}"
    assert full.nvidia_smi == f"/node{layout.DRIVER_BIN}/nvidia-smi"
    assert full.proc_driver == f"/node{layout.DRIVER_PROC}"
    assert full.imex_proc_devices == f"/node{layout.IMEX_PROC_DEVICES}"
    assert full.topology == (f"/node{layout.TOPOLOGY_OVERLAY}", layout.TOPOLOGY_OVERLAY)


def test_injected_sources_are_what_pcibus_stages(tmp_path: Path) -> None:
    """Every sysfs source the policy names is a directory of the staged tree with a class."""
    import trio

    from mokka.cli import build_parser
    from mokka.simulators.pcibus import PLUGIN as PCIBUS

    root = tmp_path / "root"
    root.mkdir()
    host = Host(root)
    pcibus = PCIBUS.build(build_parser().parse_args(["daemon"]))
    before = snapshot(root)

    async def stage() -> None:
        with trio.fail_after(30):
            await pcibus.stage(host, STATE)

    trio.run(stage)
    try:
        adj = adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=all",)), VIEW)
        sys_sources = [m.source for m in adj.mounts if m.destination.startswith("/sys/")
                       and m.type == "bind"]
        assert len(sys_sources) >= len(GPUS)
        for source in sys_sources:
            staged = root / source.lstrip("/")
            assert staged.is_dir(), source
            assert not staged.is_symlink(), source
            assert (staged / "class").read_text().strip() in ("0x030200", "0x068000")
        for gpu in GPUS:
            numa = root / layout.SYS_ROOT.lstrip("/") / gpu.sysfs_path / "numa_node"
            assert int(numa.read_text()) == gpu.numa_node
    finally:
        trio.run(pcibus.discard, host)
    left = {path for path in set(snapshot(root)) - set(before)
            if not path.startswith(layout.MOKKA_STATE_DIR.lstrip("/"))}
    assert left == set()  # discard took the tree away again


# ---- DMI ---------------------------------------------------------------------------

STAGED_DMI = f"{layout.SYS_ROOT}/devices/virtual/dmi/id"


def test_dmi_goes_to_every_container_the_plugin_adjusts_and_only_those() -> None:
    view = make_view(dmi=STAGED_DMI)
    dmi = [m for m in adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=3",)), view).mounts
           if m.destination == inject.DMI_DIR]
    assert [(m.source, m.type, m.options) for m in dmi] == [
        (STAGED_DMI, "bind", ("rbind", "ro", "nosuid", "nodev"))]
    assert inject.DMI_DIR in destinations(
        adjustment(box(annotations={ANNOTATION: "on"}), view))  # ambient
    assert adjustment(box(), view) == Adjustment()  # no GPU: nothing, DMI neither
    assert inject.DMI_DIR not in destinations(adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=3",)),
                                                          VIEW))


@pytest.mark.parametrize("staged_as", ["devices/virtual/dmi/id", "class/dmi/id"])
def test_the_view_binds_staged_dmi_only_over_a_dmi_the_node_has(
    tmp_path: Path, staged_as: str
) -> None:
    root = tmp_path / "root"
    staged = root / layout.SYS_ROOT.lstrip("/") / staged_as
    staged.mkdir(parents=True)
    (staged / "product_name").write_text("DGX H100\n")
    sysfs = tmp_path / "sys"
    (sysfs / "devices").mkdir(parents=True)
    settings = NriSettings(mount_root="/node", sysfs=sysfs)
    # This node's own sysfs has no DMI: nothing to mount over.
    assert build_view(STATE, Host(root), settings).dmi is None
    (sysfs / "devices/virtual/dmi/id").mkdir(parents=True)
    assert build_view(STATE, Host(root), settings).dmi == f"/node{layout.SYS_ROOT}/{staged_as}"
    # Nothing staged: nothing bound, whatever the node has.
    (staged / "product_name").unlink()
    staged.rmdir()
    assert build_view(STATE, Host(root), settings).dmi is None


# ---- --nri-sys-devices ---------------------------------------------------------------

LINKS = f"{layout.STATE_ROOT}/nri/pci-devices"
#: GPU 1 and the switch port above it (root, port) in the h100 tree.
GPU1 = GPUS[1]
_, GPU1_ROOT, GPU1_PORT, _ = GPU1.sysfs_path.split("/")
NODE = NodeDevices(entries=("pci0000:00", "system", "virtual"))


def sys_view(**changes) -> NodeView:
    roots = frozenset(p.split("/")[1] for p in (*(g.sysfs_path for g in GPUS), *SWITCHES))
    return make_view(sys_devices=SysDevices(node_sysfs="/sys", links=LINKS, roots=roots),
                     **changes)


def layers(adj: Adjustment) -> list[str]:
    (bus,) = [m for m in adj.mounts if m.destination == "/sys/bus/pci/devices"]
    assert (bus.type, bus.source) == ("overlay", "overlay")
    (option,) = [o for o in bus.options if o.startswith("lowerdir=")]
    assert "ro" in bus.options
    return option.removeprefix("lowerdir=").split(":")


def test_sys_devices_gives_a_devices_tree_of_its_own_and_the_bus_as_links() -> None:
    adj = adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=1",)), sys_view(), NODE)
    by_dest = {m.destination: m for m in adj.mounts}
    assert by_dest["/sys/devices"].type == "tmpfs"
    for name in NODE.entries:  # the node's own, from its sysfs
        assert by_dest[f"/sys/devices/{name}"].source == f"/sys/devices/{name}"
        assert "ro" in by_dest[f"/sys/devices/{name}"].options
    assert by_dest[f"/sys/devices/{GPU1_ROOT}"].type == "tmpfs"
    chain = by_dest[f"/sys/devices/{GPU1_ROOT}/{GPU1_PORT}"]
    assert chain.source == f"{layout.SYS_ROOT}/devices/{GPU1_ROOT}/{GPU1_PORT}"
    # Exactly GPU 1's chain: no other root, port or device below /sys/devices.
    staged = {d for d in destinations(adj) if d.startswith("/sys/devices/pci0000:")
              and not d.startswith("/sys/devices/pci0000:00")}
    assert staged == {f"/sys/devices/{GPU1_ROOT}", chain.destination}
    # The bus: GPU 1's link and its port's, each a staged layer, and the empty one.
    assert layers(adj) == [f"{LINKS}/{GPU1_PORT.replace(':', '-')}",
                           f"{LINKS}/{GPU1.bdf.replace(':', '-')}", f"{LINKS}/none"]
    assert not any(d.startswith("/sys/bus/pci/devices/") for d in destinations(adj))
    assert len(destinations(adj)) == len(adj.mounts)
    dests = [m.destination for m in adj.mounts]  # parents before what goes in them
    assert dests.index("/sys/devices") < dests.index(f"/sys/devices/{GPU1_ROOT}") < dests.index(
        chain.destination)


def test_sys_devices_keeps_the_nodes_entries_of_a_root_the_staged_tree_shares() -> None:
    node = NodeDevices(entries=(GPU1_ROOT, "system"),
                       roots={GPU1_ROOT: (GPU1_PORT, "0000:48:1f.0", "power")})
    adj = adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=1",)), sys_view(), node)
    by_dest = {m.destination: m.source for m in adj.mounts}
    assert f"/sys/devices/{GPU1_ROOT}" not in {m.destination for m in adj.mounts
                                                if m.type == "bind"}  # not the node's whole root
    for name in ("0000:48:1f.0", "power"):
        assert by_dest[f"/sys/devices/{GPU1_ROOT}/{name}"] == f"/sys/devices/{GPU1_ROOT}/{name}"
    # The staged port wins over a node entry of the same name.
    assert by_dest[f"/sys/devices/{GPU1_ROOT}/{GPU1_PORT}"].startswith(layout.SYS_ROOT)


def test_sys_devices_with_every_gpu_brings_the_switches_and_all_ports() -> None:
    adj = adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=all",)), sys_view(), NODE)
    functions = [g.sysfs_path for g in GPUS] + list(SWITCHES)
    expected = {p.split("/")[3] for p in functions} | {p.split("/")[2] for p in functions}
    assert layers(adj)[:-1] == [f"{LINKS}/{b.replace(':', '-')}" for b in sorted(expected)]
    for path in functions:
        _, root, top, _ = path.split("/")
        assert f"/sys/devices/{root}/{top}" in destinations(adj)


def test_sys_devices_off_or_unread_leaves_the_bus_as_directories() -> None:
    container = box(env=("NVIDIA_VISIBLE_DEVICES=1",))
    default = adjustment(container, VIEW, NODE)  # the option off (the default)
    on_unread = adjustment(container, sys_view())  # no listing of the node: as off
    for adj in (default, on_unread):
        assert "/sys/devices" not in destinations(adj)
        assert f"/sys/bus/pci/devices/{GPU1.bdf}" in destinations(adj)
    assert VIEW.sys_devices is None


def test_sys_devices_leaves_containers_without_gpus_alone() -> None:
    assert adjustment(box(), sys_view(), NODE) == Adjustment()
    ambient = adjustment(box(annotations={ANNOTATION: "on"}), sys_view(), NODE)
    assert ambient
    assert not any(d.startswith("/sys/") for d in destinations(ambient))


@pytest.mark.parametrize("links", ["/n" * 2000 + "/pci-devices", "/node:1/pci-devices",
                                   "/node,x/pci-devices"])
def test_an_overlay_option_too_long_or_unsayable_falls_back_to_directories(links: str) -> None:
    view = sys_view()
    view = attrs.evolve(view, sys_devices=attrs.evolve(view.sys_devices, links=links))
    adj = adjustment(box(env=("NVIDIA_VISIBLE_DEVICES=all",)), view, NODE)
    assert "/sys/devices" not in destinations(adj)
    assert f"/sys/bus/pci/devices/{GPU1.bdf}" in destinations(adj)


def test_the_view_reads_the_nodes_devices_directories_only(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    for name in ("system", "virtual", GPU1_ROOT, f"{GPU1_ROOT}/0000:48:1f.0", f"{GPU1_ROOT}/power"):
        (sysfs / "devices" / name).mkdir(parents=True)
    (sysfs / "devices" / GPU1_ROOT / "uevent").write_text("")
    (sysfs / "devices" / GPU1_ROOT / "firmware_node").symlink_to("../system")
    (sysfs / "devices" / "pci0000:70").symlink_to("system")  # a link is no directory here
    read = read_node_devices(sysfs, {GPU1_ROOT, "pci0000:b0"})
    assert read.entries == tuple(sorted(("system", "virtual", GPU1_ROOT)))
    assert dict(read.roots) == {GPU1_ROOT: ("0000:48:1f.0", "power")}
    for i in range(view_module.MAX_NODE_ENTRIES + 5):
        (sysfs / "devices" / f"x{i:04d}").mkdir()
    assert len(read_node_devices(sysfs, ()).entries) == view_module.MAX_NODE_ENTRIES
    with pytest.raises(FileNotFoundError, match="nothing"):
        read_node_devices(tmp_path / "nothing", ())

    root = tmp_path / "root"
    root.mkdir()
    on = build_view(STATE, Host(root), NriSettings(mount_root="/node", sysfs=sysfs,
                                                   sys_devices=True))
    assert on.sys_devices == SysDevices(
        node_sysfs=str(sysfs), links=f"/node{LINKS}",
        roots=frozenset(p.split("/")[1] for p in (*(g.sysfs_path for g in GPUS), *SWITCHES)))
    assert build_view(STATE, Host(root), NriSettings(sysfs=sysfs)).sys_devices is None
