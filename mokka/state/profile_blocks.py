"""The node-level blocks of a GPU profile: ``nvlink``, ``pcie_topology``, ``infiniband``.

``mokka.state.profile`` owns the profile as a whole and
``mokka.state.profile_devices`` its per-GPU part; these three blocks
describe the node around the GPUs (the NVLink fabric and its switches, the
PCIe root complexes the GPUs hang off, the HCAs) and are strict: every key
is one of the upstream schema's, so a typo is an error rather than a
silently different node.  Like the rest of the profile, each
validator records every problem it finds in ``Problems`` and returns what
it could build, so one run reports all of them.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any

import attrs

from mokka.state import checks
from mokka.state.checks import Problems, sub
from mokka.state.cpulists import format_cpulist, parse_cpulist
from mokka.state.profile_devices import DeviceSpec

NVLINK_KEYS = ("version", "links_per_gpu", "bandwidth_per_link_mbps", "c2c_enabled", "switches")
SWITCH_KEYS = ("bdf", "uuid")
PCIE_KEYS = ("root_complexes",)
#: ``cpulist`` is not in the upstream schema: it feeds sysfs ``local_cpulist``.
ROOT_KEYS = ("id", "numa_node", "devices", "cpulist")
IB_KEYS = (
    "enabled", "hca_type", "fw_version", "hw_rev", "board_id", "link_layer", "rate_gbps",
    "port_state", "phys_state", "hcas_per_gpu", "hca_count", "guid_prefix",
    "node_desc_template",
)
#: InfiniBand rates of a 4X port in Gb/s: EDR, HDR, NDR, XDR.  The ib
#: simulator names the speed from the rate (``400 Gb/sec (4X NDR)``), so a
#: rate outside this list would have no name to show.
IB_RATES = (100, 200, 400, 800)

#: A root complex as sysfs names its directory (``/sys/devices/pci0000:48``).
ROOT_ID_RE = re.compile(r"^pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}$")

#: ``NVML_NVLINK_MAX_LINKS`` (nvml.h): the most NVLinks a GPU has.
NVLINK_MAX_LINKS = 18

#: The highest NUMA node Linux numbers (``MAX_NUMNODES`` is at most 1024).
MAX_NUMA_NODE = 1023

#: The longest ``local_cpulist`` sysfs can show: an attribute is one page
#: (4096 bytes), its newline included.
CPULIST_MAX_BYTES = 4095

#: HCAs on one node.  The ib simulator derives LIDs from the fabric's node
#: list, a block of 128 per node: the node's leaf switch and one LID per HCA
#: (``mokka.simulators.ib.lids``, which takes its block size from here).
MAX_HCAS = 127
#: Nodes in one InfiniBand fabric: a switch has at most 254 external ports,
#: and the mock fabric's spine gives each node one (``simulators/ib/lids.py``).
MAX_FABRIC_NODES = 254

#: The profile's text that the ib simulator writes verbatim into an HCA's
#: sysfs attribute, and the most bytes that attribute holds on a real node
#: (its newline and the buffer's NUL left out).  A longer value would be a
#: file no kernel writes, and one that readers with fixed buffers cut.
IB_ATTRIBUTE_MAX_BYTES = {
    # mlx5 prints "MT%d" of the 16-bit PCI device id (the stage checks that
    # shape); libibumad reads the file into ``char ca_type[40]`` for ibstat.
    "hca_type": 39,
    # ib_core's fw_ver_show fills ``char version[IB_FW_VERSION_NAME_MAX]``
    # (ETHTOOL_FWVERS_LEN, 32 with the NUL).
    "fw_version": 31,
    # mlx5 prints the PCI revision as a number (``%x``) and has no text buffer
    # for it; libibumad reads the file into ``char hw_ver[20]`` for ibstat.
    "hw_rev": 19,
    # mlx5 prints ``%.*s`` of the board id with MLX5_BOARD_ID_LEN (64).
    "board_id": 64,
}
#: IB NodeDescription is a 64-byte field; the kernel truncates longer writes
#: to ``node_desc``, and the ib simulator cuts the filled-in template there.
NODE_DESC_MAX = 64
#: Only the first ``NODE_DESC_MAX`` bytes of a filled-in template are kept, so
#: a longer template is a mistake; four times that leaves room for the
#: replacement fields and their format specs around 64 bytes of text, and
#: keeps filling it in, once per HCA, cheap.
NODE_DESC_TEMPLATE_MAX = 4 * NODE_DESC_MAX
#: A replacement field's format spec in Python's mini-language,
#: ``[[fill]align][sign][z][#][0][width][grouping][.precision][type]``, with
#: ASCII digits only: ``format`` itself takes any script's digits as a width.
FORMAT_SPEC_RE = re.compile(
    r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>[0-9]*)[,_]?(?:\.(?P<precision>[0-9]+))?"
    r"(?P<type>[bcdeEfFgGnosxX%]?)",
    re.ASCII | re.DOTALL,
)


@attrs.frozen(kw_only=True)
class SwitchSpec:
    """An NVSwitch: a PCI function on the node and the far end of GPUs' NVLinks."""

    #: canonical lower-case ``dddd:bb:dd.f``
    bdf: str
    uuid: str


