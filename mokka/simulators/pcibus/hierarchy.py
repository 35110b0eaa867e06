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

The GPUs and NVSwitches the bridges lead to, with their ids and links, are
``endpoints.py``'s; this module places them.
"""

from __future__ import annotations

from typing import Any

import attrs

from mokka.errors import SpecError
from mokka.simulators.pcibus.endpoints import (
    Endpoint,
    Link,
    plan_endpoints,
    split_bdf,
    split_root,
)
from mokka.state.cpulists import format_cpulist, format_cpumask, parse_cpulist
from mokka.state.model import RootComplex, State

#: ``0x060400``: bridge, PCI-to-PCI.
CLASS_PCI_BRIDGE = 0x060400

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
    endpoints = plan_endpoints(state, roots)
    cpus, nbits = _cpus(state, roots, fallback_cpus)

    # Device numbers already taken on each (domain, bus).
    occupied: dict[tuple[int, int], set[int]] = {}
    for ep in endpoints:
        domain, bus, device, _ = split_bdf(ep.bdf)
        occupied.setdefault((domain, bus), set()).add(device)

    # One bridge per (root, downstream bus), allocated in bus order.  Endpoints
    # on their root's own bus are not in here: they hang off the root.
    downstream: dict[tuple[str, int, int], list[Endpoint]] = {}
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
