"""The GPU profile: the upstream mock-NVML schema, parsed and validated.

A profile describes one node's GPUs: ``system`` (driver and CUDA versions),
``device_defaults`` (a full device config), ``devices`` (per-GPU entries
deep-merged over the defaults), ``nvlink``, ``pcie_topology`` and
``infiniband``.  Profiles written for the earlier shell-based mock load
unchanged: this module accepts every shape they use (Grace pairs and
platform blocks, several PCIe roots, NVSwitch lists, IB blocks, Helm's
re-rendered key order and exponent-form numbers).

Strictness follows what the daemon reads.  Unknown keys are rejected at the
top level and in ``system``, ``nvlink``, ``pcie_topology`` and
``infiniband``, because a typo there silently changes the node.  Device
fields are open: the engine config carries them to the mock library, which
knows many more than the daemon does, so only the ones the daemon itself
reads are type-checked and the rest pass through untouched.

``Profile.from_mapping(doc, source=...)`` is the named constructor over
``yaml.safe_load`` output; ``load_profile`` reads a built-in or a file.

Every section is checked even after an earlier one failed, and every
problem is reported at once (``checks.Problems``): a profile is usually
fixed in one sitting, and one problem per rollout would make every fix a
round trip.  What this module does not decide is per-node: UUIDs and serials
here are templates (``mokka.state.identity``), ``num_devices`` is applied
by the compiler, and the PCI roots a GPU ends up under are settled there.
"""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mokka.errors import SpecError
from mokka.state import checks
from mokka.state.checks import Problems, sub
from mokka.state.device_checks import (
    FABRIC_STATES,
    check_dynamics,
    check_fabric,
    check_failure,
    check_xid_list,
)
from mokka.state.profile_blocks import (
    InfinibandSpec,
    NvlinkSpec,
    RootSpec,
    parse_infiniband,
    parse_nvlink,
    parse_roots,
)
from mokka.state.reader import load_yaml, read_input

#: Built-in profiles shipped in ``mokka/state/profiles``.  A name is matched
#: before any path: ``--profile h100`` is the built-in even if the working
#: directory holds a file called ``h100``.
BUILTIN_PROFILES: tuple[str, ...] = ("a100", "b200", "gb200", "gb300", "h100", "l40s", "t4")
#: The profile the daemon uses when none is given: the most common shape
#: consumers (device plugin, GFD, DRA) are tested against.
DEFAULT_PROFILE = "h100"

# Allowed keys per strict block: every key of the upstream schema, so its
# profiles load unchanged, and (``cpulist`` aside) nothing more, so a typo
# is an error.
TOP_LEVEL_KEYS = (
    "version", "system", "device_defaults", "devices", "nvlink", "pcie_topology",
    "infiniband",
    # upstream's per-profile defaults of the dynamic metrics generator
    "dynamic_metrics_defaults",
)
SYSTEM_KEYS = (
    "driver_version", "nvml_version", "cuda_version", "cuda_version_major",
    "cuda_version_minor", "num_devices",
)
#: ``re.ASCII``: ``\d`` would otherwise take any script's digits (``٥٨٠``),
#: which GFD and every other parser of the version refuse.
DRIVER_VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?$", re.ASCII)
#: ``major.minor``, as ``nvidia-smi`` prints "CUDA Version: 13.0".
CUDA_VERSION_RE = re.compile(r"^(\d+)\.(\d+)$", re.ASCII)
#: Highest minor number of a GPU's ``/dev/nvidia<minor>``: 255 is ``nvidiactl``'s.
MAX_GPU_MINOR = 254

#: Integer device fields the daemon or the engine config relies on, checked
#: when present (``>= 0``).  Everything else under these blocks passes through.
_DEVICE_INTS = {
    "memory": ("total_bytes", "reserved_bytes", "free_bytes", "used_bytes"),
    "bar1_memory": ("total_bytes", "free_bytes", "used_bytes"),
    "power": ("default_limit_mw", "enforced_limit_mw", "min_limit_mw", "max_limit_mw"),
    "clocks": ("graphics_max", "sm_max", "memory_max", "video_max"),
}


