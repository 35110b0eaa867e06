"""The mock InfiniBand tree as ``Host`` artifacts, under ``mokka.layout.IB_ROOT``.

``IB_ROOT`` stands for ``/`` under ``libmockfs.so`` (its default prefixes
include ``/sys/class/infiniband``, ``/sys/class/infiniband_mad``,
``/sys/class/infiniband_verbs`` and ``/dev/infiniband``), so the tree mirrors
the host paths below it.  Per HCA ``i`` (see ``hca.Hca``)::

    sys/class/infiniband/mlx5_<i>/
        node_type (1: CA)  node_guid  sys_image_guid  fw_ver  hw_rev
        board_id  hca_type  node_desc (0644)
        device/{modalias,vendor,device,subsystem_vendor,subsystem_device,class}
        ports/1/{state,phys_state,rate,lid,lid_mask_count,sm_lid,sm_sl,
                 cap_mask,link_layer}
        ports/1/gids/0  ports/1/pkeys/0  ports/1/gid_attrs/types/0
        ports/1/counters/<name> (0)
    sys/class/infiniband_mad/abi_version (5)
    sys/class/infiniband_mad/{umad<i>,issm<i>}/{ibdev,port,dev}
    sys/class/infiniband_verbs/abi_version (6)
    sys/class/infiniband_verbs/uverbs<i>/{ibdev,abi_version,dev}
    dev/infiniband/{umad<i>,issm<i>} (0600)  dev/infiniband/uverbs<i> (0666)

Simplifications, each invisible to the readers this serves (libibumad reads
``/sys/class/infiniband/<ca>/...`` by name and accepts directories there):

* ``mlx5_<i>`` is a directory, not a link into ``/sys/devices/pci…``, and
  ``device`` is a directory inside the HCA holding the PCI identity (the mock
  PCI bus belongs to ``pcibus``, which knows no HCAs);
* the GID and P_Key tables hold their first entry only; a port has no
  ``port_guid`` file (neither does the kernel's: readers take the port GUID
  from GID 0).

Device numbers are the kernel's: ``umad<i>`` 231:i and ``issm<i>`` 231:64+i
for the first 64 HCAs, ``uverbs<i>`` 231:192+i for the first 32; past those
fixed ranges the kernel numbers devices on a dynamically allocated major,
which here is a fixed one (``UMAD_DYNAMIC_MAJOR``, ``UVERBS_DYNAMIC_MAJOR``).
"""

from __future__ import annotations

from collections.abc import Mapping

from mokka import layout
from mokka.noderoot import Artifact, CharDevice, Directory, File
from mokka.simulators.ib.hca import (
    CAP_MASK,
    IB_PCI_CLASS,
    LINK_LAYER,
    MELLANOX_PCI_VENDOR,
    SM_LID,
    SM_SL,
    SUBSYSTEM_DEVICE,
    Hca,
)

SYS_CLASS = f"{layout.IB_ROOT}/sys/class"
IB_CLASS = f"{SYS_CLASS}/infiniband"
MAD_CLASS = f"{SYS_CLASS}/infiniband_mad"
VERBS_CLASS = f"{SYS_CLASS}/infiniband_verbs"
DEV_DIR = f"{layout.IB_ROOT}/dev/infiniband"

#: ``IB_UMAD_ABI_VERSION`` and ``IB_USER_VERBS_ABI_VERSION``: libibumad and
#: libibverbs refuse to run against any other value.
MAD_ABI_VERSION = 5
VERBS_ABI_VERSION = 6
#: ``uverbs<i>/abi_version``: the mlx5 driver's uverbs ABI.
MLX5_UVERBS_ABI = 1

#: ``IB_UMAD_MAJOR`` (umad, issm) and ``IB_UVERBS_MAJOR``: both 231.
IB_MAJOR = 231
#: ``IB_UMAD_NUM_FIXED_MINOR``: umad<i> = 231:i, issm<i> = 231:64+i below it.
UMAD_FIXED = 64
#: ``IB_UVERBS_BASE_MINOR`` and ``IB_UVERBS_NUM_FIXED_MINOR``.
UVERBS_BASE_MINOR = 192
UVERBS_FIXED = 32
#: ``IB_UMAD_NUM_DYNAMIC_MINOR`` (``RDMA_MAX_PORTS`` - 64): issm minors on the
#: dynamic major start after the umad ones.
UMAD_DYNAMIC_MINORS = 1024 - UMAD_FIXED
#: Dynamic majors (the kernel allocates them at boot); 510 is gpudriver's
#: default ``nvidia-uvm`` major, so these stay below it.
UMAD_DYNAMIC_MAJOR = 509
UVERBS_DYNAMIC_MAJOR = 508

