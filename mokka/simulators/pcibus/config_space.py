"""The 256-byte PCI configuration space of a mock function (sysfs ``config``).

``lspci`` decodes a device from this file: ids, class, header type, and the
capability list, where the PCI Express capability carries the link
(``LnkCap``/``LnkSta`` in ``lspci -vv``).  Offsets follow the PCI Local Bus
and PCI Express Base specifications; only registers a reader can observe
are filled, everything else stays zero like an idle device.

Layout of what we write:

* type 0 header (GPU, NVSwitch): ids, command/status, class, subsystem ids
  at 0x2c/0x2e, capability pointer 0x40, interrupt pin A;
* type 1 header (switch downstream port): primary/secondary/subordinate bus
  numbers, empty I/O and memory windows (base above limit = disabled),
  capability pointer 0x40;
* 0x40: PCI Express capability, version 2 (endpoint, or downstream port
  for a bridge, which also reports "data link layer active");
* 0x80 (bridges only): Subsystem ID capability, where a type 1 header keeps
  its subsystem ids.
"""

from __future__ import annotations

import struct

from mokka.simulators.pcibus.hierarchy import PciFunction

CONFIG_SIZE = 256

#: Command register: memory space and bus master enabled (a bound device).
_COMMAND = 0x0006
#: Status register: "capabilities list" present.
_STATUS_CAP_LIST = 0x0010

_CAP_PCIE = 0x10
_CAP_SSVID = 0x0D
_PCIE_CAP_OFFSET = 0x40
_SSVID_CAP_OFFSET = 0x80

#: PCI Express capabilities register: version 2, device/port type in bits 7:4.
_PCIE_VERSION = 2
_PORT_TYPE_ENDPOINT = 0x0
_PORT_TYPE_DOWNSTREAM = 0x6

#: Device Capabilities: max payload 256 bytes (encoding 1), role-based
#: error reporting (bit 15) as every PCIe 1.1+ device sets.
_DEVCAP = 0x1 | (1 << 15)
#: Device Control: max payload 256 bytes (bits 7:5 = 1), max read request
#: 512 bytes (bits 14:12 = 2): the values Linux programs on these links.
_DEVCTL = (1 << 5) | (2 << 12)
#: Link Capabilities bit 20 / Link Status bit 13: "data link layer link
#: active" reporting, which downstream ports support and report.
_LNKCAP_DLL_ACTIVE = 1 << 20
_LNKSTA_DLL_ACTIVE = 1 << 13
#: Link Status bit 12: the link uses the slot's reference clock.
_LNKSTA_SLOT_CLOCK = 1 << 12


def _put16(buf: bytearray, offset: int, value: int) -> None:
    struct.pack_into("<H", buf, offset, value)


def _put32(buf: bytearray, offset: int, value: int) -> None:
    struct.pack_into("<I", buf, offset, value)


def _pcie_capability(buf: bytearray, fn: PciFunction, port_number: int, next_cap: int) -> None:
    base = _PCIE_CAP_OFFSET
    port_type = _PORT_TYPE_DOWNSTREAM if fn.is_bridge else _PORT_TYPE_ENDPOINT
    link = fn.link
    buf[base] = _CAP_PCIE
    buf[base + 1] = next_cap
    _put16(buf, base + 0x02, _PCIE_VERSION | (port_type << 4))
    _put32(buf, base + 0x04, _DEVCAP)
    _put16(buf, base + 0x08, _DEVCTL)
    lnkcap = link.max_gen | (link.max_width << 4) | ((port_number & 0xFF) << 24)
    lnksta = link.current_gen | (link.current_width << 4) | _LNKSTA_SLOT_CLOCK
    if fn.is_bridge:
        lnkcap |= _LNKCAP_DLL_ACTIVE
        lnksta |= _LNKSTA_DLL_ACTIVE
    _put32(buf, base + 0x0C, lnkcap)
    _put16(buf, base + 0x12, lnksta)
    # Link Capabilities 2: supported speeds vector, bit n = generation n.
    _put32(buf, base + 0x2C, ((1 << link.max_gen) - 1) << 1)
    # Link Control 2: target link speed = the maximum.
    _put16(buf, base + 0x30, link.max_gen)


def build_config(fn: PciFunction) -> bytes:
    """The function's configuration space (see the module docstring)."""
    buf = bytearray(CONFIG_SIZE)
    _put16(buf, 0x00, fn.vendor)
    _put16(buf, 0x02, fn.device)
    _put16(buf, 0x04, _COMMAND)
    _put16(buf, 0x06, _STATUS_CAP_LIST)
    buf[0x08] = 0x00  # revision
    # Class code, little-endian: programming interface, subclass, base class.
    buf[0x09] = fn.class_code & 0xFF
    buf[0x0A] = (fn.class_code >> 8) & 0xFF
    buf[0x0B] = (fn.class_code >> 16) & 0xFF
    buf[0x0E] = fn.header_type
    buf[0x34] = _PCIE_CAP_OFFSET
    buf[0x3C] = min(fn.irq, 0xFF)  # interrupt line
    buf[0x3D] = 0x01  # interrupt pin INTA#
    if fn.is_bridge:
        # The hierarchy sets both for every bridge.
        assert fn.primary_bus is not None
        assert fn.secondary_bus is not None
        buf[0x18] = fn.primary_bus
        buf[0x19] = fn.secondary_bus
        buf[0x1A] = fn.secondary_bus  # subordinate: nothing further down
        # Windows closed: base above limit.
        buf[0x1C] = 0xF0  # I/O base
        buf[0x1D] = 0x00  # I/O limit
        _put16(buf, 0x20, 0xFFF0)  # memory base
        _put16(buf, 0x22, 0x0000)  # memory limit
        _put16(buf, 0x24, 0xFFF1)  # prefetchable base (64-bit capable)
        _put16(buf, 0x26, 0x0001)  # prefetchable limit
        port_number = int(fn.bdf.split(":")[2].split(".")[0], 16)
        _pcie_capability(buf, fn, port_number, next_cap=_SSVID_CAP_OFFSET)
        buf[_SSVID_CAP_OFFSET] = _CAP_SSVID
        buf[_SSVID_CAP_OFFSET + 1] = 0x00
        _put16(buf, _SSVID_CAP_OFFSET + 4, fn.subsystem_vendor)
        _put16(buf, _SSVID_CAP_OFFSET + 6, fn.subsystem_device)
    else:
        _put16(buf, 0x2C, fn.subsystem_vendor)
        _put16(buf, 0x2E, fn.subsystem_device)
        _pcie_capability(buf, fn, port_number=0, next_cap=0)
    return bytes(buf)
