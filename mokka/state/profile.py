"""The GPU profile: the upstream mock-NVML schema, parsed and validated.

A profile describes one node's GPUs: ``system`` (driver and CUDA versions),
``device_defaults`` (a full device config), ``devices`` (per-GPU entries
deep-merged over the defaults), ``nvlink``, ``pcie_topology`` and
``infiniband``.  Profiles written for the earlier shell-based mock load
unchanged: every shape they use is accepted (Grace pairs and platform
blocks, several PCIe roots, NVSwitch lists, IB blocks, Helm's re-rendered
key order and exponent-form numbers).

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

This module owns the profile as a whole: its top level, ``version`` and
``system``, and putting the parts together.  The parts that follow rules
of their own live beside it: ``mokka.state.profile_devices`` (the open,
layered device entries), ``mokka.state.profile_blocks`` (the strict
node-level blocks) and ``mokka.state.profile_files`` (the built-in
profiles and reading a file); their public names are importable from
here too.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mokka.state import checks
from mokka.state.checks import Problems
from mokka.state.model import SystemDmi
from mokka.state.profile_blocks import (
    InfinibandSpec,
    NvlinkSpec,
    RootSpec,
    parse_infiniband,
    parse_nvlink,
    parse_roots,
)
from mokka.state.profile_devices import DeviceSpec, parse_devices
from mokka.state.profile_files import (
    BUILTIN_PROFILES,
    DEFAULT_PROFILE,
    is_builtin,
    read_profile_text,
)
from mokka.state.profile_sources import Source, parse_sources
from mokka.state.reader import load_yaml

__all__ = [
    "BUILTIN_PROFILES",
    "DEFAULT_PROFILE",
    "DeviceSpec",
    "Profile",
    "SystemSpec",
    "is_builtin",
    "load_profile",
    "parse_profile",
    "read_profile_text",
]

# Allowed keys per strict block: every key of the upstream schema, so its
# profiles load unchanged, and (``cpulist`` aside) nothing more, so a typo
# is an error.
TOP_LEVEL_KEYS = (
    "version", "system", "device_defaults", "devices", "nvlink", "pcie_topology",
    "infiniband",
    # upstream's per-profile defaults of the dynamic metrics generator
    "dynamic_metrics_defaults",
    # where the values come from (mokka.state.profile_sources); not compiled
    "sources",
)
SYSTEM_KEYS = (
    "driver_version", "nvml_version", "cuda_version", "cuda_version_major",
    "cuda_version_minor", "num_devices",
    # the host system's DMI identity (``/sys/class/dmi/id``)
    "dmi",
)
#: ``system.dmi``'s keys: the ``/sys/class/dmi/id`` attributes a profile may state.
DMI_KEYS = tuple(field.name for field in attrs.fields(SystemDmi))
#: The longest DMI string.  SMBIOS sets no limit of its own, but firmware
#: writes short names (``DGXH100``, ``ARS-121GL-NB3-LCC-R1``), and GFD copies
#: ``product_name`` into a node label, whose values hold at most 63 characters:
#: a longer value is a mistake, such as a pasted blob.
DMI_VALUE_MAX_BYTES = 64
#: ``580.105.08`` or ``550.54``: GFD splits the driver version at the dots
#: and accepts two or three parts, so nothing else may reach NVML.
#: ``re.ASCII``: ``\d`` would otherwise take any script's digits (``٥٨٠``),
#: which GFD and every other parser of the version refuse.
#: ``NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`` and ``NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE``
#: (nvml.h: 80 bytes, the NUL included): the longest version NVML can hand out.
VERSION_MAX_BYTES = 79
#: NVML spells CUDA versions ``major * 1000 + minor * 10`` in an ``int``.
CUDA_MINOR_MAX = 99
CUDA_MAJOR_MAX = 999
DRIVER_VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?$", re.ASCII)
#: ``major.minor``, as ``nvidia-smi`` prints "CUDA Version: 13.0".
CUDA_VERSION_RE = re.compile(r"^(\d+)\.(\d+)$", re.ASCII)


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
    #: ``system.dmi``: the host system's identity where the profile states it.
    dmi: SystemDmi = attrs.field(factory=SystemDmi)


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
    #: The ``sources:`` note, group → entries (``mokka.state.profile_sources``).  Kept
    #: out of ``document``: it describes the profile, and a change to it is no new state.
    sources: Mapping[str, tuple[Source, ...]] = attrs.field(factory=dict, eq=False, repr=False)

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
        devices = parse_devices(p, top)
        nvlink = parse_nvlink(p, top.get("nvlink"))
        # after the devices: a root may only list bus ids they declare
        roots = parse_roots(p, top.get("pcie_topology"), devices)
        infiniband = parse_infiniband(p, top.get("infiniband"))
        sources = parse_sources(p, top.get("sources"))
        num = system.num_devices if system is not None else None
        if num is not None and devices and num > len(devices):
            p.add("system.num_devices", f"{num} is more than the {len(devices)} devices "
                  f"declared, expected at most {len(devices)}")
        p.raise_if_any()
        assert system is not None
        assert version is not None
        return cls(
            name=name or source, version=version, system=system, devices=tuple(devices),
            nvlink=nvlink, roots=tuple(roots), infiniband=infiniband,
            document={key: value for key, value in top.items() if key != "sources"},
            sources=sources,
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
    # first: the checks below may return early, and every problem is reported
    dmi = _dmi(p, sys_map.get("dmi"))
    driver = checks.require(p, "system", sys_map, "driver_version",
                            "a driver version like 580.105.08")
    if driver is not None:
        driver = checks.as_match(p, "system.driver_version", driver, DRIVER_VERSION_RE,
                                 "a driver version of 2-3 dot-separated numbers like 580.105.08")
    if driver is not None:
        # It names the library's files (``libnvidia-ml.so.<version>``) too: an
        # over-long one used to fail the stage with ENAMETOOLONG instead.
        driver = checks.as_text(p, "system.driver_version", driver, max_bytes=VERSION_MAX_BYTES)
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
    for part, value, most in (("minor", minor, CUDA_MINOR_MAX), ("major", major, CUDA_MAJOR_MAX)):
        # NVML's integer form is major * 1000 + minor * 10: a minor of 100 would
        # read as the next major version.
        if value > most:
            field = "cuda_version" if cuda is not None else f"cuda_version_{part}"
            p.add(f"system.{field}", f"{part} version {value}, expected at most {most}")
            return None
    nvml = sys_map.get("nvml_version")
    if nvml is not None:
        nvml = checks.as_text(p, "system.nvml_version", nvml, max_bytes=VERSION_MAX_BYTES)
    elif driver is not None and len(f"{major}.{driver}") > VERSION_MAX_BYTES:
        p.add("system.driver_version", f"is {len(driver)} bytes long, too long for the NVML "
              f"version <cuda major>.<driver version> of at most {VERSION_MAX_BYTES} bytes "
              "(or give system.nvml_version)")
        return None
    num = sys_map.get("num_devices")
    if num is not None:
        # at least 1: hiding every GPU would make this no GPU node at all
        num = checks.as_int(p, "system.num_devices", num, lo=1)
    if driver is None or dmi is None:
        return None
    # Real NVML versions read ``<cuda major>.<driver version>`` (``13.580.105.08``).
    return SystemSpec(
        driver_version=driver, nvml_version=nvml or f"{major}.{driver}",
        cuda_version_major=major, cuda_version_minor=minor, num_devices=num, dmi=dmi,
    )


def _dmi(p: Problems, raw: Any) -> SystemDmi | None:
    """``system.dmi``: any of ``DMI_KEYS``, each one line of text; ``None`` on a problem.

    Each value becomes a one-line sysfs attribute as written, so a line
    break, a control character or an over-long string is refused here.
    """
    if raw is None:
        return SystemDmi()
    dmi = checks.as_mapping(p, "system.dmi", raw)
    if dmi is None:
        return None
    before = len(p.items)
    checks.check_keys(p, "system.dmi", dmi, DMI_KEYS)
    values = {key: checks.as_text(p, f"system.dmi.{key}", value,
                                  max_bytes=DMI_VALUE_MAX_BYTES)
              for key, value in dmi.items() if key in DMI_KEYS and value is not None}
    if len(p.items) > before:
        return None
    return SystemDmi(**values)


# ---- from text -----------------------------------------------------------


def parse_profile(text: str, *, source: str, name: str | None = None) -> Profile:
    """Parse (bounded, no base-60 numbers: ``reader.load_yaml``) and validate a profile's text."""
    return Profile.from_mapping(load_yaml(text, source), source=source, name=name)


def load_profile(name_or_path: str | Path) -> Profile:
    """A built-in profile by name (``h100``) or a profile file by path.

    The profile's ``name`` is the argument as given, so the state and the
    engine config say ``h100`` or the path the user passed.
    """
    label, text = read_profile_text(name_or_path)
    return _parsed(text, label, str(name_or_path))


# The daemon reads all of its inputs again whenever one of them changes, and
# a ``mokka ctl`` loop changes the overrides file many times a second while
# the profile stays as it was: parsing it again each time was a sixth of the
# daemon's work per change.  So the last text parsed is kept with its result.
# Sound because a ``Profile`` is frozen and nothing modifies its mappings
# (the compiler merges into copies, ``checks.deep_merge``), and the result
# depends on the text, its label and its name alone.  A text that fails is
# not kept: its errors are raised (and reported) on every read.
@functools.lru_cache(maxsize=1)
def _parsed(text: str, source: str, name: str) -> Profile:
    return parse_profile(text, source=source, name=name)