@attrs.frozen(kw_only=True)
class SystemSpec:
    """``system``: what the driver reports about itself.

    Only ``driver_version`` and a CUDA version are required; ``nvml_version``
    defaults to what a real driver of that version reports, ``num_devices``
    to every device.
    """

    #: ``nvmlSystemGetDriverVersion``; 2-3 dot-separated numbers (GFD parses it).
    driver_version: str
    #: ``nvmlSystemGetNVMLVersion``; defaults to ``<cuda major>.<driver_version>``.
    nvml_version: str
    #: The CUDA version the driver supports; NVML reports it as
    #: ``major * 1000 + minor * 10`` (``nvmlSystemGetCudaDriverVersion_v2``).
    cuda_version_major: int
    cuda_version_minor: int
    #: Expose only the first N devices (by index); ``None``: all of them.
    num_devices: int | None = None


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


@attrs.frozen(kw_only=True)
class Profile:
    """A validated profile; ``document`` is the whole normalized mapping.

    ``document`` is what the content hash covers and what the state keeps as
    ``profile_fields``, so a change to any key, typed here or not, is a new
    generation.  Equality ignores it (it is large); compare the compiled
    states' content hashes instead.
    """

    #: Where it came from: the built-in name or the path, as given.
    name: str
    version: str
    system: SystemSpec
    #: In the order the profile lists them; ``selected_devices`` sorts.
    devices: tuple[DeviceSpec, ...]
    #: ``None``: the profile has no ``nvlink`` block (PCIe-only boards).
    nvlink: NvlinkSpec | None = None
    #: The ``pcie_topology`` roots as written; the compiler places GPUs that
    #: none of them lists under a default root of their domain.
    roots: tuple[RootSpec, ...] = ()
    #: ``None``: no block, or ``enabled: false``.
    infiniband: InfinibandSpec | None = None
    document: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)

    @classmethod
    def from_mapping(cls, doc: Any, *, source: str, name: str | None = None) -> Profile:
        """Validate ``yaml.safe_load`` output; raises ``SpecError`` listing every problem.

        ``source`` names the input in messages (``h100.yaml`` or a path);
        ``name`` is what the state reports as its profile, ``source`` when
        not given.
        """
        p = Problems(source)
        top = checks.as_mapping(p, "(document)", doc)
        if top is None:
            p.raise_if_any()
        assert top is not None
        top = checks.normalize_numbers(top)
        checks.check_keys(p, "", top, TOP_LEVEL_KEYS)
        # Each part records its own problems and returns None (or what it
        # could parse), so all of them run before anything is raised.
        version = _version(p, top)
        system = _system(p, top)
        devices = _devices(p, top)
        nvlink = parse_nvlink(p, top.get("nvlink"))
        # after the devices: a root may only list bus ids they declare
        roots = parse_roots(p, top.get("pcie_topology"), devices)
        infiniband = parse_infiniband(p, top.get("infiniband"))
        num = system.num_devices if system is not None else None
        if num is not None and devices and num > len(devices):
            p.add("system.num_devices", f"{num} is more than the {len(devices)} devices "
                  f"declared, expected at most {len(devices)}")
        p.raise_if_any()
        assert system is not None
        assert version is not None
        return cls(
            name=name or source, version=version, system=system, devices=tuple(devices),
            nvlink=nvlink, roots=tuple(roots), infiniband=infiniband, document=top,
        )

    def selected_devices(self) -> tuple[DeviceSpec, ...]:
        """The devices this node exposes: all, or the first ``system.num_devices`` by index.

        Sorted by index whatever the list order, so the state and the engine
        config list GPUs in the order NVML numbers them.
        """
        ordered = tuple(sorted(self.devices, key=lambda d: d.index))
        if self.system.num_devices is None:
            return ordered
        return ordered[: self.system.num_devices]


