"""The HCAs a ``State`` calls for, as plain values (no filesystem).

Everything here is spelled the way the kernel's ``ib_core`` and ``mlx5_ib``
print it in sysfs, because the readers (libibumad under ``ibstat``, the
``ibstatus`` script, libibverbs) parse those spellings:

* GUIDs: ``node_guid`` and ``sys_image_guid`` as four ``%04x`` groups
  (``a088:c203:0012:3456``); ConnectX functions report one GUID as node,
  system image and port GUID, so all three are the compiled node GUID.
* Port GID 0: the link-local prefix ``fe80::`` with the port GUID as
  interface id, printed by ``%pI6`` (eight ``%04x`` groups, no ``::``).
* ``state``/``phys_state``: ``"<number>: <name>"`` with the kernel's names
  (``4: ACTIVE``, ``5: LinkUp``).
* ``rate``: ``"<Gb/s> Gb/sec (<width>X <speed>)"``; every rate is a 4X link
  (EDR 100, HDR 200, NDR 400, XDR 800).
* LIDs: ``0x%04x``.  The mock's SM sits at LID 1 (on the spine switch) and
  every node's HCAs take LIDs from the node's block in the fabric's node
  list (``lids.py``), so they are stable across restarts and unique across
  the fabric.
* PCI identity (``device/modalias``): Mellanox vendor ``15b3``, and the
  device id that names the ConnectX generation.  For mlx5 parts the
  ``hca_type`` is ``MT<device id in decimal>`` (``MT4129`` = ``0x1021``,
  ConnectX-7), which is how the id is derived; class ``0x0207``
  (InfiniBand controller).
"""

from __future__ import annotations

import re
import string

import attrs

from mokka.errors import SpecError
from mokka.simulators.ib import lids
from mokka.state.checks import CONTROL_RE, found
from mokka.state.model import Infiniband, State
from mokka.state.profile_blocks import (
    IB_ATTRIBUTE_MAX_BYTES,
    NODE_DESC_MAX,
    node_desc_template_problem,
)

#: PCI vendor of Mellanox (NVIDIA networking) functions.
MELLANOX_PCI_VENDOR = 0x15B3
#: The IEEE OUI libibverbs reports as ``vendor_id`` for these HCAs.
MELLANOX_IB_VENDOR = 0x02C9
#: PCI class of an HCA in InfiniBand mode: network controller, InfiniBand.
IB_PCI_CLASS = 0x020700
#: Subsystem device id: boards differ and no public table maps ``board_id``
#: to it, so the mock reports none.
SUBSYSTEM_DEVICE = 0x0000

