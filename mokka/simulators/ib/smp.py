"""Attribute payloads the mock fabric answers with, as bytes (IBA volume 1).

Subnet management (SMP data, 64 bytes): NodeDescription, NodeInfo,
SwitchInfo, PortInfo, SMInfo.  Performance management (data at MAD offset
64): ClassPortInfo and PortCounters.  Subnet administration: PathRecord
(what ``ibping -G`` asks the SM to turn a GUID into a LID).  Every field is
big-endian; sub-byte fields are packed by hand where they share a byte.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from mokka.simulators.ib.hca import LINK_WIDTH, MELLANOX_IB_VENDOR, RATE_SPEEDS
from mokka.simulators.ib.mad import METHOD_SET

# Attribute ids.
ATTR_CLASS_PORT_INFO = 0x0001
ATTR_NODE_DESC = 0x0010
ATTR_NODE_INFO = 0x0011
ATTR_SWITCH_INFO = 0x0012
ATTR_PORT_INFO = 0x0015
ATTR_LINEAR_FORWARDING_TABLE = 0x0019
ATTR_SM_INFO = 0x0020
ATTR_PORT_COUNTERS = 0x0012
ATTR_PATH_RECORD = 0x0035

NODE_TYPE_CA = 1
NODE_TYPE_SWITCH = 2
#: Port states and physical states as PortInfo encodes them.
PORT_DOWN = 1
PORT_ACTIVE = 4
PHYS_POLLING = 2
PHYS_LINK_UP = 5
#: SMInfo state MASTER.
SM_STATE_MASTER = 3
#: The default subnet prefix (link-local ``fe80::/64``).
SUBNET_PREFIX = 0xFE80000000000000

#: PortInfo LinkWidth encoding of 4X, LinkSpeed (SDR/DDR/QDR) and the
#: extended speeds (LinkSpeedExt: FDR 1, EDR 2, HDR 4, NDR 8; XDR is 16 in
#: the 5-bit enabled field but does not fit the 4-bit active one, so it is
#: reported as NDR).
WIDTH_4X = 2
assert LINK_WIDTH == 4
#: What a ConnectX port reports as supported and enabled: the standard sets
#: "1X or 4X" and "2.5 or 5.0 or 10.0 Gbps" (the extended speeds on top).
WIDTH_1X_4X = 3
SPEED_QDR = 4
SPEEDS_SDR_DDR_QDR = 7
SPEED_EXT = {"EDR": 2, "HDR": 4, "NDR": 8, "XDR": 8}
#: PortInfo CapabilityMask of a switch's port 0 (IsSM | IsSMdisabled clear;
#: IsTrapSupported, IsExtendedSpeedsSupported).
SWITCH_CAP_MASK = 0x00004848
#: The SM's capability bit: set on the spine's port 0.
CAP_IS_SM = 0x00000002
#: MTU 4096 (5); VLCap VL0-7 (4).
MTU_4096 = 5
VL_CAP_8 = 4

#: PerfMgt ClassPortInfo CapabilityMask: PortXmitWait supported (bit 12).
PERF_CAP_XMIT_WAIT = 1 << 12

#: PortCounters: (sysfs counter name, byte offset in the attribute, bytes)
#: for the whole-byte counters; the two 4-bit ones are packed separately.
PORT_COUNTER_FIELDS = (
    ("symbol_error", 4, 2),
    ("link_error_recovery", 6, 1),
    ("link_downed", 7, 1),
    ("port_rcv_errors", 8, 2),
    ("port_rcv_remote_physical_errors", 10, 2),
    ("port_rcv_switch_relay_errors", 12, 2),
    ("port_xmit_discards", 14, 2),
    ("port_xmit_constraint_errors", 16, 1),
    ("port_rcv_constraint_errors", 17, 1),
    ("VL15_dropped", 22, 2),
    ("port_xmit_data", 24, 4),
    ("port_rcv_data", 28, 4),
    ("port_xmit_packets", 32, 4),
    ("port_rcv_packets", 36, 4),
    ("port_xmit_wait", 40, 4),
)


def _u(value: int, size: int) -> bytes:
    """Big-endian, saturating (a counter past its width reads all ones, as in IB)."""
    return min(max(value, 0), (1 << (8 * size)) - 1).to_bytes(size, "big")


def node_description(text: str) -> bytes:
    return text.encode()[:64].ljust(64, b"\0")


@attrs.frozen(kw_only=True)
class NodeFacts:
    """What NodeInfo says about a node (a CA or a switch)."""

    node_type: int
    num_ports: int
    guid: int
    device_id: int
    revision: int = 0


def node_info(node: NodeFacts, local_port: int, port_guid: int | None = None) -> bytes:
    """NodeInfo; ``local_port`` is the port the SMP arrived on."""
    data = bytearray(64)
    data[0], data[1], data[2], data[3] = 1, 1, node.node_type, node.num_ports
    data[4:12] = node.guid.to_bytes(8, "big")  # system image GUID
    data[12:20] = node.guid.to_bytes(8, "big")
    data[20:28] = (port_guid if port_guid is not None else node.guid).to_bytes(8, "big")
    data[28:30] = _u(64, 2)  # PartitionCap
    data[30:32] = _u(node.device_id, 2)
    data[32:36] = _u(node.revision, 4)
    data[36] = local_port & 0xFF
    data[37:40] = MELLANOX_IB_VENDOR.to_bytes(3, "big")
    return bytes(data)


@attrs.frozen(kw_only=True)
class PortFacts:
    """What PortInfo says about one port."""

    lid: int = 0
    sm_lid: int
    cap_mask: int = 0
    local_port: int
    state: int
    phys_state: int
    rate_gbps: int


def port_info(port: PortFacts) -> bytes:
    data = bytearray(64)
    data[8:16] = SUBNET_PREFIX.to_bytes(8, "big")
    data[16:18] = _u(port.lid, 2)
    data[18:20] = _u(port.sm_lid, 2)
    data[20:24] = _u(port.cap_mask, 4)
    data[28] = port.local_port & 0xFF
    data[29] = data[30] = WIDTH_1X_4X  # LinkWidthEnabled, LinkWidthSupported
    data[31] = WIDTH_4X  # LinkWidthActive
    data[32] = (SPEEDS_SDR_DDR_QDR << 4) | port.state  # LinkSpeedSupported | PortState
    data[33] = (port.phys_state << 4) | 2  # PhysState | LinkDownDefaultState Polling
    data[35] = (SPEED_QDR << 4) | SPEEDS_SDR_DDR_QDR  # LinkSpeedActive | LinkSpeedEnabled
    data[36] = (MTU_4096 << 4) | 0  # NeighborMTU | MasterSMSL
    data[37] = (VL_CAP_8 << 4) | 0  # VLCap | InitType
    data[41] = MTU_4096  # InitTypeReply | MTUCap
    data[43] = VL_CAP_8 << 4  # OperationalVLs
    data[50] = 1  # GUIDCap
    data[51] = 18  # SubnetTimeOut
    data[52] = 16  # RespTimeValue
    ext = SPEED_EXT.get(RATE_SPEEDS.get(port.rate_gbps, "EDR"), 2)
    data[62] = (ext << 4) | ext  # LinkSpeedExtActive | Supported
    data[63] = ext & 0x1F  # LinkSpeedExtEnabled
    return bytes(data)


#: A linear forwarding table entry that leads nowhere.
NO_PORT = 0xFF
#: LIDs per LinearForwardingTable block.
LFT_BLOCK = 64


def switch_info(num_ports: int, lft_top: int) -> bytes:
    """SwitchInfo; ``lft_top`` is the highest LID the forwarding table routes."""
    data = bytearray(64)
    data[0:2] = _u(0xC000, 2)  # LinearFDBCap
    data[4:6] = _u(0x4000, 2)  # MulticastFDBCap
    data[6:8] = _u(lft_top, 2)  # LinearFDBTop
    data[11] = 0x40 | 18  # PortStateChange clear, LifeTimeValue 18
    data[12:14] = _u(1, 2)  # LIDsPerPort
    data[14:16] = _u(32, 2)  # PartitionEnforcementCap
    data[16] = 0xF0  # Inbound/Outbound enforcement and raw filter capable
    return bytes(data)


def sm_info(guid: int, priority: int = 15) -> bytes:
    data = bytearray(64)
    data[0:8] = guid.to_bytes(8, "big")
    data[16:20] = _u(0, 4)  # ActCount
    data[20] = (priority << 4) | SM_STATE_MASTER
    return bytes(data)


def perf_class_port_info() -> bytes:
    data = bytearray(192)
    data[0], data[1] = 1, 1  # BaseVersion, ClassVersion
    data[2:4] = _u(PERF_CAP_XMIT_WAIT, 2)
    data[4:8] = _u(18, 4)  # CapabilityMask2 0, RespTimeValue 18
    return bytes(data)


def port_counters(port_select: int, counters: Mapping[str, int]) -> bytes:
    """PortCounters from counter values named as sysfs names them."""
    data = bytearray(192)
    data[1] = port_select & 0xFF
    data[2:4] = b"\xff\xff"  # CounterSelect: every counter
    for name, offset, size in PORT_COUNTER_FIELDS:
        data[offset : offset + size] = _u(counters.get(name, 0), size)
    local = min(counters.get("local_link_integrity_errors", 0), 15)
    overrun = min(counters.get("excessive_buffer_overrun_errors", 0), 15)
    data[19] = (local << 4) | overrun
    return bytes(data)


#: CounterSelect bit → counter (sysfs name) of a PortCounters Set; bits
#: 12..15 are the data and packet counters, CounterSelect2 bit 0 PortXmitWait.
COUNTER_SELECT = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
    "port_xmit_constraint_errors", "port_rcv_constraint_errors",
    "local_link_integrity_errors", "excessive_buffer_overrun_errors", "VL15_dropped",
    "port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets",
)


def is_counter_reset(request: bytes) -> bool:
    """A PerfMgt Set of PortCounters (what ``perfquery -R`` sends)."""
    return request[3] == METHOD_SET and int.from_bytes(request[16:18], "big") == ATTR_PORT_COUNTERS


def selected_counters(request: bytes) -> list[str]:
    """The counters a PortCounters Set selects (CounterSelect, CounterSelect2)."""
    data = request[64:]
    select = int.from_bytes(data[2:4], "big")
    names = [name for bit, name in enumerate(COUNTER_SELECT) if select >> bit & 1]
    if data[18] & 1:
        names.append("port_xmit_wait")
    return names


def path_record(dgid: bytes, sgid: bytes, dlid: int, slid: int, rate_gbps: int) -> bytes:
    """A PathRecord from ``sgid``/``slid`` to ``dgid``/``dlid`` (64 bytes)."""
    data = bytearray(64)
    data[8:24] = dgid
    data[24:40] = sgid
    data[40:42] = _u(dlid, 2)
    data[42:44] = _u(slid, 2)
    data[44:48] = _u(64, 4)  # RawTraffic 0, FlowLabel 0, HopLimit 64
    data[49] = 0x80 | 1  # Reversible, NumbPath 1
    data[50:52] = b"\xff\xff"  # P_Key
    data[54] = (2 << 6) | MTU_4096  # exactly 4096
    data[55] = (2 << 6) | _rate_code(rate_gbps)
    data[56] = (2 << 6) | 18  # PacketLifeTime
    return bytes(data)


def _rate_code(rate_gbps: int) -> int:
    """The PathRecord Rate code (``enum ib_rate``): 100 Gb/s 16, 200 17,
    400 21, 800 23."""
    return {100: 16, 200: 17, 400: 21, 800: 23}.get(rate_gbps, 16)