def _version(p: Problems, top: Mapping[str, Any]) -> str | None:
    """``version``: any 1.x, as text.

    Upstream writes ``"1.0"``; an unquoted ``1.0`` is a float and ``1`` an
    int, and both are accepted since they say the same.  Only the major
    number is checked: a key a later 1.x added is caught by the key checks.
    """
    value = checks.require(p, "", top, "version", 'a schema version like "1.0"')
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        p.add("version", f"{checks.found(value)} is not a version, expected \"1.0\"")
        return None
    text = str(value)
    if text.split(".")[0] != "1":
        p.add("version", f"{text!r} is not supported, expected 1.x")
        return None
    return text


def _system(p: Problems, top: Mapping[str, Any]) -> SystemSpec | None:
    """``system``: the driver version and the CUDA version, in any spelling upstream used.

    The CUDA version may be ``cuda_version: "13.0"``, the pair
    ``cuda_version_major``/``cuda_version_minor``, or both when they agree.
    Quote it: YAML reads an unquoted ``12.10`` as the float 12.1.
    """
    raw = checks.require(p, "", top, "system", "a mapping with driver_version")
    if raw is None:
        return None
    sys_map = checks.as_mapping(p, "system", raw)
    if sys_map is None:
        return None
    checks.check_keys(p, "system", sys_map, SYSTEM_KEYS)
    driver = checks.require(p, "system", sys_map, "driver_version",
                            "a driver version like 580.105.08")
    if driver is not None:
        driver = checks.as_match(p, "system.driver_version", driver, DRIVER_VERSION_RE,
                                 "a driver version of 2-3 dot-separated numbers like 580.105.08")
    major = minor = None
    cuda = sys_map.get("cuda_version")
    if cuda is not None:
        # ``cuda_version: 13`` (an int) means 13.0; a float like 13.0 is
        # matched through its text; a bool is never a version, and neither
        # is a negative number (the regex refuses ``"-13.0"`` already).
        match = CUDA_VERSION_RE.fullmatch(str(cuda)) if not isinstance(cuda, bool) else None
        if isinstance(cuda, int) and not isinstance(cuda, bool) and cuda >= 0:
            major, minor = cuda, 0
        elif match:
            major, minor = int(match.group(1)), int(match.group(2))
        else:
            p.add("system.cuda_version",
                  f"{checks.found(cuda)} is not a CUDA version like \"13.0\"")
    for key in ("cuda_version_major", "cuda_version_minor"):
        if sys_map.get(key) is None:
            continue
        value = checks.as_int(p, f"system.{key}", sys_map[key], lo=0)
        given = major if key.endswith("major") else minor
        if value is not None and given is not None and value != given and cuda is not None:
            p.add(f"system.{key}",
                  f"{checks.found(value)} contradicts cuda_version {checks.found(cuda)}")
        if key.endswith("major"):
            major = value if value is not None else major
        else:
            minor = value if value is not None else minor
    if major is None or minor is None:
        if cuda is None:
            p.add("system.cuda_version", 'missing, expected a CUDA version like "13.0" '
                  "(or cuda_version_major and cuda_version_minor)")
        return None
    nvml = sys_map.get("nvml_version")
    if nvml is not None:
        nvml = checks.as_str(p, "system.nvml_version", nvml)
    num = sys_map.get("num_devices")
    if num is not None:
        # at least 1: hiding every GPU would make this no GPU node at all
        num = checks.as_int(p, "system.num_devices", num, lo=1)
    if driver is None:
        return None
    # Real NVML versions read ``<cuda major>.<driver version>`` (``13.580.105.08``).
    return SystemSpec(
        driver_version=driver, nvml_version=nvml or f"{major}.{driver}",
        cuda_version_major=major, cuda_version_minor=minor, num_devices=num,
    )


#: Fields every merged device needs: (path, what is expected).  Neither has a
#: sensible default: every consumer shows the name, and the PCI tree, NFD
#: and NVML's PCI info all need the device id.
_REQUIRED = (
    ("name", 'the product name, e.g. "NVIDIA H100 80GB HBM3"'),
    ("pci.device_id", "(device << 16) | vendor, e.g. 0x233010DE"),
)


