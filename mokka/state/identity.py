"""Per-node identities: GPU UUIDs, serial numbers, InfiniBand node GUIDs.

The earlier mock shipped the profile's UUIDs on every node, so a cluster of
mock nodes had many GPUs with one UUID, which breaks every consumer that
keys on it (the device plugin, DRA's ResourceSlices, DCGM).  Here each
identity is a hash of the node name and the device's slot:

* deterministic: a restarted pod (same node name) gets the same identities,
  so allocations recorded by the kubelet stay valid;
* distinct across nodes: the hash differs for every node name;
* shaped like the real thing: ``GPU-`` plus a lower-case 8-4-4-4-12 UUID,
  13-digit serials, ``0x`` + 16 hex digit GUIDs.

A profile-given value is a template, not a value to copy: its leading part
(the first UUID group, the first digits of a serial, the OUI of an IB GUID
prefix) is kept so a node still "looks like" the profile, and the rest is
derived.  Each kind of identity hashes under its own label, so a UUID and a
serial never share hash bits.
"""

from __future__ import annotations

import hashlib
import re

#: Leading serial digits kept from a profile's serial (the product-line part).
SERIAL_PREFIX_DIGITS = 3
SERIAL_DIGITS = 13
#: Mellanox's OUI, for profiles that give no IB GUID prefix.
DEFAULT_IB_OUI = "a088c2"


def _digest(kind: str, node_name: str, slot: int) -> bytes:
    # NUL separators: node names cannot contain one, so no two (name, slot)
    # pairs produce the same input.
    return hashlib.sha256(f"mokka\0{kind}\0{node_name}\0{slot}".encode()).digest()


def gpu_uuid(node_name: str, slot: int, template: str | None = None) -> str:
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` for GPU ``slot`` on ``node_name``.

    With a template (``GPU-b200b200-…``), its first group is kept: 32 bits
    of style, 96 bits of hash, still no collision in any realistic cluster.
    """
    hexdigits = _digest("gpu-uuid", node_name, slot).hex()[:32]
    if template:
        match = re.match(r"^GPU-([0-9a-fA-F]{8})-", template)
        if match:
            hexdigits = match.group(1).lower() + hexdigits[8:]
    h = hexdigits
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_serial(node_name: str, slot: int, template: str | None = None) -> str:
    """A 13-digit board serial; keeps the template's first digits when it has them."""
    number = int.from_bytes(_digest("gpu-serial", node_name, slot)[:16], "big")
    prefix = ""
    if template:
        # ASCII digits: ``\D`` would keep other scripts' digits (``٣``) in a serial
        digits = re.sub(r"[^0-9]", "", template)
        prefix = digits[:SERIAL_PREFIX_DIGITS]
    rest = SERIAL_DIGITS - len(prefix)
    return prefix + f"{number % 10**rest:0{rest}d}"


def ib_node_guid(node_name: str, slot: int, prefix: str | None = None) -> str:
    """``0x`` + 16 hex digits: the OUI (3 bytes, from ``prefix``) and 5 hashed bytes."""
    oui = DEFAULT_IB_OUI
    if prefix:
        digits = re.sub(r"[^0-9a-fA-F]", "", prefix).lower()
        if len(digits) >= 6:
            oui = digits[:6]
    tail = _digest("ib-node-guid", node_name, slot)[:5].hex()
    return f"0x{oui}{tail}"


def ib_node_guids(node_name: str, count: int, prefix: str | None = None) -> tuple[str, ...]:
    return tuple(ib_node_guid(node_name, slot, prefix) for slot in range(count))
