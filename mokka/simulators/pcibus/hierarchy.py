"""The PCI hierarchy a ``State`` calls for, as plain values (no filesystem).

Every GPU sits behind a PCIe switch downstream port (a bridge) on its root
complex's bus, the way GPUs sit on HGX baseboards, and every NVSwitch the
profile lists sits behind its own.  Real hosts show exactly this shape in
``lspci -t``; consumers that walk ``/sys/devices`` to find a GPU's PCIe
root (the DRA driver's ``pcieRoot``, ``nvidia-smi topo``) see a real
hierarchy instead of GPUs hanging off the root complex.

Bridge addresses.  A bridge lives on its root complex's bus (``pci0000:80``
→ bus 0x80) and owns the GPU's bus as its secondary and subordinate bus.
Its device number is the lowest one in 1..31 (then 0) that no GPU, NVSwitch
or other bridge already uses on that bus, allocated in order of the
downstream bus number; past 32 ports a root bus has no device number left,
and further ports become functions 1..7 of the ports' devices
(multi-function root ports, as real root complexes have), so one root
takes as many GPUs as the engine config does.  GPUs and NVSwitches sit on *their own* buses (the
bus in their BDF), so a bridge can only collide with an endpoint whose BDF
is on the root bus itself; the allocation skips those.  An endpoint whose
bus *is* its root's bus hangs directly off the root complex, without a
bridge, since a bridge's secondary bus must differ from its primary one.

Switch ids.  ``10b5:c010`` is not in pci.ids: PLX's Gen 4 and Gen 5 switches
carry Broadcom's vendor id.  The bridge takes a real switch id matching the
link generation below it: Broadcom PEX890xx (``1000:c030``, what HGX H100
boards carry) for Gen 5 and up, PEX880xx (``1000:c010``, HGX A100) for
Gen 4, PLX PEX 8747 (``10b5:8747``) for older links.

The plan is values only, so tests check it without a filesystem, and it is
rendered by ``sysfs.py`` and ``config_space.py`` without either of them
deciding anything.  Everything here is deterministic in the state: equal
states give equal trees, which is what lets a second Stage rewrite
nothing.  Bad profile values the tree needs raise ``SpecError`` naming the
profile field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from mokka.errors import SpecError
from mokka.state.cpulists import format_cpulist, format_cpumask, parse_cpulist
from mokka.state.device_checks import pcie_link_problem
from mokka.state.model import Gpu, RootComplex, State

#: PCI vendor id of NVIDIA (the ``10de`` of NFD's ``pci-10de.present``).
NVIDIA_VENDOR = 0x10DE
#: ``0x030200``: display controller, 3D controller (what datacenter GPUs report).
CLASS_3D_CONTROLLER = 0x030200
#: ``0x060400``: bridge, PCI-to-PCI.
CLASS_PCI_BRIDGE = 0x060400
#: ``0x068000``: bridge, other (what NVSwitch functions report).
CLASS_OTHER_BRIDGE = 0x068000

#: NVSwitch PCI device ids by GPU architecture.  Ampere boards carry the
#: ``GA100 [A100 NVSwitch]`` (``1af1``, named in pci.ids); Hopper boards the
#: third-generation NVSwitch ``22a3``.  Later generations' ids are not
#: public in pci.ids, so they fall back to ``22a3``.  The one table of
#: them: the engine config hands the id ``nvswitch_device_id`` picks to the
#: mock NVML library (``nvlink.switch.<i>.pci_device_id``), which reports it
#: for a link's remote switch (the wiring tests compare it with sysfs).
NVSWITCH_DEVICE_IDS: Mapping[str, int] = {"ampere": 0x1AF1, "hopper": 0x22A3}
DEFAULT_NVSWITCH_DEVICE_ID = 0x22A3
#: NVSwitch management link (not its NVLinks): a narrow PCIe link.
NVSWITCH_LINK_WIDTH = 4

#: When a GPU's profile has no ``pcie`` block: a Gen 4 x16 link, the
#: common denominator of the datacenter GPUs the built-in profiles cover.
DEFAULT_LINK_GEN = 4
DEFAULT_LINK_WIDTH = 16

#: Interrupt numbers, one per function in BDF order, starting above the
#: legacy ISA and first IOAPIC pins (0..23) so none looks like a timer or
#: keyboard line.
FIRST_IRQ = 32

#: (device, function) addresses tried for a bridge on a root bus: function 0
#: of devices 1..31 first (real root buses keep 0 for the host bridge), then
#: 0; past 32 ports, further functions of those devices, as multi-function
#: root ports are on real root complexes.  Function 0 of a device is always
#: taken before its others, as PCI enumeration requires.
_BRIDGE_SLOTS = tuple((device, function) for function in range(8)
                      for device in (*range(1, 32), 0))


@attrs.frozen
class Link:
    """A PCIe link as the Express capability reports it (generation 1..6, lanes).

    ``max_*`` is what the device can do (Link Capabilities, ``LnkCap``),
    ``current_*`` what the link trained to (Link Status, ``LnkSta``).
    """

    max_gen: int
    max_width: int
    current_gen: int
    current_width: int


@attrs.frozen
class PciFunction:
    """One PCI function of the mock tree.

    Everything ``sysfs.py`` writes for it and ``config_space.py`` encodes is
    here, already resolved; the renderers only format.
    """

    #: canonical ``dddd:bb:dd.f``
    bdf: str
    #: ``gpu`` | ``bridge`` | ``nvswitch``
    role: str
    #: 16-bit ids as in config space and the sysfs ``vendor``/``device`` files
    vendor: int
    device: int
    subsystem_vendor: int
    subsystem_device: int
    #: 24-bit class code (``0x030200``)
    class_code: int
    #: the ``pciDDDD:BB`` root complex it belongs to
    root: str
    #: the root's NUMA node (the device plugin reads it for GPU placement)
    numa_node: int
    #: ``local_cpulist`` / ``local_cpus`` contents (without newline)
    cpulist: str
    cpumask: str
    #: path below the sysfs root: ``devices/<root>/[<bridge>/]<bdf>``
    path: str
    link: Link
    #: legacy interrupt line shown in ``irq``; distinct per function
    irq: int
    #: bridges: the bus they lead to (secondary = subordinate)
    secondary_bus: int | None = None
    #: bridges: the bus they sit on (the root complex's bus)
    primary_bus: int | None = None
    #: bound kernel driver (``nvidia`` for GPUs and NVSwitches)
    driver: str | None = None
    #: one of several functions of its device (bridges past 32 ports on a bus)
    multifunction: bool = False

    @property
    def is_bridge(self) -> bool:
        return self.role == "bridge"

    @property
    def header_type(self) -> int:
        """0: a normal device; 1: a PCI-to-PCI bridge; bit 7: a multi-function device."""
        return (1 if self.is_bridge else 0) | (0x80 if self.multifunction else 0)


@attrs.frozen
class PciTree:
    """Every function of the mock tree, sorted by BDF."""

    functions: tuple[PciFunction, ...]

    def by_role(self, role: str) -> tuple[PciFunction, ...]:
        """The functions of one role (``gpu``, ``bridge``, ``nvswitch``), in BDF order."""
        return tuple(f for f in self.functions if f.role == role)


def split_bdf(bdf: str) -> tuple[int, int, int, int]:
    """``0000:1a:00.0`` → (domain, bus, device, function)."""
    domain, bus, devfn = bdf.split(":")
    device, function = devfn.split(".")
    return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)


def split_root(root_id: str) -> tuple[int, int]:
    """``pci0000:80`` → (domain 0, bus 0x80)."""
    domain, bus = root_id[3:].split(":")
    return int(domain, 16), int(bus, 16)


@attrs.frozen
class _Endpoint:
    """A GPU or NVSwitch before bridges exist; ``plan_tree`` gives it a parent and a path."""

    bdf: str
    role: str
    root: RootComplex
    numa_node: int
    vendor: int
    device: int
    subsystem_vendor: int
    subsystem_device: int
    class_code: int
    link: Link


def _gpu_link(state: State, gpu: Gpu) -> Link:
    """The GPU's PCIe link from its profile ``pcie`` block, checked.

    Missing values default to a Gen 4 x16 capability, and the current
    values to the maximum ones (a link trained at full speed).  The
    ``current`` defaults read the ``max`` values already resolved, which
    the loop order guarantees.
    """
    raw: Any = gpu.fields.get("pcie") if isinstance(gpu.fields, Mapping) else None
    if not isinstance(raw, Mapping):
        raw = {}
    values: dict[str, int] = {}
    for key, default in (
        ("max_link_gen", DEFAULT_LINK_GEN),
        ("max_link_width", DEFAULT_LINK_WIDTH),
        ("current_link_gen", None),
        ("current_link_width", None),
    ):
        value = raw.get(key)
        if value is None:
            value = default if default is not None else values[key.replace("current", "max")]
        problem = pcie_link_problem(key, value)
        if problem is None and key.startswith("current") and value > values[
                key.replace("current", "max")]:
            # a link trains at most at what both ends can do: lspci would call it overdriven
            problem = f"found {value!r}, expected at most the max_link_{key.split('_')[-1]}"
        if problem is not None:
            raise SpecError(f"{state.profile_name}: devices[{gpu.index}].pcie.{key}: {problem}")
        values[key] = value
    return Link(
        max_gen=values["max_link_gen"],
        max_width=values["max_link_width"],
        current_gen=values["current_link_gen"],
        current_width=values["current_link_width"],
    )


def _roots(state: State) -> dict[str, RootComplex]:
    """Every root complex a function will sit under, by id (NVSwitch roots may be added later).

    The state's roots hold only GPUs; a root for a GPU-less domain is made
    by ``_switch_root`` when an NVSwitch needs one.
    """
    roots = {root.id: root for root in state.pcie_roots}
    # A state compiled without a PCIe topology still names a root per GPU
    # (the compiler's default pci0000:00 on NUMA 0): honour it.
    for gpu in state.gpus:
        roots.setdefault(
            gpu.root_complex, RootComplex(id=gpu.root_complex, numa_node=gpu.numa_node)
        )
    # NVSwitches but no GPU (only a hand-built state): they still need a root.
    if not roots and state.nvlink is not None and state.nvlink.switches:
        roots["pci0000:00"] = RootComplex(id="pci0000:00", numa_node=0)
    return roots


def _switch_root(roots: dict[str, RootComplex], bdf: str) -> RootComplex:
    """The root complex an NVSwitch sits under: the one of its domain with the
    highest bus number not above the switch's bus (how firmware hands out bus
    ranges), else the lowest one of its domain, else a root for its domain."""
    domain, bus, _, _ = split_bdf(bdf)
    same_domain = sorted(
        (split_root(r.id)[1], r) for r in roots.values() if split_root(r.id)[0] == domain
    )
    if not same_domain:
        root = RootComplex(id=f"pci{domain:04x}:00", numa_node=0)
        roots[root.id] = root
        return root
    below = [r for rbus, r in same_domain if rbus <= bus]
    return below[-1] if below else same_domain[0][1]


def _cpus(
    state: State, roots: dict[str, RootComplex], fallback_cpus: int
) -> tuple[dict[str, tuple[int, ...]], int]:
    """Each root's CPU list, and the mask width shared by all of them.

    The width is the highest CPU any root names, plus one (the kernel prints
    every mask over all CPUs of the machine, so all masks are equally wide).
    A root without a profile ``cpulist`` is local to CPUs ``0..fallback_cpus-1``.
    A bad ``cpulist`` raises ``SpecError`` naming its root's position.
    """
    per_root: dict[str, tuple[int, ...]] = {}
    for index, root in enumerate(state.pcie_roots):
        if root.cpulist is not None:
            try:
                per_root[root.id] = parse_cpulist(root.cpulist)
            except ValueError as exc:
                raise SpecError(
                    f"{state.profile_name}: pcie_topology.root_complexes[{index}].cpulist: {exc}"
                ) from None
    everything = tuple(range(fallback_cpus))
    for root_id in roots:
        per_root.setdefault(root_id, everything)
    nbits = max((max(cpus) + 1 for cpus in per_root.values() if cpus), default=fallback_cpus)
    return per_root, nbits


def _bridge_ids(gen: int) -> tuple[int, int, int, int]:
    """(vendor, device, subsystem vendor, subsystem device) of a switch port for ``gen``.

    Ids pci.ids names, so ``lspci`` prints a real product instead of
    "Device c010"; see the module docstring for which board carries which.
    """
    if gen >= 5:
        return 0x1000, 0xC030, 0x1000, 0x100B  # PEX890xx, "PEX89000 ... Downstream Port"
    if gen == 4:
        return 0x1000, 0xC010, 0x1000, 0x100B  # PEX880xx, "PEX88000 ... Downstream Port"
    return 0x10B5, 0x8747, 0x10B5, 0x8747  # PLX PEX 8747


def nvswitch_device_id(state: State) -> int:
    """The PCI device id of the node's NVSwitches: that of its GPUs' generation.

    Also their subsystem device id (the vendor is NVIDIA's for both).  On a
    mixed node the later generation wins, as its baseboard carries the
    switches; a generation without a public id takes the default.
    """
    architectures = {gpu.architecture.lower() for gpu in state.gpus}
    device_id = DEFAULT_NVSWITCH_DEVICE_ID
    # in table order, so on a mixed node the later generation wins
    for arch, known in NVSWITCH_DEVICE_IDS.items():
        if arch in architectures:
            device_id = known
    return device_id


def _endpoints(state: State, roots: dict[str, RootComplex]) -> list[_Endpoint]:
    """The GPUs, then the NVSwitches, each on its own address (``SpecError`` otherwise).

    NVSwitches take the id of the node's GPU generation and the highest
    link generation of its GPUs (they share the baseboard), on a x4 link.
    ``roots`` may gain a root for a switch in a GPU-less domain.
    """
    endpoints: list[_Endpoint] = []
    links = {gpu.index: _gpu_link(state, gpu) for gpu in state.gpus}
    for gpu in state.gpus:
        endpoints.append(
            _Endpoint(
                bdf=gpu.bus_id,
                role="gpu",
                root=roots[gpu.root_complex],
                numa_node=gpu.numa_node,
                vendor=gpu.pci_vendor_id,
                device=gpu.pci_device_id,
                subsystem_vendor=gpu.pci_subsystem_vendor_id,
                subsystem_device=gpu.pci_subsystem_device_id,
                class_code=CLASS_3D_CONTROLLER,
                link=links[gpu.index],
            )
        )
    switches = state.nvlink.switches if state.nvlink is not None else ()
    if switches:
        device_id = nvswitch_device_id(state)
        gen = max((link.max_gen for link in links.values()), default=DEFAULT_LINK_GEN)
        link = Link(gen, NVSWITCH_LINK_WIDTH, gen, NVSWITCH_LINK_WIDTH)
        for switch in switches:
            root = _switch_root(roots, switch.bdf)
            endpoints.append(
                _Endpoint(
                    bdf=switch.bdf,
                    role="nvswitch",
                    root=root,
                    numa_node=root.numa_node,
                    vendor=NVIDIA_VENDOR,
                    device=device_id,
                    subsystem_vendor=NVIDIA_VENDOR,
                    subsystem_device=device_id,
                    class_code=CLASS_OTHER_BRIDGE,
                    link=link,
                )
            )
    seen: dict[str, str] = {}
    for ep in endpoints:
        if ep.bdf in seen:
            raise SpecError(
                f"{state.profile_name}: PCI address {ep.bdf} is used by both a {seen[ep.bdf]} "
                f"and a {ep.role}, expected every GPU and NVSwitch on its own address"
            )
        seen[ep.bdf] = ep.role
    return endpoints


def plan_tree(state: State, *, fallback_cpus: int) -> PciTree:
    """Lay out every PCI function ``state`` calls for (see the module docstring).

    ``fallback_cpus``: CPUs a root complex is local to when the profile gives
    it no ``cpulist`` (all CPUs ``0..n-1``, what the kernel reports on a
    machine whose firmware gives no locality).

    Steps: collect the endpoints, note which device numbers each bus
    already uses, give every (root, downstream bus) pair one bridge on the
    root's bus, hang each endpoint below its bridge (or the root), then
    sort by address and number the IRQs.  Raises ``SpecError`` for a bad
    link or cpulist, two endpoints on one address, or a root bus with no
    device number left for another bridge.
    """
    roots = _roots(state)
    endpoints = _endpoints(state, roots)
    cpus, nbits = _cpus(state, roots, fallback_cpus)

    # Device numbers already taken on each (domain, bus).
    occupied: dict[tuple[int, int], set[int]] = {}
    for ep in endpoints:
        domain, bus, device, _ = split_bdf(ep.bdf)
        occupied.setdefault((domain, bus), set()).add(device)

    # One bridge per (root, downstream bus), allocated in bus order.  Endpoints
    # on their root's own bus are not in here: they hang off the root.
    downstream: dict[tuple[str, int, int], list[_Endpoint]] = {}
    for ep in endpoints:
        domain, bus, _, _ = split_bdf(ep.bdf)
        if (domain, bus) != split_root(ep.root.id):
            downstream.setdefault((ep.root.id, domain, bus), []).append(ep)

    def place(root: RootComplex, **fields: Any) -> PciFunction:
        """A ``PciFunction`` under ``root``, with the root's CPU list and mask."""
        # IRQs are numbered once everything is sorted (below).
        return PciFunction(
            root=root.id,
            cpulist=format_cpulist(cpus[root.id]),
            cpumask=format_cpumask(cpus[root.id], nbits),
            irq=0,
            **fields,
        )

    functions: list[PciFunction] = []
    # endpoint BDF -> the BDF of the bridge above it
    parent_of: dict[str, str] = {}
    # (domain, root bus) -> (device, function) of the bridges placed there
    bridge_slots: dict[tuple[int, int], set[tuple[int, int]]] = {}
    # Sorted by (domain, bus, root): bridge device numbers follow the buses
    # they lead to, so they depend on the set of buses, never on list order.
    for (root_id, _domain, bus), members in sorted(
        downstream.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])
    ):
        root = roots[root_id]
        root_domain, root_bus = split_root(root_id)
        # Device numbers of endpoints on the root bus are never shared with a port.
        endpoints_here = occupied.get((root_domain, root_bus), set())
        ports = bridge_slots.setdefault((root_domain, root_bus), set())
        slot = next(
            (s for s in _BRIDGE_SLOTS if s not in ports and s[0] not in endpoints_here), None
        )
        if slot is None:
            raise SpecError(
                f"{state.profile_name}: root complex {root_id} has no free device number on "
                f"its bus for another switch port, expected GPUs and NVSwitches on at most "
                f"{len(_BRIDGE_SLOTS)} buses below it and not on every device of its own bus"
            )
        ports.add(slot)
        bridge_bdf = f"{root_domain:04x}:{root_bus:02x}:{slot[0]:02x}.{slot[1]}"
        # The port's downstream link is the endpoint's link; endpoints sharing
        # a bus share the port, and the first one's link stands for it.
        link = members[0].link
        vendor, device, ss_vendor, ss_device = _bridge_ids(link.max_gen)
        functions.append(
            place(
                root,
                bdf=bridge_bdf,
                role="bridge",
                vendor=vendor,
                device=device,
                subsystem_vendor=ss_vendor,
                subsystem_device=ss_device,
                class_code=CLASS_PCI_BRIDGE,
                numa_node=root.numa_node,
                link=link,
                secondary_bus=bus,
                primary_bus=root_bus,
                path=f"devices/{root_id}/{bridge_bdf}",
            )
        )
        for ep in members:
            parent_of[ep.bdf] = bridge_bdf
    for ep in endpoints:
        parent = parent_of.get(ep.bdf)
        base = f"devices/{ep.root.id}" + (f"/{parent}" if parent else "")
        functions.append(
            place(
                ep.root,
                bdf=ep.bdf,
                role=ep.role,
                vendor=ep.vendor,
                device=ep.device,
                subsystem_vendor=ep.subsystem_vendor,
                subsystem_device=ep.subsystem_device,
                class_code=ep.class_code,
                numa_node=ep.numa_node,
                link=ep.link,
                path=f"{base}/{ep.bdf}",
                driver="nvidia",
            )
        )

    # A device whose bridges use more than function 0 is multi-function.
    shared = {
        (domain, bus, device)
        for (domain, bus), slots in bridge_slots.items()
        for device, function in slots
        if function > 0
    }
    functions = [
        attrs.evolve(f, multifunction=True) if f.is_bridge and split_bdf(f.bdf)[:3] in shared
        else f
        for f in functions
    ]
    # Numeric sort (not text), then IRQs in that order: stable for equal states.
    functions.sort(key=lambda f: split_bdf(f.bdf))
    functions = [attrs.evolve(f, irq=FIRST_IRQ + ordinal) for ordinal, f in enumerate(functions)]
    return PciTree(functions=tuple(functions))