@attrs.frozen(kw_only=True)
class NvlinkSpec:
    """``nvlink``: present on NVLink systems; its absence means no NVLink at all."""

    #: NVLink generation: 3 on A100, 4 on H100, 5 on Blackwell.
    version: int
    #: 12 on A100, 18 on H100 and Blackwell (NVML's maximum).
    links_per_gpu: int
    #: Unidirectional bandwidth of one link in MB/s (``nvidia-smi nvlink -s``).
    bandwidth_per_link_mbps: int
    #: NVLink-C2C to a Grace CPU (GB200/GB300).
    c2c_enabled: bool = False
    switches: tuple[SwitchSpec, ...] = ()
    #: The whole block as written, for keys only the mock library reads.
    fields: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)


@attrs.frozen(kw_only=True)
class RootSpec:
    """One PCIe root complex and the GPUs the profile places under it."""

    #: ``pciDDDD:BB``, lower-cased
    id: str
    #: NUMA node the root is local to; -1 (the kernel's "unknown") is allowed.
    numa_node: int
    #: canonical BDFs in profile order
    devices: tuple[str, ...]
    cpulist: str | None = None


@attrs.frozen(kw_only=True)
class InfinibandSpec:
    """``infiniband``: the node's HCAs as ``ibstat`` shows them.

    The defaults describe a ConnectX-7 (``MT4129``) on an NDR link, the HCA
    HGX H100 and B200 nodes carry, so a block that only says
    ``enabled: true`` still renders a plausible port.
    """

    hca_type: str = "MT4129"
    fw_version: str = "28.39.1002"
    hw_rev: str = "0x0"
    board_id: str = "MT_0000000838"
    link_layer: str = "InfiniBand"
    #: Gb/s: 100 EDR, 200 HDR, 400 NDR, 800 XDR.
    rate_gbps: int = 400
    #: ``ibstat``'s words; sysfs carries them as ``4: ACTIVE`` and ``5: LinkUp``.
    port_state: str = "ACTIVE"
    phys_state: str = "LinkUp"
    #: One HCA per GPU, the HGX rail layout (each GPU has its own NIC for
    #: GPUDirect RDMA).
    hcas_per_gpu: int = 1
    #: Explicit HCA count; ``None``: GPUs times ``hcas_per_gpu``.
    hca_count: int | None = None
    #: Template of the node GUIDs; its first three bytes (the OUI) are kept.
    guid_prefix: str | None = None
    #: ``<host> <device>``, what ``rdma-ndd`` sets on real hosts by default.
    node_desc_template: str = "{node_name} mlx5_{idx}"


