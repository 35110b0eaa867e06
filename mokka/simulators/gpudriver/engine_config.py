"""Render the engine config: the one file the mock NVML library reads.

The daemon compiles profile, topology document and overrides into a
``State``; this module turns that ``State`` into the text the C library parses
(``docs/engine-config.md`` is the format's reference).  The format is a flat
subset of YAML, one ``dotted.key: value`` a line, chosen so that:

* the C side needs no third-party parser: it splits each line at the first
  ``": "``, unquotes a double-quoted string, and looks keys up in a sorted
  table (unknown keys are ignored, so the writer may add keys freely);
* humans and Python still read it as YAML (``yaml.safe_load`` gives a flat
  mapping), which keeps it debuggable with ordinary tools.

Everything the library needs is resolved here, not in C: canonical NVML bus
ids, what kind of thing each NVLink reaches (the library wires the switch
ports and mesh peers from the switch list and the GPU positions, as the
baseboard does), the NVSwitches' PCI ids, NUMA node and CPU
list, the fabric identity with this node's clique folded in, failure
injection and the pending Xids.  The
function is pure: the gpudriver simulator stages its output atomically at
``mokka.layout.ENGINE_CONFIG``.

Whatever the writer emits, the reader must accept: a file the library
rejects leaves every NVML process on the node with the last good snapshot
(or, at start, with ``NVML_ERROR_UNKNOWN``).  So the writer repeats the
reader's limits (key and value lengths, device count, the words it maps)
and raises ``SpecError`` naming the GPU and field, which fails the Stage
wave with a message instead of shipping a file the library would refuse.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from mokka import layout
from mokka.errors import SpecError
from mokka.simulators.gpudriver.config_lines import flatten, format_line
from mokka.simulators.gpudriver.mig_config import mig_entries
from mokka.simulators.pcibus.endpoints import nvswitch_device_id
from mokka.state.model import Gpu, State

logger = logging.getLogger(__name__)

#: Version of the format; the C library refuses any other value.
FORMAT_VERSION = 1

#: The largest engine config the C library reads (``MOCK_MAX_CONFIG_BYTES`` in
#: ``native/nvml/mock.h``): a longer one fails ``nvmlInit`` on every client.
MAX_CONFIG_BYTES = 16 << 20

#: The C library's device table size (``MOCK_MAX_DEVICES`` in ``native/nvml/mock.h``).
MAX_DEVICES = 64

#: Profile architecture names the library maps to ``NVML_DEVICE_ARCH_*``
#: (its table in ``native/nvml/devices.c``); anything else reads as
#: ``NVML_DEVICE_ARCH_UNKNOWN``, hence the warning in ``_typed_device_fields``.
ARCHITECTURES = (
    "kepler",
    "maxwell",
    "pascal",
    "volta",
    "turing",
    "ampere",
    "ada",
    "hopper",
    "blackwell",
)

#: Other spellings of architectures that profiles use.
ARCHITECTURE_ALIASES = {"ada_lovelace": "ada", "ada lovelace": "ada"}

#: Fabric probe states the library understands (``auto`` follows the marker).
#: The same words as ``mokka.state.device_checks``, kept here as the
#: library's side of the contract: a ``State`` built without the parsers
#: (a test, another source) is still checked before it reaches C.
FABRIC_STATES = ("completed", "in_progress", "not_started", "not_supported", "auto")

#: Failure modes the library implements.
FAILURE_MODES = ("healthy", "lost", "fallen_off_bus", "ecc_uncorrectable")


def fabric_marker_relative_path() -> str:
    """The readiness marker's path relative to the engine config's directory.

    Relative, so the same file works on the host (``/var/lib/nvml-mock/...``),
    under a test root, and in a container that mirrors the layout; and it
    names the mirror beside the config (no ``..``), so it also works through
    a bind mount of the driver root alone (``layout.FABRIC_READY_MIRROR``).
    """
    return os.path.relpath(layout.FABRIC_READY_MIRROR, os.path.dirname(layout.ENGINE_CONFIG))


class DeviceBlocks:
    """Each position's last rendered ``device.<position>.*`` lines, with what they came from.

    A profile change rarely touches every GPU (8 -> 4 keeps four), and a
    repair pass touches none, yet flattening and formatting a GPU's few
    hundred fields is most of a render.  A GPU whose resolved fields and
    profile fields are both the same as the last ones at its position gets
    the same lines: rendering is a function of exactly those two.  "The
    same" is ``_identical``, not ``==``: ``1 == 1.0 == True`` to Python,
    but each is written differently.  Kept by the simulator that renders,
    for the life of the process.
    """

    def __init__(self) -> None:
        self._blocks: dict[int, tuple[list[tuple[str, Any]], Mapping[str, Any], list[str]]] = {}

    def lines(self, state: State, position: int, gpu: Gpu) -> list[str]:
        """One GPU's formatted lines (``_device_entries``, then ``format_line``)."""
        typed = list(_typed_device_fields(state, gpu))
        kept = self._blocks.get(position)
        if kept is not None and _identical(kept[0], typed) and _identical(kept[1], gpu.fields):
            return kept[2]
        lines = [format_line(key, value) for key, value in _device_entries(position, gpu, typed)]
        self._blocks[position] = (typed, gpu.fields, lines)
        return lines

    def forget_beyond(self, count: int) -> None:
        """Drop the blocks of positions past ``count`` GPUs (a node that shrank)."""
        for position in [p for p in self._blocks if p >= count]:
            del self._blocks[position]