#: sysfs file modes: attributes read-only, ``node_desc`` writable by root
#: (rdma-ndd sets it to the host name).
_RO = 0o444
_RW = 0o644
#: ``/dev/infiniband``: management datagrams are root's, verbs everyone's
#: (rdma-core's udev rules).
UMAD_MODE = 0o600
UVERBS_MODE = 0o666

#: The port counters the kernel exposes for an IB port (``ib_pma`` names).
COUNTERS = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
)


#: Each counter's width in bits, as the kernel shows it for a port whose PMA
#: has the extended counters (mlx5: ``IB_PMA_CLASS_CAP_EXT_WIDTH``): the
#: error counters are PortCounters' 4-, 8- and 16-bit fields, the data and
#: packet counters PortCountersExtended's 64-bit ones.  A counter at its
#: largest value stays there (IB counters saturate; they never wrap).
COUNTER_BITS = {
    "VL15_dropped": 16,
    "excessive_buffer_overrun_errors": 4,
    "link_downed": 8,
    "link_error_recovery": 8,
    "local_link_integrity_errors": 4,
    "multicast_rcv_packets": 64,
    "multicast_xmit_packets": 64,
    "port_rcv_constraint_errors": 8,
    "port_rcv_data": 64,
    "port_rcv_errors": 16,
    "port_rcv_packets": 64,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_constraint_errors": 8,
    "port_xmit_data": 64,
    "port_xmit_discards": 16,
    "port_xmit_packets": 64,
    "port_xmit_wait": 32,
    "symbol_error": 16,
    "unicast_rcv_packets": 64,
    "unicast_xmit_packets": 64,
}
assert tuple(COUNTER_BITS) == COUNTERS


def saturated(name: str, value: int) -> int:
    """``value`` held to what counter ``name`` can show (0 up to all ones)."""
    return min(max(value, 0), (1 << COUNTER_BITS[name]) - 1)


def umad_dev(index: int) -> tuple[int, int]:
    """(major, minor) of ``umad<index>``."""
    if index < UMAD_FIXED:
        return IB_MAJOR, index
    return UMAD_DYNAMIC_MAJOR, index - UMAD_FIXED


def issm_dev(index: int) -> tuple[int, int]:
    """(major, minor) of ``issm<index>``."""
    if index < UMAD_FIXED:
        return IB_MAJOR, UMAD_FIXED + index
    return UMAD_DYNAMIC_MAJOR, UMAD_DYNAMIC_MINORS + index - UMAD_FIXED


def uverbs_dev(index: int) -> tuple[int, int]:
    """(major, minor) of ``uverbs<index>``."""
    if index < UVERBS_FIXED:
        return IB_MAJOR, UVERBS_BASE_MINOR + index
    return UVERBS_DYNAMIC_MAJOR, index - UVERBS_FIXED


def _line(value: object) -> str:
    return f"{value}\n"