def parse_nvlink(p: Problems, raw: Any) -> NvlinkSpec | None:
    """``nvlink``: the three numbers are required, switches need unique addresses.

    A switch entry with a bad field is reported and left out; the block is
    ``None`` (no NVLink) only when it is absent or a required number failed.
    """
    if raw is None:
        return None
    nv = checks.as_mapping(p, "nvlink", raw)
    if nv is None:
        return None
    checks.check_keys(p, "nvlink", nv, NVLINK_KEYS)
    ints = {}
    for key in ("version", "links_per_gpu", "bandwidth_per_link_mbps"):
        value = checks.require(p, "nvlink", nv, key, "an integer >= 0")
        # a GPU has at most NVML_NVLINK_MAX_LINKS links: each one is lines of
        # the engine config, and 200,000 of them were 177 MB of it
        most = NVLINK_MAX_LINKS if key == "links_per_gpu" else None
        ints[key] = None if value is None else checks.as_int(p, f"nvlink.{key}", value, lo=0,
                                                              hi=most)
    # C2C exists only where a GPU pairs with a Grace CPU: off unless stated
    c2c = nv.get("c2c_enabled", False)
    c2c = checks.as_bool(p, "nvlink.c2c_enabled", c2c)
    switches: list[SwitchSpec] = []
    seen: set[str] = set()
    for pos, item in enumerate(checks.as_list(p, "nvlink.switches", nv.get("switches", [])) or ()):
        path = sub("nvlink.switches", pos)
        sw = checks.as_mapping(p, path, item)
        if sw is None:
            continue
        checks.check_keys(p, path, sw, SWITCH_KEYS)
        bdf = checks.require(p, path, sw, "bdf", "a PCI address DDDD:BB:DD.F")
        bdf = None if bdf is None else checks.as_bdf(p, sub(path, "bdf"), bdf)
        uuid = checks.require(p, path, sw, "uuid", "the switch UUID")
        uuid = None if uuid is None else checks.as_str(p, sub(path, "uuid"), uuid)
        if bdf in seen:
            p.add(sub(path, "bdf"), f"{bdf!r} repeats an earlier switch, expected unique addresses")
        if bdf and uuid:
            seen.add(bdf)
            switches.append(SwitchSpec(bdf=bdf, uuid=uuid))
    if None in ints.values() or c2c is None:
        return None
    return NvlinkSpec(c2c_enabled=c2c, switches=tuple(switches), fields=nv, **ints)