def _identical(a: Any, b: Any) -> bool:
    """Equal, with the same types and the same key order all the way down (what
    ``config_lines`` writes depends on all three)."""
    # The C comparison first: it rejects almost every change, and once it
    # holds, only the types and the order are left to compare.
    return a is b or (a == b and _same_shape(a, b))


def _same_shape(a: Any, b: Any) -> bool:
    """For ``a == b``: the same types, and the same key order, all the way down."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return all(type(ka) is type(kb) and ka == kb and _same_shape(va, vb)
                   for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True))
    if type(a) is list or type(a) is tuple:
        return all(map(_same_shape, a, b))
    return True


def render_engine_config(
    state: State, blocks: DeviceBlocks | None = None, *, idle_signature: bool = False
) -> str:
    """The engine config text for ``state`` (deterministic for equal states).

    Raises ``SpecError`` when a value cannot be represented (a newline in a
    string, an over-long value, too many GPUs), naming the device and field.

    Order: ``format`` first (the reader checks it before anything else),
    then the node-wide keys, then one block per GPU in state order.  The
    order is fixed so equal states give byte-equal files and a re-stage
    rewrites nothing.  ``blocks`` reuses the lines of GPUs unchanged since
    the last render (``DeviceBlocks``); the text is the same either way.
    ``idle_signature`` writes the node-level ``idle_signature: true``, which
    gives each idle GPU its own readings (docs/nvml.md, "Idle readings");
    without it every idle reading is exactly the profile's figure.
    """
    if len(state.gpus) > MAX_DEVICES:
        raise SpecError(
            f"engine config: gpus: got {len(state.gpus)} devices, expected at most {MAX_DEVICES}"
        )
    entries: list[tuple[str, Any]] = []
    entries.append(("format", FORMAT_VERSION))
    entries.append(("generation", state.generation))
    entries.append(("node_name", state.node_name))
    entries.append(("profile", state.profile_name))
    entries.extend(_system_entries(state))
    entries.append(("paths.fabric_ready_marker", fabric_marker_relative_path()))
    entries.extend(_nvlink_entries(state))
    entries.extend(_xid_entries(state))
    if idle_signature:
        entries.append(("idle_signature", True))
    entries.append(("device_count", len(state.gpus)))

    lines = [
        "# Engine config of the mock NVML library (format described in docs/engine-config.md).",
        "# Written by the mokka node daemon; edits are overwritten on the next pass.",
    ]
    lines.extend(format_line(key, value) for key, value in entries)
    if blocks is None:
        blocks = DeviceBlocks()
    else:
        blocks.forget_beyond(len(state.gpus))
    size = sum(map(len, lines)) + len(lines)
    for position, gpu in enumerate(state.gpus):
        block = blocks.lines(state, position, gpu)
        size += sum(map(len, block)) + len(block)
        if size > MAX_CONFIG_BYTES:  # characters: a lower bound of the bytes
            raise _too_large(f"{size} bytes or more by gpu {gpu.index}")
        lines.extend(block)
    text = "\n".join(lines) + "\n"
    if size * 4 > MAX_CONFIG_BYTES:  # else even four bytes a character would fit
        encoded = len(text.encode())
        if encoded > MAX_CONFIG_BYTES:
            raise _too_large(f"{encoded} bytes")
    return text


def _too_large(how: str) -> SpecError:
    """The refusal of a config the library would not read: every client's ``nvmlInit`` fails."""
    return SpecError(
        f"engine config: {how}, expected at most {MAX_CONFIG_BYTES} (the mock NVML library's "
        "limit); a profile or overrides field expands to too many lines"
    )


def _system_entries(state: State) -> Iterator[tuple[str, Any]]:
    """The driver's own facts; the CUDA version in NVML's integer form (13.0 → 13000)."""
    system = state.system
    yield "system.driver_version", system.driver_version
    yield "system.nvml_version", system.nvml_version
    yield "system.cuda_driver_version", system.cuda_driver_version