def hca_artifacts(hca: Hca, counters: Mapping[str, int] | None = None) -> list[Artifact]:
    """``sys/class/infiniband/mlx5_<i>/``: node attributes, PCI identity, port 1
    (``counters``: the port counters raised at run time, by name; others 0)."""
    base = f"{IB_CLASS}/{hca.name}"
    port = f"{base}/ports/1"
    artifacts: list[Artifact] = [
        File(f"{base}/node_type", "1: CA\n", _RO),
        File(f"{base}/node_guid", _line(hca.guid_text), _RO),
        File(f"{base}/sys_image_guid", _line(hca.guid_text), _RO),
        File(f"{base}/fw_ver", _line(hca.fw_version), _RO),
        File(f"{base}/hw_rev", _line(hca.hw_rev), _RO),
        File(f"{base}/board_id", _line(hca.board_id), _RO),
        File(f"{base}/hca_type", _line(hca.hca_type), _RO),
        File(f"{base}/node_desc", _line(hca.node_desc), _RW),
        File(f"{base}/device/modalias", _line(hca.modalias), _RO),
        File(f"{base}/device/vendor", _line(f"0x{MELLANOX_PCI_VENDOR:04x}"), _RO),
        File(f"{base}/device/device", _line(f"0x{hca.pci_device:04x}"), _RO),
        File(f"{base}/device/subsystem_vendor", _line(f"0x{MELLANOX_PCI_VENDOR:04x}"), _RO),
        File(f"{base}/device/subsystem_device", _line(f"0x{SUBSYSTEM_DEVICE:04x}"), _RO),
        File(f"{base}/device/class", _line(f"0x{IB_PCI_CLASS:06x}"), _RO),
        File(f"{port}/state", _line(hca.state_text), _RO),
        File(f"{port}/phys_state", _line(hca.phys_state_text), _RO),
        File(f"{port}/rate", _line(hca.rate_text), _RO),
        File(f"{port}/lid", _line(f"0x{hca.lid:04x}"), _RO),
        File(f"{port}/lid_mask_count", "0\n", _RO),
        File(f"{port}/sm_lid", _line(f"0x{SM_LID:04x}"), _RO),
        File(f"{port}/sm_sl", _line(SM_SL), _RO),
        File(f"{port}/cap_mask", _line(f"0x{CAP_MASK:08x}"), _RO),
        File(f"{port}/link_layer", _line(LINK_LAYER), _RO),
        File(f"{port}/gids/0", _line(hca.gid0_text), _RO),
        File(f"{port}/pkeys/0", "0xffff\n", _RO),
        File(f"{port}/gid_attrs/types/0", "IB/RoCE v1\n", _RO),
    ]
    raised = counters or {}
    artifacts.extend(
        File(f"{port}/counters/{name}", _line(saturated(name, raised.get(name, 0))), _RO)
        for name in COUNTERS
    )
    return artifacts


def char_class_artifacts(hca: Hca) -> list[Artifact]:
    """The HCA's umad, issm and uverbs class entries and their device nodes."""
    artifacts: list[Artifact] = []
    for kind, (major, minor), mode in (
        ("umad", umad_dev(hca.index), UMAD_MODE),
        ("issm", issm_dev(hca.index), UMAD_MODE),
    ):
        entry = f"{MAD_CLASS}/{kind}{hca.index}"
        artifacts += [
            File(f"{entry}/ibdev", _line(hca.name), _RO),
            File(f"{entry}/port", "1\n", _RO),
            File(f"{entry}/dev", _line(f"{major}:{minor}"), _RO),
            CharDevice(f"{DEV_DIR}/{kind}{hca.index}", major, minor, mode),
        ]
    major, minor = uverbs_dev(hca.index)
    entry = f"{VERBS_CLASS}/uverbs{hca.index}"
    artifacts += [
        File(f"{entry}/ibdev", _line(hca.name), _RO),
        File(f"{entry}/abi_version", _line(MLX5_UVERBS_ABI), _RO),
        File(f"{entry}/dev", _line(f"{major}:{minor}"), _RO),
        CharDevice(f"{DEV_DIR}/uverbs{hca.index}", major, minor, UVERBS_MODE),
    ]
    return artifacts


def tree_artifacts(
    hcas: tuple[Hca, ...], counters: Mapping[str, Mapping[str, int]] | None = None
) -> list[Artifact]:
    """The whole tree; with no HCAs, the empty classes and ABI files.

    The classes exist even without HCAs, so a preloaded reader finds an empty
    class (no devices) rather than a missing one (which libibverbs reports
    as "no kernel support").
    """
    artifacts: list[Artifact] = [
        Directory(IB_CLASS),
        File(f"{MAD_CLASS}/abi_version", _line(MAD_ABI_VERSION), _RO),
        File(f"{VERBS_CLASS}/abi_version", _line(VERBS_ABI_VERSION), _RO),
        Directory(DEV_DIR),
    ]
    for hca in hcas:
        artifacts += hca_artifacts(hca, (counters or {}).get(hca.name))
        artifacts += char_class_artifacts(hca)
    return artifacts