def parse_roots(p: Problems, raw: Any, devices: list[DeviceSpec]) -> list[RootSpec]:
    """``pcie_topology.root_complexes``: unique ids, each GPU under at most one root.

    Every bus id a root lists must be some device's ``pci.bus_id``: a typo
    there would otherwise leave a GPU silently under the default root.  When
    the devices themselves failed to parse, that cross-check is skipped
    rather than reporting every listed address as unknown.
    """
    if raw is None:
        return []
    topo = checks.as_mapping(p, "pcie_topology", raw)
    if topo is None:
        return []
    checks.check_keys(p, "pcie_topology", topo, PCIE_KEYS)
    declared = {d.bus_id for d in devices}
    owner: dict[str, str] = {}
    ids: set[str] = set()
    roots: list[RootSpec] = []
    entries = checks.as_list(p, "pcie_topology.root_complexes", topo.get("root_complexes", []))
    for pos, item in enumerate(entries or ()):
        path = sub("pcie_topology.root_complexes", pos)
        root = checks.as_mapping(p, path, item)
        if root is None:
            continue
        checks.check_keys(p, path, root, ROOT_KEYS)
        rid = checks.require(p, path, root, "id", "a root complex id pciDDDD:BB")
        if rid is not None:
            rid = checks.as_match(p, sub(path, "id"), rid, ROOT_ID_RE,
                                  "a root complex id pciDDDD:BB")
        if rid is not None:
            rid = rid.lower()
            if rid in ids:
                p.add(sub(path, "id"), f"{rid!r} repeats an earlier root, expected unique ids")
            ids.add(rid)
        # -1 is what the kernel writes to numa_node when firmware gives none
        # and at most MAX_NUMNODES - 1 (1 << NODES_SHIFT, 10 bits at the most)
        numa = checks.as_int(p, sub(path, "numa_node"), root.get("numa_node", 0), lo=-1,
                             hi=MAX_NUMA_NODE)
        cpulist = root.get("cpulist")
        if cpulist is not None:
            cpulist = _cpulist(p, sub(path, "cpulist"), cpulist)
        bdfs: list[str] = []
        for dpos, dev in enumerate(checks.as_list(p, sub(path, "devices"), root.get("devices", []))
                                   or ()):
            dpath = sub(sub(path, "devices"), dpos)
            bdf = checks.as_bdf(p, dpath, dev)
            if bdf is None:
                continue
            if bdf in owner:
                p.add(dpath, f"{dev!r} is already under {owner[bdf]}, expected each device "
                      "under at most one root")
                continue
            if devices and bdf not in declared:
                p.add(dpath, f"{dev!r} is not the pci.bus_id of any entry in devices")
                continue
            # ``path`` names a root whose id failed, so later messages still point at it
            owner[bdf] = rid or path
            bdfs.append(bdf)
        if rid is not None and numa is not None:
            roots.append(RootSpec(id=rid, numa_node=numa, devices=tuple(bdfs), cpulist=cpulist))
    return roots


def parse_infiniband(p: Problems, raw: Any) -> InfinibandSpec | None:
    """``infiniband``: ``None`` when absent, disabled, or any field failed.

    A block without ``enabled`` is on (writing it means wanting it).  Every
    field is optional and falls back to ``InfinibandSpec``'s defaults.
    """
    if raw is None:
        return None
    ib = checks.as_mapping(p, "infiniband", raw)
    if ib is None:
        return None
    checks.check_keys(p, "infiniband", ib, IB_KEYS)
    enabled = checks.as_bool(p, "infiniband.enabled", ib.get("enabled", True))
    values: dict[str, Any] = {}
    for key in ("hca_type", "fw_version", "hw_rev", "board_id", "link_layer", "port_state",
                "phys_state", "guid_prefix", "node_desc_template"):
        if ib.get(key) is not None:
            values[key] = _ib_text(p, key, ib[key])
    if ib.get("rate_gbps") is not None:
        rate = checks.as_int(p, "infiniband.rate_gbps", ib["rate_gbps"])
        if rate is not None and rate not in IB_RATES:
            p.add("infiniband.rate_gbps", f"{rate} is not one of: "
                  f"{', '.join(map(str, IB_RATES))} (EDR, HDR, NDR, XDR)")
        values["rate_gbps"] = rate
    if ib.get("hcas_per_gpu") is not None:
        values["hcas_per_gpu"] = checks.as_int(p, "infiniband.hcas_per_gpu", ib["hcas_per_gpu"],
                                               lo=1, hi=MAX_HCAS)
    if ib.get("hca_count") is not None:
        values["hca_count"] = checks.as_int(p, "infiniband.hca_count", ib["hca_count"],
                                            lo=1, hi=MAX_HCAS)
    if ib.get("guid_prefix") is not None and values.get("guid_prefix"):
        # the identity code keeps the first three bytes (the vendor's OUI) and
        # hashes the rest, so a shorter prefix has nothing to keep
        digits = re.sub(r"[^0-9a-fA-F]", "", values["guid_prefix"])
        if len(digits) < 6:
            p.add("infiniband.guid_prefix", f"{ib['guid_prefix']!r} has fewer than 3 bytes, "
                  "expected an OUI-led prefix like a088c2:0300:ab")
    if not enabled or None in values.values():
        return None
    return InfinibandSpec(**values)