def _nvlink_entries(state: State) -> Iterator[tuple[str, Any]]:
    """Node-wide NVLink facts and the NVSwitches: bus ids in NVML's spelling, and
    the PCI device id the pcibus simulator gives them in sysfs
    (``nvswitch_device_id``), which the library reports for a link's remote switch."""
    nvlink = state.nvlink
    if nvlink is None:
        yield "nvlink.links_per_gpu", 0
        return
    yield "nvlink.version", nvlink.version
    yield "nvlink.links_per_gpu", nvlink.links_per_gpu
    yield "nvlink.bandwidth_per_link_mbps", nvlink.bandwidth_per_link_mbps
    yield "nvlink.c2c_enabled", nvlink.c2c_enabled
    yield "nvlink.switch_count", len(nvlink.switches)
    device_id = nvswitch_device_id(state)
    for i, switch in enumerate(nvlink.switches):
        yield f"nvlink.switch.{i}.bus_id", nvml_bus_id(switch.bdf)
        yield f"nvlink.switch.{i}.uuid", switch.uuid
        yield f"nvlink.switch.{i}.pci_device_id", device_id


def _xid_entries(state: State) -> Iterator[tuple[str, Any]]:
    """The pending Xids; the library delivers each ``id`` once per process through events."""
    # Positions, not profile indices: the library addresses devices by their
    # place in this file, and a Xid for a GPU that is not staged is dropped.
    position_of = {gpu.index: position for position, gpu in enumerate(state.gpus)}
    xids = [x for x in state.xids if x.gpu_index in position_of]
    yield "xid_count", len(xids)
    for i, xid in enumerate(xids):
        yield f"xid.{i}.id", xid.id
        yield f"xid.{i}.gpu", position_of[xid.gpu_index]
        yield f"xid.{i}.code", xid.code


def _device_entries(
    position: int, gpu: Gpu, typed_fields: list[tuple[str, Any]]
) -> list[tuple[str, Any]]:
    """Every ``device.<position>.*`` entry of one GPU: profile fields, then the typed
    ones (``_typed_device_fields``)."""
    prefix = f"device.{position}"
    typed = dict(typed_fields)
    # Generic profile fields first, then the typed ones on top: the typed
    # values are already resolved (NVML spellings, folded clique, overrides)
    # and must win over the raw profile field of the same name.
    merged: dict[str, Any] = dict(flatten(gpu.fields, where=f"gpu {gpu.index}"))
    merged.update(typed)
    return [(f"{prefix}.{key}", value) for key, value in merged.items()]


def _typed_device_fields(state: State, gpu: Gpu) -> Iterator[tuple[str, Any]]:
    """The fields the daemon resolves itself, in the spellings the library looks up.

    Enumerations are lower-case words the C tables match (brand,
    architecture, fabric state, failure mode).  Raises ``SpecError`` for a
    fabric state or failure mode the library does not implement.
    """
    yield "index", gpu.index
    yield "minor", gpu.minor
    yield "uuid", gpu.uuid
    yield "serial", gpu.serial
    yield "name", gpu.name
    # lower-case: the library's brand table spells NVML_BRAND_* that way
    yield "brand", gpu.brand.lower()
    architecture = gpu.architecture.lower()
    architecture = ARCHITECTURE_ALIASES.get(architecture, architecture)
    if architecture not in ARCHITECTURES:
        logger.warning(
            "engine config: gpu %d: architecture %r is unknown to NVML; reporting it as unknown",
            gpu.index,
            gpu.architecture,
        )
    yield "architecture", architecture
    yield "board_id", _board_id(gpu)
    if gpu.module_id is not None:
        yield "module_id", gpu.module_id

    # ``nvmlPciInfo_t`` carries the address twice: ``busId`` with an 8-digit
    # domain and ``busIdLegacy`` with a 4-digit one, plus the parts as numbers.
    domain, bus, devfn = gpu.bus_id.split(":", 2)
    slot, function = devfn.split(".", 1)
    yield "pci.bus_id", gpu.nvml_bus_id
    yield "pci.bus_id_legacy", f"{int(domain, 16):04X}:{bus.upper()}:{slot.upper()}.{function}"
    yield "pci.domain", int(domain, 16)
    yield "pci.bus", int(bus, 16)
    yield "pci.slot", int(slot, 16)
    yield "pci.function", int(function, 16)
    yield "pci.vendor_id", gpu.pci_vendor_id
    yield "pci.device_id", gpu.pci_device_id
    yield "pci.subsystem_vendor_id", gpu.pci_subsystem_vendor_id
    yield "pci.subsystem_device_id", gpu.pci_subsystem_device_id

    yield "root_complex", gpu.root_complex
    yield "numa_node", gpu.numa_node
    # ``nvmlDeviceGetCpuAffinity``; without the key the library reports every
    # online CPU, as a host whose firmware gives no locality does
    for root in state.pcie_roots:
        if root.id == gpu.root_complex and root.cpulist:
            yield "cpu_affinity", root.cpulist

    yield "addressing_mode", _addressing_mode(state, gpu)

    if gpu.fabric is not None:
        if gpu.fabric.state not in FABRIC_STATES:
            raise SpecError(
                f"engine config: gpu {gpu.index}: fabric.state: got {gpu.fabric.state!r}, "
                f"expected one of {', '.join(FABRIC_STATES)}"
            )
        yield "fabric.state", gpu.fabric.state
        yield "fabric.cluster_uuid", gpu.fabric.cluster_uuid
        yield "fabric.clique_id", gpu.fabric.clique_id

    failure = gpu.failure
    if failure.mode not in FAILURE_MODES:
        raise SpecError(
            f"engine config: gpu {gpu.index}: failure.mode: got {failure.mode!r}, "
            f"expected one of {', '.join(FAILURE_MODES)}"
        )
    yield "failure.mode", failure.mode
    if failure.after_calls is not None:
        yield "failure.after_calls", failure.after_calls
    if failure.probability is not None:
        yield "failure.probability", failure.probability
    if failure.seed is not None:
        yield "failure.seed", failure.seed

    yield from mig_entries(gpu, state.profile_name)
    yield from _link_entries(state, gpu)