#: Kernel port states (``enum ib_port_state``) by the names sysfs prints.
PORT_STATES = {"NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
#: Kernel physical port states (``phys_state_to_str``).
PHYS_STATES = {
    "Sleep": 1,
    "Polling": 2,
    "Disabled": 3,
    "PortConfigurationTraining": 4,
    "LinkUp": 5,
    "LinkErrorRecovery": 6,
    "Phy Test": 7,
}
#: Speed names by rate in Gb/s, every one a 4X link.
RATE_SPEEDS = {100: "EDR", 200: "HDR", 400: "NDR", 800: "XDR"}
LINK_WIDTH = 4
#: The only link layer simulated: Ethernet (RoCE) would need network devices
#: behind every GID, which the mock does not create.
LINK_LAYER = "InfiniBand"

#: Where the subnet manager of the mock fabric sits (``lids.SM_LID``), and
#: its service level.
SM_LID = lids.SM_LID
SM_SL = 0
#: Port capability mask of a ConnectX-7 HCA port (not an SM; the bits
#: ``ibstat`` prints as ``Capability mask``).
CAP_MASK = 0xA751E848
#: ``MT`` and the PCI device id in decimal.  ASCII digits only: ``\d`` would
#: take any script's (Arabic-Indic, fullwidth...), which no kernel prints.
_HCA_TYPE = re.compile(r"MT([0-9]{4,5})")


@attrs.frozen
class Hca:
    """One mock HCA (``mlx5_<index>``), every value as sysfs spells it."""

    index: int
    #: ``mlx5_<index>``
    name: str
    #: 64-bit node GUID (also the system image and port GUID)
    guid: int
    lid: int
    node_desc: str
    hca_type: str
    fw_version: str
    hw_rev: str
    board_id: str
    #: PCI device id (``0x1021`` for ``MT4129``)
    pci_device: int
    rate_gbps: int
    port_state: int
    phys_state: int

    @property
    def guid_text(self) -> str:
        """``a088:c203:0012:3456``: the spelling of ``node_guid``."""
        return _groups(self.guid.to_bytes(8, "big"))

    @property
    def gid0_text(self) -> str:
        """Port GID 0: link-local prefix + port GUID, in ``%pI6`` spelling."""
        return _groups(bytes.fromhex("fe80000000000000") + self.guid.to_bytes(8, "big"))

    @property
    def state_text(self) -> str:
        return f"{self.port_state}: {_name(PORT_STATES, self.port_state)}"

    @property
    def phys_state_text(self) -> str:
        return f"{self.phys_state}: {_name(PHYS_STATES, self.phys_state)}"

    @property
    def rate_text(self) -> str:
        return f"{self.rate_gbps} Gb/sec ({LINK_WIDTH}X {RATE_SPEEDS[self.rate_gbps]})"

    @property
    def modalias(self) -> str:
        """``pci:v..d..sv..sd..bc..sc..i..``: what the kernel prints (upper-case hex)."""
        cls = IB_PCI_CLASS
        return (
            f"pci:v{MELLANOX_PCI_VENDOR:08X}d{self.pci_device:08X}"
            f"sv{MELLANOX_PCI_VENDOR:08X}sd{SUBSYSTEM_DEVICE:08X}"
            f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}"
        )


def _groups(raw: bytes) -> str:
    return ":".join(raw[i : i + 2].hex() for i in range(0, len(raw), 2))


def _name(table: dict[str, int], number: int) -> str:
    return next(name for name, value in table.items() if value == number)


def _lookup(table: dict[str, int], value: str, where: str, problems: list[str]) -> int:
    """Case-insensitive name → number; a bad name adds a problem and returns 0."""
    folded = {name.lower(): number for name, number in table.items()}
    number = folded.get(value.strip().lower())
    if number is None:
        problems.append(f"{where}: {value!r}, expected one of {', '.join(table)}")
        return 0
    return number


def pci_device_id(hca_type: str) -> int | None:
    """``MT4129`` → ``0x1021``; ``None`` for a type that names no mlx5 device id."""
    match = _HCA_TYPE.fullmatch(hca_type.strip())
    if match is None:
        return None
    number = int(match.group(1))
    return number if number <= 0xFFFF else None


class TemplateRefused(ValueError):
    """A node description template that is not filled in; the message says why."""


def node_desc(template: str, node_name: str, index: int) -> str:
    """The template filled in, truncated to the 64 bytes IB carries.

    Only the plain fields ``{node_name}`` and ``{idx}`` (with an optional
    format spec such as ``{idx:02d}``) are allowed: attribute or index
    lookups (``{idx.real}``) raise ``ValueError``.  A format spec that would
    build more than a node description holds, and a result with a control
    character in it (``node_desc`` is one line that ``ibstat`` and SMPs
    show), raise ``TemplateRefused``.
    """
    problem = node_desc_template_problem(template)
    if problem is not None:
        raise TemplateRefused(problem)
    for _, field, _, _ in string.Formatter().parse(template):
        if field is not None and field not in ("node_name", "idx"):
            raise ValueError(f"unknown field {{{field}}}")
    text = template.format(node_name=node_name, idx=index)
    desc = text.encode()[:NODE_DESC_MAX].decode(errors="ignore")
    if CONTROL_RE.search(desc):
        raise TemplateRefused(
            f"{found(template)} fills in to {found(desc)} for mlx5_{index} on node "
            f"{found(node_name)}, expected one line without control characters"
        )
    return desc