def _devices(p: Problems, top: Mapping[str, Any]) -> list[DeviceSpec]:
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
    # No devices at all when one lacks a required field: ``_roots`` then skips
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
    presence is the merged config's business (``_devices``, ``_device``).
    """
    if cfg.get("uuid") is not None:
        checks.as_match(p, sub(path, "uuid"), cfg["uuid"], checks.GPU_UUID_RE,
                        "a GPU UUID GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
    serial = cfg.get("serial")
    # a number is a fine serial (see ``_device``); anything else must be text
    if serial is not None and (isinstance(serial, bool) or not isinstance(serial, int)):
        checks.as_str(p, sub(path, "serial"), serial)
    if cfg.get("minor_number") is not None:
        checks.as_int(p, sub(path, "minor_number"), cfg["minor_number"], lo=0, hi=MAX_GPU_MINOR)
    if cfg.get("board_id") is not None:
        # nvmlDeviceGetBoardId's unsigned int, reported as the profile writes it
        checks.as_int(p, sub(path, "board_id"), cfg["board_id"], lo=0, hi=0xFFFFFFFF)
    if cfg.get("grace_cpu_pair") is not None:
        checks.as_int(p, sub(path, "grace_cpu_pair"), cfg["grace_cpu_pair"], lo=0)
    for key in ("name", "brand", "architecture"):
        if cfg.get(key) is not None:
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
                checks.as_int(p, sub(path, f"{block}.{key}"), block_map[key], lo=0)
    platform = cfg.get("platform")
    pf = checks.as_mapping(p, sub(path, "platform"), platform) if platform is not None else None
    if pf and pf.get("module_id") is not None:
        checks.as_int(p, sub(path, "platform.module_id"), pf["module_id"], lo=0)
    if cfg.get("fabric") is not None:
        check_fabric(p, sub(path, "fabric"), cfg["fabric"], partial=True)
    if cfg.get("failure") is not None:
        check_failure(p, sub(path, "failure"), cfg["failure"])
    if cfg.get("xids") is not None:
        check_xid_list(p, sub(path, "xids"), cfg["xids"])
    if cfg.get("dynamics") is not None:
        check_dynamics(p, sub(path, "dynamics"), cfg["dynamics"])


# ---- loading -------------------------------------------------------------


def is_builtin(name_or_path: str | Path) -> bool:
    """A built-in profile's name; a ``Path`` is always a file, even ``Path("h100")``."""
    return isinstance(name_or_path, str) and name_or_path in BUILTIN_PROFILES


def read_profile_text(name_or_path: str | Path) -> tuple[str, str]:
    """(label, text) of a built-in profile name or a file path; ``SpecError`` if unreadable.

    A built-in's label is ``<name>.yaml`` so its messages read like a file's.
    Built-ins are read through ``importlib.resources``, which works whether
    the package is installed as files or zipped.  Tests use the text to
    derive variants of a built-in.
    """
    if is_builtin(name_or_path):
        name = str(name_or_path)
        resource = importlib.resources.files("mokka.state") / "profiles" / f"{name}.yaml"
        return f"{name}.yaml", resource.read_text(encoding="utf-8")
    path = Path(name_or_path)
    # Bounded and refusing (a FIFO, /dev/zero, a huge file): ``mokka.state.reader``.
    # Symlinks are followed: the profile is an operator's path, often a ConfigMap volume.
    text = read_input(path, "the profile", optional=True)
    if text is None:
        raise SpecError(
            f"{path}: no such profile file, expected a readable YAML file or one of the "
            f"built-in profiles {', '.join(BUILTIN_PROFILES)}"
        )
    return str(path), text


def parse_profile(text: str, *, source: str, name: str | None = None) -> Profile:
    """Parse (bounded, no base-60 numbers: ``reader.load_yaml``) and validate a profile's text."""
    return Profile.from_mapping(load_yaml(text, source), source=source, name=name)


def load_profile(name_or_path: str | Path) -> Profile:
    """A built-in profile by name (``h100``) or a profile file by path.

    The profile's ``name`` is the argument as given, so the state and the
    engine config say ``h100`` or the path the user passed.
    """
    label, text = read_profile_text(name_or_path)
    return parse_profile(text, source=label, name=str(name_or_path))