def _cpulist(p: Problems, path: str, value: Any) -> str | None:
    """A root complex's CPU list in the kernel's spelling (``0-55,112-167``).

    Kept normalised, so the sysfs files and the engine config's
    ``cpu_affinity`` (which the library parses) name the same CPUs however
    the profile spelt them (``0 - 55, 112-167``).
    """
    text = checks.as_str(p, path, value)
    if text is None:
        return None
    try:
        canonical = format_cpulist(parse_cpulist(text))
    except ValueError as exc:
        p.add(path, str(exc))
        return None
    if len(canonical) > CPULIST_MAX_BYTES:
        p.add(path, f"is {len(canonical)} bytes as the kernel spells it ({canonical[:40]}...), "
                    f"expected at most {CPULIST_MAX_BYTES} (one sysfs page)")
        return None
    return canonical


def _ib_text(p: Problems, key: str, value: Any) -> str | None:
    """One text field of ``infiniband``.

    What goes into a sysfs attribute as written must fit that attribute, on
    one line; the node description template must also fill in to one.  The
    other fields are only looked up or parsed (``port_state`` names a
    number), and their own checks refuse anything unexpected.
    """
    path = f"infiniband.{key}"
    if key in IB_ATTRIBUTE_MAX_BYTES:
        return checks.as_text(p, path, value, max_bytes=IB_ATTRIBUTE_MAX_BYTES[key])
    if key != "node_desc_template":
        return checks.as_str(p, path, value)
    template = checks.as_text(p, path, value, max_bytes=NODE_DESC_TEMPLATE_MAX)
    problem = None if template is None else node_desc_template_problem(template)
    if problem is not None:
        p.add(path, problem)
        return None
    return template


def node_desc_template_problem(template: str) -> str | None:
    """Why ``template``'s format specs cannot make a node description, or ``None``.

    A width or precision is memory spent before the result is cut to
    ``NODE_DESC_MAX`` bytes (``{idx:>300000000}`` is a 300 MB string), so
    neither may exceed that size.  ``{idx:c}`` turns the HCA's index into a
    character, a control character for most indices.  Which fields the
    template names (``{node_name}``, ``{idx}``) is the ib simulator's check,
    made when it fills the template in.
    """
    try:
        fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(template)
                  if name is not None]
    except ValueError as exc:
        return (f"{checks.found(template)} cannot be parsed ({exc}), expected text with the "
                "fields {node_name} and {idx}")
    for name, spec in fields:
        problem = _format_spec_problem(f"{{{name}:{spec}}}" if spec else f"{{{name}}}", spec)
        if problem is not None:
            return problem
    return None


def _format_spec_problem(field: str, spec: str) -> str | None:
    """What is wrong with ``field``'s format ``spec``, or ``None``."""
    match = FORMAT_SPEC_RE.fullmatch(spec)
    if match is None:
        return (f"{checks.found(field)} has a format spec other than "
                "[[fill]align][sign][#][0][width][,][.precision][type] with ASCII digits, "
                "expected one like {idx:02d}")
    for part in ("width", "precision"):
        if _exceeds(match[part] or "", NODE_DESC_MAX):
            return (f"{checks.found(field)} has a {part} above {NODE_DESC_MAX}, expected at "
                    f"most {NODE_DESC_MAX} (the bytes a node description holds)")
    if match["type"] == "c":
        return (f"{checks.found(field)} turns a number into a character, expected a number "
                "format like {idx:02d}")
    return None


def _exceeds(digits: str, limit: int) -> bool:
    """Whether the decimal ``digits`` (maybe thousands of them) name a number above ``limit``."""
    significant = digits.lstrip("0")
    # int() of a very long digit string is slow, and refused past 4300 digits
    return len(significant) > len(str(limit)) or int(significant or "0") > limit
