"""The mock PCI tree as ``Host`` artifacts, under ``mokka.layout.SYS_ROOT``.

For each function of a ``PciTree`` (paths relative to the mock ``/sys``)::

    devices/<root>/[<bridge>/]<bdf>/{vendor,device,subsystem_vendor,
        subsystem_device,class,revision,irq,numa_node,local_cpulist,
        local_cpus,resource,config,max_link_speed,max_link_width,
        current_link_speed,current_link_width}
    devices/<root>/[<bridge>/]<bdf>/driver -> ../../../../bus/pci/drivers/nvidia
    bus/pci/devices/<bdf>                -> ../../../devices/<root>/.../<bdf>
    bus/pci/drivers/nvidia/<bdf>         -> ../../../../devices/<root>/.../<bdf>

The bus directories exist even when no function does (see
``_BUS_DIRECTORIES``).  Every link is relative, so the tree reads the same wherever it is mounted
or prefixed (``lspci -O sysfs.path=...``, ``libmockfs.so``, a container
bind mount), and ``..`` after a link lands where it would on a real host.
File modes and spellings are the kernel's: read-only attributes 0444,
``config`` and ``numa_node`` 0644; ids as ``0x%04x``, the class as
``0x%06x``; link speeds as the kernel's ``pci_speed_string`` spells a
generation (``16.0 GT/s PCIe``) and widths as lane counts; ``resource``
lists 13 all-zero ``start end flags`` lines for a device and 17 for a
bridge (the kernel prints ``PCI_BRIDGE_RESOURCES`` resp.
``PCI_NUM_RESOURCES`` lines), i.e. no BARs are claimed.
"""

from __future__ import annotations

from mokka import layout
from mokka.noderoot import Artifact, Directory, File, Symlink
from mokka.simulators.pcibus.config_space import build_config
from mokka.simulators.pcibus.hierarchy import PciFunction, PciTree

#: Lines of ``resource``: 6 BARs + ROM + 6 SR-IOV BARs for a device, plus the
#: 4 bridge windows for a bridge.
_DEVICE_RESOURCES = 13
_BRIDGE_RESOURCES = 17
_ZERO_RESOURCE = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"

_READ_ONLY = 0o444
_WRITABLE = 0o644


#: Link speed per PCIe generation, as the kernel prints it (``pci_speed_string``).
LINK_SPEEDS = {
    1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe",
    5: "32.0 GT/s PCIe", 6: "64.0 GT/s PCIe",
}


def _up(path: str) -> str:
    """``../`` for every component of ``path`` (a path relative to the mock /sys)."""
    return "../" * (path.count("/") + 1)


def function_artifacts(fn: PciFunction) -> list[Artifact]:
    """The attribute files and links of one function."""
    base = f"{layout.SYS_ROOT}/{fn.path}"
    resources = _BRIDGE_RESOURCES if fn.is_bridge else _DEVICE_RESOURCES
    files = [
        File(f"{base}/vendor", f"0x{fn.vendor:04x}\n", _READ_ONLY),
        File(f"{base}/device", f"0x{fn.device:04x}\n", _READ_ONLY),
        File(f"{base}/subsystem_vendor", f"0x{fn.subsystem_vendor:04x}\n", _READ_ONLY),
        File(f"{base}/subsystem_device", f"0x{fn.subsystem_device:04x}\n", _READ_ONLY),
        File(f"{base}/class", f"0x{fn.class_code:06x}\n", _READ_ONLY),
        File(f"{base}/revision", "0x00\n", _READ_ONLY),
        File(f"{base}/irq", f"{fn.irq}\n", _READ_ONLY),
        File(f"{base}/numa_node", f"{fn.numa_node}\n", _WRITABLE),
        File(f"{base}/local_cpulist", f"{fn.cpulist}\n", _READ_ONLY),
        File(f"{base}/local_cpus", f"{fn.cpumask}\n", _READ_ONLY),
        File(f"{base}/resource", _ZERO_RESOURCE * resources, _READ_ONLY),
        File(f"{base}/config", build_config(fn), _WRITABLE),
        File(f"{base}/max_link_speed", f"{LINK_SPEEDS[fn.link.max_gen]}\n", _READ_ONLY),
        File(f"{base}/max_link_width", f"{fn.link.max_width}\n", _READ_ONLY),
        File(f"{base}/current_link_speed", f"{LINK_SPEEDS[fn.link.current_gen]}\n", _READ_ONLY),
        File(f"{base}/current_link_width", f"{fn.link.current_width}\n", _READ_ONLY),
    ]
    links: list[Artifact] = [
        Symlink(f"{layout.SYS_ROOT}/bus/pci/devices/{fn.bdf}", _up("bus/pci/devices") + fn.path),
    ]
    if fn.driver is not None:
        driver_dir = f"bus/pci/drivers/{fn.driver}"
        links.append(Symlink(f"{base}/driver", _up(fn.path) + driver_dir))
        links.append(Symlink(f"{layout.SYS_ROOT}/{driver_dir}/{fn.bdf}", _up(driver_dir) + fn.path))
    return [*files, *links]


#: Present even on a bus without devices: a process preloading
#: ``libmockfs.so`` must find an *empty* bus there, not a missing one (libpci
#: would fall back to other access methods and look for the host's devices).
_BUS_DIRECTORIES = ("bus/pci/devices", "bus/pci/drivers", "devices")


def tree_artifacts(tree: PciTree) -> list[Artifact]:
    """Every artifact of the mock PCI tree (just the empty bus for an empty tree)."""
    artifacts: list[Artifact] = [Directory(f"{layout.SYS_ROOT}/{d}") for d in _BUS_DIRECTORIES]
    for fn in tree.functions:
        artifacts.extend(function_artifacts(fn))
    return artifacts
