"""The ``NodeView`` of one state: what the injection policy needs, gathered once.

The GPUs with their sysfs paths come from the same plan the pcibus simulator
stages (``plan_tree``), so a path injected is a path staged.  The optional
overlays (the engine config socket, ``nvidia-smi``, the IMEX ``/proc/devices``,
the topology document, the driver's ``/proc`` files, the board's DMI
directory) are looked up on the node: other simulators stage them or not by
their own flags, and a mount of a missing source would fail the container.
Blocking (``lstat``, ``listdir``): run it in a thread.

``read_node_devices`` reads the node's own ``/sys/devices`` for
``--nri-sys-devices``, at each container's creation: an entry gone since a
view was built would make a bind without a source, which fails the
container.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from mokka import layout
from mokka.errors import HostPathError
from mokka.noderoot import Host
from mokka.simulators.gpudriver.binaries import NVIDIA_SMI, NVML_SONAME
from mokka.simulators.gpudriver.nvml_socket import SOCKET
from mokka.simulators.nri.inject import DMI_DIR, GpuView, NodeDevices, NodeView, SysDevices
from mokka.simulators.nri.pci_links import PCI_LINKS
from mokka.simulators.nri.settings import NriSettings
from mokka.simulators.pcibus.hierarchy import plan_tree
from mokka.state.model import State

#: Where the pcibus tree may hold the board's DMI files, in the order tried:
#: the kernel's own directory, then the class link's path (a directory or a
#: link into the tree).
STAGED_DMI = (f"{layout.SYS_ROOT}/devices/virtual/dmi/id", f"{layout.SYS_ROOT}/class/dmi/id")
#: Directories of one node directory ``read_node_devices`` takes, in name
#: order; the rest are left out.  A node's ``/sys/devices`` has about 15, a
#: PCI root a few dozen: each is one mount of every adjusted container.
MAX_NODE_ENTRIES = 256


def plan_gpus(state: State) -> tuple[tuple[GpuView, ...], tuple[str, ...]]:
    """The GPUs with their sysfs paths, and the NVSwitches' paths; ``SpecError`` as ``plan_tree``.

    One fallback CPU: the CPU lists do not matter here, only the paths.
    """
    tree = plan_tree(state, fallback_cpus=1)
    paths = {fn.bdf: fn.path for fn in tree.functions}
    gpus = tuple(
        GpuView(index=g.index, uuid=g.uuid, minor=g.minor, bdf=g.bus_id,
                numa_node=g.numa_node, sysfs_path=paths[g.bus_id])
        for g in sorted(state.gpus, key=lambda g: g.index)
    )
    switches = tuple(fn.path for fn in tree.by_role("nvswitch"))
    return gpus, switches


def build_view(state: State, host: Host, settings: NriSettings) -> NodeView:
    """The view of ``state`` on ``host`` (blocking; see the module docstring)."""
    gpus, switches = plan_gpus(state)
    src = settings.source

    def present(node_path: str, kind: int) -> str | None:
        try:
            st = os.stat(host.resolve(node_path))
        except (OSError, HostPathError):
            return None
        return src(node_path) if stat.S_IFMT(st.st_mode) == kind else None

    topology = present(layout.TOPOLOGY_OVERLAY, stat.S_IFREG)
    sys_devices = None
    if settings.sys_devices:
        roots = {path.split("/")[1] for path in (*(g.sysfs_path for g in gpus), *switches)}
        sys_devices = SysDevices(node_sysfs=str(settings.sysfs), links=src(PCI_LINKS),
                                 roots=frozenset(roots))
    dmi = None
    if (settings.sysfs / DMI_DIR.removeprefix("/sys/")).is_dir():
        dmi = next(filter(None, (present(p, stat.S_IFDIR) for p in STAGED_DMI)), None)
    return NodeView(
        gpus=gpus,
        switches=switches,
        sys_root=src(layout.SYS_ROOT),
        driver_roots=(src(layout.DRIVER_ROOT), src(layout.RUN_DRIVER)),
        config_dir=src(layout.CONFIG_DIR),
        container_config_dir=layout.CONFIG_DIR,
        engine_config=layout.ENGINE_CONFIG,
        nvml_socket=present(SOCKET, stat.S_IFSOCK),
        nvml_library=present(f"{layout.DRIVER_LIB}/{NVML_SONAME}", stat.S_IFREG),
        nvidia_smi=present(NVIDIA_SMI, stat.S_IFREG),
        proc_driver=present(layout.DRIVER_PROC, stat.S_IFDIR),
        imex_proc_devices=present(layout.IMEX_PROC_DEVICES, stat.S_IFREG),
        topology=None if topology is None else (topology, layout.TOPOLOGY_OVERLAY),
        host_pci_roots=_pci_roots(settings),
        dmi=dmi,
        ambient=settings.ambient,
        proc_mounts=settings.proc_mounts,
        sys_devices=sys_devices,
    )


def read_node_devices(sysfs: Path, roots: Iterable[str]) -> NodeDevices:
    """The directories of ``sysfs/devices``, and of each of ``roots`` found there.

    Raises ``OSError`` where ``sysfs/devices`` cannot be read: the plugin
    then answers the container empty and ``/readyz`` says why.
    """
    entries = _directories(sysfs / "devices")
    shared = {root: _directories(sysfs / "devices" / root) for root in roots if root in entries}
    return NodeDevices(entries=entries, roots=shared)


def _directories(path: Path) -> tuple[str, ...]:
    """Names of the directories in ``path`` (not links), at most ``MAX_NODE_ENTRIES``."""
    with os.scandir(path) as it:
        names = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    return tuple(itertools.islice(names, MAX_NODE_ENTRIES))


def _pci_roots(settings: NriSettings) -> frozenset[str]:
    """``pci<domain>:<bus>`` directories of the node's real ``/sys/devices``."""
    try:
        names = os.listdir(settings.sysfs / "devices")
    except OSError:
        return frozenset()
    return frozenset(n for n in names if n.startswith("pci"))
