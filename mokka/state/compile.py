"""Inputs → one frozen ``State``.

The inputs are the profile, the optional topology document, the optional
overrides and the node meta (node name, feature gates).  Compilation is a
pure function of them: the same inputs give an equal ``State`` and the same
``content_hash``, which lets a source skip publishing (and the daemon skip
reconciling) when nothing that matters changed, e.g. a comment edit.

Per GPU, in order of precedence (weakest first):

1. ``device_defaults`` < the ``devices[]`` entry (``mokka.state.profile_devices``);
2. per-node identities replace the profile's UUID and serial
   (``mokka.state.identity``);
3. this node's clique from the topology document sets the fabric identity
   (state ``completed``) of GPUs that have a ``fabric`` block;
4. overrides ``all`` < ``devices["<index>"]`` < ``devices["<uuid>"]``.

Xids come from ``xids`` lists and ``failure.xid`` at every layer.  Each
gets an id that is stable for the same input (derived from the GPU index,
the code and either an explicit ``id`` or where the entry sits), so the
kernel log announcer and the NVML event path deliver it exactly once, also
across daemon restarts; ``mokka ctl xid`` writes a fresh random ``id`` so a
repeated injection of the same code is a new Xid.

Validation belongs to the parsers (``profile``, ``topology``, ``overrides``):
by the time a value reaches this module its type is known, so the code
here converts and combines without re-checking.  The one thing only the
compiler can see is the node name, which no input file carries.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import attrs

from mokka.errors import SpecError
from mokka.state import identity
from mokka.state.checks import deep_merge
from mokka.state.model import (
    Fabric,
    Failure,
    Gpu,
    Infiniband,
    Nvlink,
    NvlinkSwitch,
    RootComplex,
    State,
    System,
    Topology,
    Xid,
)
from mokka.state.override_doc import Overrides
from mokka.state.overrides import load_overrides
from mokka.state.profile import DeviceSpec, Profile, load_profile
from mokka.state.profile_blocks import MAX_FABRIC_NODES, MAX_HCAS
from mokka.state.topology import load_topology

#: Fabric cluster UUID of a GPU whose profile names none (what a non-NVL node reports).
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


@attrs.frozen(kw_only=True)
class NodeMeta:
    """What the node itself contributes to its desired state.

    It comes from flags and the environment, not from a watched file, and
    does not change while the daemon runs (another node name is another pod).
    """

    #: Seeds every per-node identity; also the key into the topology document.
    node_name: str
    #: Feature gates as resolved from flags (known gates only).  They enter the
    #: content hash: flipping one at a restart is a new desired state.
    feature_gates: Mapping[str, bool] = attrs.field(factory=dict)


def content_hash(
    profile: Profile, topology: Topology | None, overrides: Overrides | None, node: NodeMeta
) -> str:
    """sha256 over the canonical inputs.

    The profile and overrides enter as parsed documents (key order and
    comments do not matter); the topology as its text, because the nvlink
    simulator stages that text verbatim.  The profile's name is in too: it
    reaches the engine config and the logs, so a switch between two
    profiles with equal documents is still a change.
    """
    payload = {
        "profile_name": profile.name,
        "profile": _canonical(profile.document),
        "topology": None if topology is None else topology.text,
        "overrides": None if overrides is None or overrides.empty
        else _canonical(overrides.to_mapping()),
        "node_name": node.node_name,
        "feature_gates": {k: bool(v) for k, v in sorted(node.feature_gates.items())},
    }
    # sort_keys makes key order irrelevant; ``default=str`` covers the few
    # non-JSON values YAML produces (an unquoted ``2024-01-31`` is a date).
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(value: Any) -> Any:
    """``value`` with every mapping key a string, so ``json.dumps(sort_keys=True)`` can order it.

    Device fields the profile passes through and the open subtrees of an
    overrides file may have keys of any YAML type: ``{0: 50, speed: 1}``
    mixes an int and a string (which ``sorted`` cannot compare), and a date
    key is no JSON key at all.  String keys stay as they are (the hash of
    an ordinary document does not change); any other key is spelled with
    its type, so ``1`` and ``"1"`` stay distinct.  A set becomes a sorted
    list (its iteration order is arbitrary).
    """
    if isinstance(value, Mapping):
        return {
            k if isinstance(k, str) else f"\0{type(k).__name__}:{k!r}": _canonical(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, set | frozenset):
        items = (json.dumps(_canonical(v), sort_keys=True, default=str) for v in value)
        return {"\0set": sorted(items)}
    return value


def compile_state(
    profile: Profile,
    *,
    node: NodeMeta,
    topology: Topology | None = None,
    overrides: Overrides | None = None,
    generation: int = 1,
) -> State:
    """Compile validated inputs; raises ``SpecError`` only for a bad node name.

    ``generation`` is the caller's counter (the file source passes its last
    generation plus one); it does not enter the content hash, so a source
    can compile, compare hashes and throw the result away when nothing
    changed.  The node name must be non-empty: every identity hashes it,
    and an empty one would give every such node the same UUIDs.
    """
    if not node.node_name.strip():
        raise SpecError("node name: empty, expected this node's name")
    if profile.infiniband is not None and topology is not None:
        _check_fabric_size(topology, node.node_name)
    # ``num_devices`` applies first: roots, Xids and IB HCAs follow the GPUs
    # this node exposes, not the ones the profile declares.
    devices = profile.selected_devices()
    roots, root_of = _roots(profile, devices)
    placement = topology.placement(node.node_name) if topology is not None else None
    gpus: list[Gpu] = []
    xids: list[Xid] = []
    for dev in devices:
        gpu, gpu_xids = _gpu(dev, node.node_name, root_of[dev.bus_id], placement, overrides)
        gpus.append(gpu)
        xids.extend(gpu_xids)
    system = profile.system
    return State(
        generation=generation,
        content_hash=content_hash(profile, topology, overrides, node),
        node_name=node.node_name,
        profile_name=profile.name,
        system=System(
            driver_version=system.driver_version, nvml_version=system.nvml_version,
            cuda_version_major=system.cuda_version_major,
            cuda_version_minor=system.cuda_version_minor, dmi=system.dmi,
        ),
        gpus=tuple(gpus),
        pcie_roots=tuple(roots),
        nvlink=_nvlink(profile),
        infiniband=_infiniband(profile, node.node_name, len(gpus)),
        topology=topology,
        xids=tuple(xids),
        feature_gates=dict(node.feature_gates),
        profile_fields=profile.document,
    )


def compile_profile(
    name_or_path: str | Path,
    *,
    node_name: str,
    topology: Path | None = None,
    overrides: Path | None = None,
    generation: int = 1,
    feature_gates: Mapping[str, bool] | None = None,
) -> State:
    """Load and compile in one call: a built-in profile name (``h100``) or a file path.

    A ``topology`` or ``overrides`` path that does not exist counts as absent,
    as it does for the daemon's file source.  Tests and benches that need a
    ``State`` without a daemon use this.
    """
    profile, topo, ovr = load_inputs(name_or_path, topology, overrides)
    node = NodeMeta(node_name=node_name, feature_gates=dict(feature_gates or {}))
    return compile_state(profile, node=node, topology=topo, overrides=ovr, generation=generation)


def load_inputs(
    profile: str | Path, topology: Path | None, overrides: Path | None,
    *, overrides_root: Path | None = None,
) -> tuple[Profile, Topology | None, Overrides | None]:
    """Read and validate all three inputs, reporting the problems of all of them at once.

    A rollout that breaks the profile and the topology document together
    should not need two round trips to learn both; each message already
    names its file, so one ``SpecError`` carries them all.  ``None`` for
    the topology or overrides path means that input is not configured.
    ``overrides_root``: the node root the overrides path lies beneath, where
    no symlink is followed (``load_overrides``).
    """
    problems: list[str] = []
    loaded: list[Any] = []
    for loader, arg in ((load_profile, profile), (load_topology, topology),
                        (partial(load_overrides, root=overrides_root), overrides)):
        try:
            loaded.append(None if arg is None else loader(arg))
        except SpecError as exc:
            problems.extend(exc.problems)
            loaded.append(None)
    if problems:
        raise SpecError(problems)
    return loaded[0], loaded[1], loaded[2]


# ---- parts ---------------------------------------------------------------


def _roots(
    profile: Profile, devices: tuple[DeviceSpec, ...]
) -> tuple[list[RootComplex], dict[str, RootComplex]]:
    """Root complexes that hold at least one exposed GPU (the PCI tree follows the GPU count).

    A GPU no root lists sits under its domain's bus-0 root (``pciDDDD:00``),
    created with NUMA node 0 if the profile has none: the upstream default.
    Returns the roots (the profile's in its order, then the defaults in GPU
    order) and a map from each exposed GPU's bus id to its root.
    """
    selected = {d.bus_id for d in devices}
    members: dict[str, list[str]] = {}
    meta: dict[str, tuple[int, str | None]] = {}
    for root in profile.roots:
        members[root.id] = [b for b in root.devices if b in selected]
        meta[root.id] = (root.numa_node, root.cpulist)
    placed = {b for bdfs in members.values() for b in bdfs}
    for dev in devices:
        if dev.bus_id not in placed:
            # bus_id is canonical ``dddd:bb:dd.f``, so [:4] is the domain
            rid = f"pci{dev.bus_id[:4]}:00"
            members.setdefault(rid, []).append(dev.bus_id)
            meta.setdefault(rid, (0, None))
    roots = [
        RootComplex(id=rid, numa_node=meta[rid][0], bdfs=tuple(bdfs), cpulist=meta[rid][1])
        for rid, bdfs in members.items() if bdfs
    ]
    root_of = {bdf: root for root in roots for bdf in root.bdfs}
    return roots, root_of


#: The blocks whose readings move in the mock NVML library (utilization,
#: power, temperature, clocks, memory used); an override there pins them.
_READING_BLOCKS = ("utilization", "memory", "power", "thermal", "clocks",
                   "clocks_throttle_reasons", "performance_state")


def _pins(patch: Mapping[str, Any], top: bool = True) -> dict[str, Any]:
    """The reading fields an overrides patch sets, each as ``True``.

    The engine config carries them as ``pinned.<field>``: the library then
    answers the overridden value rather than a pattern's or a workload's, and
    a ``mokka ctl reset`` (which drops the override) lets the reading move again.
    """
    return {key: _pins(value, top=False) if isinstance(value, Mapping) else True
            for key, value in patch.items()
            if not top or key in _READING_BLOCKS}


def _gpu(
    dev: DeviceSpec,
    node_name: str,
    root: RootComplex,
    placement: tuple[str, int] | None,
    overrides: Overrides | None,
) -> tuple[Gpu, list[Xid]]:
    """One GPU of the state, and the Xids injected into it.

    ``fields`` starts as a copy of the merged profile config (the profile
    value is shared by every compile and must stay untouched), takes the
    per-node identities and the canonical bus id, then the clique, then
    each overrides layer.  The typed ``Gpu`` attributes are read from the
    result, so an override of, say, ``failure.mode`` shows in both.
    """
    uuid = identity.gpu_uuid(node_name, dev.index, dev.uuid)
    fields = deep_merge({}, dev.config)
    fields.update(
        index=dev.index, uuid=uuid, serial=identity.gpu_serial(node_name, dev.index, dev.serial),
        minor_number=dev.minor_number,
    )
    # the canonical spelling, so ``fields`` and ``Gpu.bus_id`` never disagree
    fields["pci"]["bus_id"] = dev.bus_id
    # Only GPUs that have a fabric block join the clique: a listed node's
    # pre-Hopper GPUs must not start reporting fabric info.
    if placement is not None and isinstance(fields.get("fabric"), Mapping):
        fields["fabric"].update(cluster_uuid=placement[0], clique_id=placement[1],
                                state="completed")
    # Xid lists are taken out of every layer before merging: ``deep_merge``
    # replaces lists, so an override's ``xids`` would otherwise drop the
    # profile's.  Each entry keeps the label of the layer it came from.
    xid_entries = [(f"profile.xids[{i}]", x) for i, x in enumerate(fields.pop("xids", None) or ())]
    # ``failure`` does merge, so its ``xid`` is the strongest layer's; the
    # label names that layer, so the same code set by another layer is
    # another Xid.
    failure_xid_label = "profile.failure.xid"
    pins: dict[str, Any] = {}
    for label, patch in overrides.layers_for(dev.index, uuid) if overrides is not None else ():
        patch = dict(patch)
        xid_entries.extend((f"{label}.xids[{i}]", x)
                           for i, x in enumerate(patch.pop("xids", None) or ()))
        if isinstance(patch.get("failure"), Mapping) and "xid" in patch["failure"]:
            failure_xid_label = f"{label}.failure.xid"
        fields = deep_merge(fields, patch)
        pins = deep_merge(pins, _pins(patch))
    if pins:
        fields["pinned"] = pins
    failure_block = fields.get("failure") or {}
    if isinstance(failure_block.get("xid"), Mapping):
        xid_entries.append((failure_xid_label, failure_block["xid"]))
    xids = [_xid(dev.index, label, entry) for label, entry in xid_entries]

    pci = fields["pci"]
    device_id = int(pci["device_id"])
    subsystem_id = int(pci.get("subsystem_id") or 0)
    platform = fields.get("platform") if isinstance(fields.get("platform"), Mapping) else {}
    gpu = Gpu(
        index=dev.index,
        minor=dev.minor_number,
        uuid=uuid,
        serial=fields["serial"],
        name=fields["name"],
        brand=str(fields.get("brand") or "nvidia"),
        architecture=str(fields.get("architecture") or "unknown"),
        bus_id=dev.bus_id,
        # pci.device_id packs (device << 16) | vendor, as NVML's pciDeviceId does
        pci_vendor_id=device_id & 0xFFFF,
        pci_device_id=device_id >> 16,
        pci_subsystem_vendor_id=subsystem_id & 0xFFFF,
        pci_subsystem_device_id=subsystem_id >> 16,
        root_complex=root.id,
        numa_node=root.numa_node,
        module_id=platform.get("module_id"),
        fabric=_fabric(fields.get("fabric")),
        failure=_failure(failure_block),
        fields=fields,
    )
    return gpu, xids


def _xid(gpu_index: int, label: str, entry: Mapping[str, Any]) -> Xid:
    """An Xid with a stable id: 16 hex digits (64 bits) of a hash, no collision in practice.

    The kernel log announcer and the mock library remember delivered ids,
    so the id must be the same every time the same input compiles and must
    differ for a new injection.
    """
    code = int(entry["code"])
    explicit = entry.get("id")
    # An explicit id (what `mokka ctl xid` writes) names the injection wherever
    # it sits; otherwise the entry's place in the inputs does.
    basis = f"id\0{explicit}" if explicit else f"at\0{label}"
    digest = hashlib.sha256(f"{gpu_index}\0{code}\0{basis}".encode()).hexdigest()
    return Xid(id=f"xid-{digest[:16]}", gpu_index=gpu_index, code=code)


def _fabric(block: Any) -> Fabric | None:
    """The typed fabric identity: UUID lower-cased, all zeros and clique 0 when unset."""
    # No state, no fabric identity: an override that only pins ``fabric.health``
    # must not make a pre-Hopper GPU report fabric info (or start a fabric manager).
    if not isinstance(block, Mapping) or block.get("state") is None:
        return None
    return Fabric(
        cluster_uuid=str(block.get("cluster_uuid") or ZERO_UUID).lower(),
        clique_id=int(block.get("clique_id") or 0),
        state=str(block.get("state") or "auto").lower(),
    )


def _failure(block: Mapping[str, Any]) -> Failure:
    """The typed failure injection; no block (or an empty one) is a healthy GPU."""
    if not block:
        return Failure()
    probability = block.get("probability")
    return Failure(
        mode=str(block.get("mode") or "healthy").lower(),
        after_calls=block.get("after_calls"),
        probability=None if probability is None else float(probability),
        seed=block.get("seed"),
    )


def _nvlink(profile: Profile) -> Nvlink | None:
    """The profile's NVLink block as the state's value; ``None``: no NVLink at all."""
    spec = profile.nvlink
    if spec is None:
        return None
    return Nvlink(
        version=spec.version, links_per_gpu=spec.links_per_gpu,
        bandwidth_per_link_mbps=spec.bandwidth_per_link_mbps, c2c_enabled=spec.c2c_enabled,
        switches=tuple(NvlinkSwitch(bdf=s.bdf, uuid=s.uuid) for s in spec.switches),
        fields=spec.fields,
    )


def _check_fabric_size(topology: Topology, node_name: str) -> None:
    """Refuse a topology whose InfiniBand fabric (its nodes, when it names this
    node) no spine switch can hold: the ib simulator would fail every stage,
    leaving the node unready, where a bad input keeps the last good state."""
    nodes = {n for domain in topology.domains for clique in domain.cliques for n in clique.nodes}
    if node_name in nodes and len(nodes) > MAX_FABRIC_NODES:
        raise SpecError(
            f"{topology.source or 'topology'}: domains: {len(nodes)} nodes in this node's "
            f"InfiniBand fabric, expected at most {MAX_FABRIC_NODES} (one spine switch port "
            "per node)")


def _infiniband(profile: Profile, node_name: str, gpu_count: int) -> Infiniband | None:
    """The node's HCAs, with GUIDs derived from its name; ``None`` when IB is off.

    Without an explicit ``hca_count`` the count follows the exposed GPUs
    (``num_devices`` shrinks it too), clamped to 1..``MAX_HCAS``, the range the
    ib simulator renders and the profile parser allows for ``hca_count``.
    """
    spec = profile.infiniband
    if spec is None:
        return None
    count = spec.hca_count or min(MAX_HCAS, max(1, gpu_count * spec.hcas_per_gpu))
    return Infiniband(
        hca_type=spec.hca_type, fw_version=spec.fw_version, hw_rev=spec.hw_rev,
        board_id=spec.board_id, link_layer=spec.link_layer, rate_gbps=spec.rate_gbps,
        port_state=spec.port_state, phys_state=spec.phys_state, hca_count=count,
        node_guids=identity.ib_node_guids(node_name, count, spec.guid_prefix),
        node_desc_template=spec.node_desc_template,
    )
