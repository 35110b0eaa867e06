"""The endpoints of the PCI hierarchy: the GPUs and NVSwitches a ``State`` calls for.

Each endpoint is a GPU or NVSwitch with its ids, class, root complex and
PCIe link, before ``hierarchy.py`` gives it a bridge, a path and an IRQ.
Apart from the plan because what an endpoint *is* (its ids and link, read
from the profile) does not depend on where the plan puts it, and the
NVSwitch id table serves the engine config too (``nvswitch_device_id``)
without the rest of the plan.

Every GPU comes from the state; every NVSwitch the profile lists takes the
id of the node's GPU generation and sits under the root complex of its
domain that firmware would give its bus.  Bad profile values an endpoint
needs raise ``SpecError`` naming the profile field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from mokka.errors import SpecError
from mokka.state.device_checks import pcie_link_problem
from mokka.state.model import Gpu, RootComplex, State

#: PCI vendor id of NVIDIA (the ``10de`` of NFD's ``pci-10de.present``).
NVIDIA_VENDOR = 0x10DE
#: ``0x030200``: display controller, 3D controller (what datacenter GPUs report).
CLASS_3D_CONTROLLER = 0x030200
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
class Endpoint:
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


def plan_endpoints(state: State, roots: dict[str, RootComplex]) -> list[Endpoint]:
    """The GPUs, then the NVSwitches, each on its own address (``SpecError`` otherwise).

    NVSwitches take the id of the node's GPU generation and the highest
    link generation of its GPUs (they share the baseboard), on a x4 link.
    ``roots`` may gain a root for a switch in a GPU-less domain.
    """
    endpoints: list[Endpoint] = []
    links = {gpu.index: _gpu_link(state, gpu) for gpu in state.gpus}
    for gpu in state.gpus:
        endpoints.append(
            Endpoint(
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
                Endpoint(
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