def _board_id(gpu: Gpu) -> int:
    """``nvmlDeviceGetBoardId``: the profile's ``board_id``, else derived from the address.

    The profile's value wins: it is what the board reports, and a derivation
    cannot know it (GB200 trays put every GPU on bus 01 of its own domain, so
    the bus alone would give all four the same id).  Without one, the rule
    real boards follow: ``(domain << 16) | (bus << 8)`` (H100 capture: bus
    0x53 on domain 0 gives 0x5300).
    """
    value = gpu.fields.get("board_id")
    if value is None:
        domain = int(gpu.bus_id.split(":", 1)[0], 16)
        return (domain << 16) | (gpu.bus << 8)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFFFFFF:
        raise SpecError(
            f"engine config: gpu {gpu.index}: board_id: got {value!r}, "
            "expected an integer 0..0xFFFFFFFF"
        )
    return value


def _addressing_mode(state: State, gpu: Gpu) -> str:
    """``none`` | ``hmm`` | ``ats``: the profile's value, else what the hardware reports.

    Real nodes: Grace-attached GPUs (C2C) report ATS, x86 hosts HMM.
    """
    value = gpu.fields.get("addressing_mode")
    if isinstance(value, str) and value.lower() in ("none", "hmm", "ats"):
        return value.lower()
    if state.nvlink is not None and state.nvlink.c2c_enabled:
        return "ats"
    return "hmm"


def _link_entries(state: State, gpu: Gpu) -> Iterator[tuple[str, Any]]:
    """Per NVLink: what kind of thing is at the far end, ``switch`` or ``gpu``.

    The library answers a query for a link at or past ``link_count`` with
    NOT_SUPPORTED and counts the ``switch`` links for field 147 (``topo -m``
    prints NV18 for 18 of them).  Which switch port or peer link each link
    reaches is the library's to wire, from the switch list and the GPU
    positions alone: each GPU's links in blocks over the switches as the
    baseboard splits them, or over its peers as the direct mesh joins them
    (``native/nvml/nvlink_wiring.c``, docs/nvml.md "NVLink"); so no link
    carries the far end's bus id.
    """
    nvlink = state.nvlink
    links = nvlink.links_per_gpu if nvlink is not None else 0
    yield "nvlink.link_count", links
    if nvlink is None or links <= 0:
        return
    has_peers = any(other.index != gpu.index for other in state.gpus)
    # HGX baseboards (switches), NVL72 trays and single-GPU nodes (the far end
    # is a switch tray outside this node, no PCI function to report) reach
    # switches; with no switches declared, the links form a direct GPU mesh.
    remote = "switch" if nvlink.switches or nvlink.c2c_enabled or not has_peers else "gpu"
    for link in range(links):
        yield f"nvlink.link.{link}.remote_type", remote


def nvml_bus_id(bdf: str) -> str:
    """Any ``[dddd:]bb:dd.f`` spelling → NVML's ``DDDDDDDD:BB:DD.F``.

    A missing domain is 0, as ``lspci`` prints addresses on single-domain
    hosts.  The result is the ``busId`` spelling every NVML consumer
    compares against (device plugin, DRA, ``nvidia-smi``).
    """
    parts = bdf.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    domain, bus, devfn = parts
    return f"{int(domain, 16):08X}:{bus.upper()}:{devfn.upper()}"