def plan_hcas(state: State) -> tuple[Hca, ...]:
    """The state's HCAs (none without an ``infiniband`` block); ``SpecError`` lists all problems."""
    ib = state.infiniband
    if ib is None:
        return ()
    where = f"{state.profile_name}: infiniband"
    problems: list[str] = []
    device = pci_device_id(ib.hca_type)
    if device is None:
        problems.append(
            f"{where}.hca_type: {ib.hca_type!r}, expected an mlx5 part name MT<PCI device id "
            "in decimal> such as MT4123 (ConnectX-6), MT4129 (ConnectX-7), MT4131 (ConnectX-8)"
        )
    if ib.rate_gbps not in RATE_SPEEDS:
        problems.append(
            f"{where}.rate_gbps: {ib.rate_gbps}, expected one of "
            f"{', '.join(map(str, RATE_SPEEDS))} (EDR, HDR, NDR, XDR)"
        )
    if ib.link_layer.strip().lower() not in ("infiniband", "ib"):
        problems.append(
            f"{where}.link_layer: {ib.link_layer!r}, expected InfiniBand (Ethernet/RoCE ports "
            "need network devices, which the mock does not create)"
        )
    port_state = _lookup(PORT_STATES, ib.port_state, f"{where}.port_state", problems)
    phys_state = _lookup(PHYS_STATES, ib.phys_state, f"{where}.phys_state", problems)
    if len(ib.node_guids) != ib.hca_count:
        problems.append(
            f"{where}: {len(ib.node_guids)} node GUIDs for {ib.hca_count} HCAs, "
            "expected one per HCA"
        )
    problems += _attribute_problems(ib, where)
    guids = _parse_guids(ib, where, problems)
    descs = _node_descs(ib, state.node_name, where, problems)
    nodes = lids.fabric_nodes(state)
    problems += lids.check_fabric(nodes, ib.hca_count, where)
    if problems:
        raise SpecError(problems)
    assert device is not None
    node_lids = lids.node_lids(nodes, state.node_name, ib.hca_count)
    return tuple(
        Hca(
            index=i,
            name=f"mlx5_{i}",
            guid=guids[i],
            lid=node_lids[i],
            node_desc=descs[i],
            hca_type=ib.hca_type.strip(),
            fw_version=ib.fw_version.strip(),
            hw_rev=ib.hw_rev.strip(),
            board_id=ib.board_id.strip(),
            pci_device=device,
            rate_gbps=ib.rate_gbps,
            port_state=port_state,
            phys_state=phys_state,
        )
        for i in range(ib.hca_count)
    )


def _parse_guids(ib: Infiniband, where: str, problems: list[str]) -> list[int]:
    guids = []
    for i, text in enumerate(ib.node_guids):
        try:
            value = int(text, 16)
        except ValueError:
            value = -1
        if not 0 < value < 1 << 64:
            problems.append(f"{where}: node GUID {i} {text!r}, expected 0x + 16 hex digits")
            value = 0
        guids.append(value)
    return guids


def _attribute_problems(ib: Infiniband, where: str) -> list[str]:
    """Text written verbatim into sysfs that is not one line fitting its attribute.

    The profile refuses such text already; a state built another way is
    checked here, where the text is written.
    """
    problems = []
    for field, most in IB_ATTRIBUTE_MAX_BYTES.items():
        value = getattr(ib, field).strip()
        if CONTROL_RE.search(value) or len(value.encode()) > most:
            problems.append(
                f"{where}.{field}: {found(value)}, expected one line of at most {most} bytes"
            )
    return problems


def _node_descs(ib: Infiniband, node_name: str, where: str, problems: list[str]) -> list[str]:
    try:
        return [node_desc(ib.node_desc_template, node_name, i) for i in range(ib.hca_count)]
    except TemplateRefused as exc:
        problems.append(f"{where}.node_desc_template: {exc}")
        return []
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        problems.append(
            f"{where}.node_desc_template: {ib.node_desc_template!r} cannot be filled in "
            f"({exc!r}), expected text with only the fields {{node_name}} and {{idx}}"
        )
        return []
