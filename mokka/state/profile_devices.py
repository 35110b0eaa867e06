"""A GPU profile's devices: ``devices[]`` merged over ``device_defaults``, and checked.

``mokka.state.profile`` owns the profile as a whole (its top level,
``system``, reading it); ``mokka.state.profile_blocks`` the node-level
blocks around the GPUs.  This module owns the per-GPU part, which follows
different rules from both: device fields are open (the engine config
carries them to the mock library, which knows many more than the daemon
does), so only the fields the daemon itself reads are type-checked and
the rest pass through untouched; and each field is checked in the layer
that wrote it, so a bad default is reported once, not once per GPU.

Like the rest of the profile, every problem is recorded in ``Problems``
and what could be built is returned, so one run reports all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from mokka.state import checks
from mokka.state.checks import Problems, sub
from mokka.state.device_checks import (
    FABRIC_STATES,
    check_dynamics,
    check_fabric,
    check_failure,
    check_pcie_link,
    check_xid_list,
    pcie_link_problem,
)

#: Highest minor number of a GPU's ``/dev/nvidia<minor>`` (the driver's
#: ``NV_MINOR_DEVICE_NUMBER_REGULAR_MAX``): 254 is ``nvidia-modeset``'s and 255
#: ``nvidiactl``'s.  The driver's device nodes (``gpudriver.devices``) use this one.
MAX_GPU_MINOR = 253

#: Integer device fields the daemon or the engine config relies on, checked
#: when present (``>= 0``).  Everything else under these blocks passes through.
_DEVICE_INTS = {
    "memory": ("total_bytes", "reserved_bytes", "free_bytes", "used_bytes"),
    "bar1_memory": ("total_bytes", "free_bytes", "used_bytes"),
    "power": ("default_limit_mw", "enforced_limit_mw", "min_limit_mw", "max_limit_mw"),
    "clocks": ("graphics_max", "sm_max", "memory_max", "video_max"),
}


#: ``encoder``'s keys: how many NVENC engines the chip has, and the codecs they encode.
ENCODER_KEYS = ("engines", "codecs")
#: The codecs NVML asks the encoder about (``nvmlEncoderType_t``: H264, HEVC,
#: AV1), in the words ``native/nvml/encoder.c`` reads.
ENCODER_CODECS = ("h264", "hevc", "av1")


@attrs.frozen(kw_only=True)
class DeviceSpec:
    """One ``devices[]`` entry merged over ``device_defaults``.

    The typed attributes are what the compiler needs to place and name the
    GPU; everything else stays in ``config`` for the engine config.
    """

    #: NVML's device index: the join key of overrides (``devices["0"]``),
    #: ``num_devices`` and the identity hash; not necessarily the list position.
    index: int
    #: Position in the ``devices`` list (error messages name it).
    position: int
    #: The profile's UUID: a template for the per-node one (``mokka.state.identity``).
    uuid: str | None
    #: The profile's serial: a template, like ``uuid``.
    serial: str | None
    #: ``/dev/nvidia<minor>``; defaults to the index.
    minor_number: int
    #: Canonical lower-case ``dddd:bb:dd.f``.
    bus_id: str
    #: Grace CPU this GPU pairs with over C2C (GB200/GB300); ``None`` elsewhere.
    grace_cpu_pair: int | None
    #: The merged raw device config (``device_defaults`` < entry), numbers normalized.
    config: Mapping[str, Any] = attrs.field(eq=False, repr=False)


#: Fields every merged device needs: (path, what is expected).  Neither has a
#: sensible default: every consumer shows the name, and the PCI tree, NFD
#: and NVML's PCI info all need the device id.
_REQUIRED = (
    ("name", 'the product name, e.g. "NVIDIA H100 80GB HBM3"'),
    ("pci.device_id", "(device << 16) | vendor, e.g. 0x233010DE"),
)


def parse_devices(p: Problems, top: Mapping[str, Any]) -> list[DeviceSpec]:
    """``devices[]`` merged over ``device_defaults``.

    Each layer is type-checked on its own, so a bad default is reported once
    (under ``device_defaults``) rather than once per device; what every GPU
    must have is checked on the merged result.  A required field missing
    from every device is reported once, under ``device_defaults``, where it
    is usually meant to live.  Index, minor number and bus id must each be
    unique across devices; a broken device is left out so the rest can be
    checked, and the list is empty whenever a required field is missing.
    """
    defaults: dict[str, Any] = {}
    if top.get("device_defaults") is not None:
        defaults = checks.as_mapping(p, "device_defaults", top["device_defaults"]) or {}
        _device_fields(p, "device_defaults", defaults)
    raw = checks.require(p, "", top, "devices",
                         "a list of device entries with index and pci.bus_id")
    entries = checks.as_list(p, "devices", raw) if raw is not None else None
    if entries is None:
        return []
    if not entries:
        p.add("devices", "empty list, expected at least one device")
    result: list[DeviceSpec] = []
    # required path -> the devices missing it; value -> first position using it
    missing: dict[str, list[str]] = {}
    seen: dict[str, dict[Any, int]] = {"index": {}, "minor_number": {}, "pci.bus_id": {}}
    for pos, entry in enumerate(entries):
        path = sub("devices", pos)
        entry_map = checks.as_mapping(p, path, entry)
        if entry_map is None:
            continue
        merged = checks.deep_merge(defaults, entry_map)
        for key, _ in _REQUIRED:
            if _lookup(merged, key) is None:
                missing.setdefault(key, []).append(path)
        spec = _device(p, path, pos, entry_map, merged)
        if spec is None:
            continue
        index_repeats = spec.index in seen["index"]
        for what, value in (("index", spec.index), ("minor_number", spec.minor_number),
                            ("pci.bus_id", spec.bus_id)):
            if value not in seen[what]:
                seen[what][value] = pos
            elif not (what == "minor_number" and index_repeats
                      and merged.get("minor_number") is None):
                # (a minor derived from a repeated index is that same mistake, reported once)
                p.add(sub(path, what), f"{value!r} repeats devices[{seen[what][value]}], "
                      "expected a unique value per device")
        result.append(spec)
    for key, expected in _REQUIRED:
        paths = missing.get(key, [])
        if paths and len(paths) == len(entries):
            p.add(sub("device_defaults", key),
                  f"missing (and in every device), expected {expected}")
        else:
            for path in paths:
                p.add(sub(path, key), f"missing, expected {expected}")
    # No devices at all when one lacks a required field: ``parse_roots`` then skips
    # its cross-check instead of calling every listed bus id undeclared.
    return result if not missing else []


def _lookup(mapping: Mapping[str, Any], dotted: str) -> Any:
    """``mapping["a"]["b"]`` for ``"a.b"``; ``None`` when a step is missing or not a mapping."""
    value: Any = mapping
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _device(
    p: Problems, path: str, pos: int, entry: Mapping[str, Any], merged: Mapping[str, Any]
) -> DeviceSpec | None:
    """One device entry; ``None`` when it (``entry``) or its merged config has a problem.

    ``index`` must be on the entry itself: a default index would give every
    GPU the same one.  The bus id may come from either layer; the fabric
    ``state`` is checked here on the merged config, since either layer may
    hold it (``check_fabric`` runs with ``partial=True`` per layer).
    """
    before = len(p.items)
    index = checks.require(p, path, entry, "index", "the device index (an integer >= 0)")
    if index is not None:
        index = checks.as_int(p, sub(path, "index"), index, lo=0)
    _device_fields(p, path, entry)
    bus_id = _lookup(merged, "pci.bus_id")
    if bus_id is None:
        p.add(sub(path, "pci.bus_id"), "missing, expected a PCI address DDDD:BB:DD.F")
    fabric = merged.get("fabric")
    if isinstance(fabric, Mapping) and fabric.get("state") is None:
        p.add(sub(path, "fabric.state"), f"missing, expected one of: {', '.join(FABRIC_STATES)}")
    encoder = merged.get("encoder")
    for key in ENCODER_KEYS if isinstance(encoder, Mapping) else ():
        if encoder.get(key) is None:
            p.add(sub(path, f"encoder.{key}"), f"missing, expected {_ENCODER_EXPECTED[key]}")
    # ``minor_number: null`` is no minor number: the index stands in for it,
    # and must then be a valid minor itself (255 is nvidiactl's).
    minor = merged.get("minor_number")
    if minor is None and index is not None and index > MAX_GPU_MINOR:
        p.add(sub(path, "index"), f"{index} is also the minor number (no minor_number given), "
              f"expected 0..{MAX_GPU_MINOR} or a minor_number")
    if len(p.items) > before or index is None or bus_id is None:
        return None
    # Both values may come from ``device_defaults``, whose problems are
    # reported under that name, before ``before`` was taken: a device that
    # inherits a bad one is left out here rather than crashing on it.
    if minor is not None and (isinstance(minor, bool) or not isinstance(minor, int)
                              or not 0 <= minor <= MAX_GPU_MINOR):
        return None
    try:
        bdf = checks.canonical_bdf(bus_id) if isinstance(bus_id, str) else None
    except ValueError:
        bdf = None
    if bdf is None:
        return None
    # YAML reads an unquoted serial like 1654922000000 as an int; keep its digits.
    serial = merged.get("serial")
    return DeviceSpec(
        index=index, position=pos, uuid=merged.get("uuid"),
        serial=None if serial is None else str(serial),
        minor_number=index if minor is None else minor, bus_id=bdf,
        grace_cpu_pair=merged.get("grace_cpu_pair"), config=merged,
    )


def _device_fields(p: Problems, path: str, cfg: Mapping[str, Any]) -> None:
    """Type-check the device fields the daemon reads, where present; others pass through.

    Called once per layer (``device_defaults``, then each entry), so every
    problem is reported where it was written.  Nothing is required here;
    presence is the merged config's business (``parse_devices``, ``_device``).
    Every string of the block, passed through or not, goes to the engine
    config, so each is checked to fit one line there.
    """
    # (``failure`` has every field of its own typed below, and no other)
    checks.check_text_leaves(p, path, cfg, max_bytes=checks.TEXT_VALUE_MAX_BYTES,
                             checked=frozenset({sub(path, "uuid"), sub(path, "pci.bus_id"),
                                                sub(path, "failure")}))
    if cfg.get("uuid") is not None:
        checks.as_match(p, sub(path, "uuid"), cfg["uuid"], checks.GPU_UUID_RE,
                        "a GPU UUID GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
    serial = cfg.get("serial")
    # a number is a fine serial (see ``_device``); anything else must be text
    # (a value of no plain type, bytes say, is refused above already)
    if serial is not None and (isinstance(serial, bool) or not isinstance(serial, int)) \
            and checks.is_plain(serial):
        checks.as_str(p, sub(path, "serial"), serial)
    if cfg.get("minor_number") is not None:
        checks.as_int(p, sub(path, "minor_number"), cfg["minor_number"], lo=0, hi=MAX_GPU_MINOR)
    if cfg.get("board_id") is not None:
        # nvmlDeviceGetBoardId's unsigned int, reported as the profile writes it
        checks.as_int(p, sub(path, "board_id"), cfg["board_id"], lo=0, hi=0xFFFFFFFF)
    if cfg.get("grace_cpu_pair") is not None:
        checks.as_int(p, sub(path, "grace_cpu_pair"), cfg["grace_cpu_pair"], lo=0)
    for key in ("name", "brand", "architecture"):
        if cfg.get(key) is not None and checks.is_plain(cfg[key]):
            checks.as_str(p, sub(path, key), cfg[key])
    pci = cfg.get("pci")
    if pci is not None and (pci_map := checks.as_mapping(p, sub(path, "pci"), pci)) is not None:
        if pci_map.get("bus_id") is not None:
            checks.as_bdf(p, sub(path, "pci.bus_id"), pci_map["bus_id"])
        for key in ("device_id", "subsystem_id"):
            if pci_map.get(key) is not None:
                # 32 bits: (device << 16) | vendor, NVML's packing (0x233010DE)
                checks.as_int(p, sub(path, f"pci.{key}"), pci_map[key], lo=0, hi=0xFFFFFFFF)
    cc = cfg.get("compute_capability")
    if cc is not None and (cc_map := checks.as_mapping(p, sub(path, "compute_capability"), cc)):
        for key in ("major", "minor"):
            if cc_map.get(key) is not None:
                checks.as_int(p, sub(path, f"compute_capability.{key}"), cc_map[key], lo=0)
    for block, keys in _DEVICE_INTS.items():
        if cfg.get(block) is None:
            continue
        block_map = checks.as_mapping(p, sub(path, block), cfg[block])
        for key in keys if block_map else ():
            if block_map.get(key) is not None:
                checks.as_int(p, sub(path, f"{block}.{key}"), block_map[key], lo=0,
                              hi=checks.U64_MAX)
    platform = cfg.get("platform")
    pf = checks.as_mapping(p, sub(path, "platform"), platform) if platform is not None else None
    if pf and pf.get("module_id") is not None:
        checks.as_int(p, sub(path, "platform.module_id"), pf["module_id"], lo=0)
    if cfg.get("pcie") is not None:
        check_pcie_link(p, sub(path, "pcie"), cfg["pcie"])
        _check_host_link_gen(p, sub(path, "pcie"), cfg["pcie"])
    if cfg.get("encoder") is not None:
        _check_encoder(p, sub(path, "encoder"), cfg["encoder"])
    if cfg.get("fabric") is not None:
        check_fabric(p, sub(path, "fabric"), cfg["fabric"], partial=True)
    if cfg.get("failure") is not None:
        check_failure(p, sub(path, "failure"), cfg["failure"])
    if cfg.get("xids") is not None:
        check_xid_list(p, sub(path, "xids"), cfg["xids"])
    if cfg.get("dynamics") is not None:
        check_dynamics(p, sub(path, "dynamics"), cfg["dynamics"])



def _check_host_link_gen(p: Problems, path: str, pcie: Any) -> None:
    """``pcie.max_host_link_gen``: the host side's top generation, a generation like the
    link's own (it may be below the link's: a GB300 reports Gen 6 links and host Gen 4)."""
    value = pcie.get("max_host_link_gen") if isinstance(pcie, Mapping) else None
    if value is not None and (problem := pcie_link_problem("max_link_gen", value)) is not None:
        p.add(sub(path, "max_host_link_gen"), problem)


_ENCODER_EXPECTED = {
    "engines": "the number of NVENC engines (an integer >= 1)",
    "codecs": f"a list of the codecs NVENC encodes, of: {', '.join(ENCODER_CODECS)}",
}


def _check_encoder(p: Problems, path: str, value: Any) -> None:
    """``encoder``: the board's NVENC, per layer (presence is ``_device``'s check).

    A board without NVENC has no ``encoder`` block; one with it encodes at
    least one codec, each named once.
    """
    encoder = checks.as_mapping(p, path, value)
    if encoder is None:
        return
    checks.check_keys(p, path, encoder, ENCODER_KEYS)
    if encoder.get("engines") is not None:
        checks.as_int(p, sub(path, "engines"), encoder["engines"], lo=1, hi=0xFFFFFFFF)
    if encoder.get("codecs") is None:
        return
    codecs = checks.as_list(p, sub(path, "codecs"), encoder["codecs"])
    if codecs is not None and not codecs:
        p.add(sub(path, "codecs"), f"empty list, expected {_ENCODER_EXPECTED['codecs']}")
    seen: set[str] = set()
    for pos, codec in enumerate(codecs or ()):
        item = sub(sub(path, "codecs"), pos)
        word = checks.as_choice(p, item, codec, ENCODER_CODECS)
        if word is None:
            continue
        if word in seen:
            p.add(item, f"{codec!r} repeats an earlier codec, expected each codec once")
        seen.add(word)
