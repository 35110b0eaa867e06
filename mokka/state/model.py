"""The compiled desired state: the one value every simulator reads.

``mokka.state.compile`` turns profile + topology document + overrides + node
meta into a ``State``; nothing else constructs one outside tests.  All classes
are frozen: a pass reads a consistent snapshot while the sources prepare the
next one.  (ARCHITECTURE §9 names only ``compile.py``; the model lives in its
own module so simulators can import the types without the compiler and its
YAML machinery.)

Conventions:

* PCI addresses are canonical ``dddd:bb:dd.f`` in lower case (sysfs spelling);
  ``Gpu.nvml_bus_id`` gives NVML's 8-digit upper-case spelling.
* Every raw profile field a device has (after ``device_defaults`` < device
  entry < overrides ``all`` < overrides device) is kept in ``Gpu.fields`` as
  plain nested dicts, so the engine config can carry fields the typed
  attributes do not name.  Treat it as read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class SystemDmi:
    """The host system's DMI identity as the profile states it (``system.dmi``).

    What ``/sys/class/dmi/id`` shows: GPU feature discovery's ``gpu.machine``
    is ``product_name``.  A field left ``None`` is filled in by the pcibus
    simulator from the systems it knows carry the board.
    """

    sys_vendor: str | None = None
    product_name: str | None = None
    product_family: str | None = None
    board_vendor: str | None = None
    board_name: str | None = None


@attrs.frozen
class System:
    driver_version: str
    nvml_version: str
    cuda_version_major: int
    cuda_version_minor: int
    dmi: SystemDmi = attrs.field(factory=SystemDmi)

    @property
    def cuda_driver_version(self) -> int:
        """NVML's integer form: 12.4 → 12040."""
        return self.cuda_version_major * 1000 + self.cuda_version_minor * 10


@attrs.frozen
class Fabric:
    """A GPU's NVLink fabric identity (``nvmlDeviceGetGpuFabricInfo``)."""

    cluster_uuid: str
    clique_id: int
    #: ``completed`` | ``in_progress`` | ``not_started`` | ``not_supported`` | ``auto``
    #: (``auto``: in progress until the fabric manager's readiness marker exists).
    state: str


@attrs.frozen
class Failure:
    """Failure injection for one GPU (from the profile's ``failure`` or overrides)."""

    #: ``healthy`` | ``lost`` | ``fallen_off_bus`` | ``ecc_uncorrectable``
    mode: str = "healthy"
    after_calls: int | None = None
    probability: float | None = None
    seed: int | None = None


@attrs.frozen
class Xid:
    """One injected Xid: announced once on the kernel log and once through NVML events.

    ``id`` is stable across recompiles of the same input (and daemon restarts),
    so the kernel log announcer and the library deliver it exactly once.
    """

    id: str
    gpu_index: int
    code: int


@attrs.frozen
class Gpu:
    index: int
    minor: int
    uuid: str
    serial: str
    name: str
    brand: str
    architecture: str
    #: canonical lower-case ``dddd:bb:dd.f``
    bus_id: str
    pci_vendor_id: int
    pci_device_id: int
    pci_subsystem_vendor_id: int
    pci_subsystem_device_id: int
    #: ``pciDDDD:BB`` root complex id this GPU sits under
    root_complex: str
    numa_node: int
    module_id: int | None = None
    fabric: Fabric | None = None
    failure: Failure = Failure()
    fields: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def nvml_bus_id(self) -> str:
        """NVML's spelling: 8-digit domain, upper case (``00000000:53:00.0``)."""
        domain, bus, devfn = self.bus_id.split(":", 2)
        return f"{int(domain, 16):08X}:{bus.upper()}:{devfn.upper()}"

    @property
    def bus(self) -> int:
        return int(self.bus_id.split(":")[1], 16)


@attrs.frozen
class NvlinkSwitch:
    bdf: str
    uuid: str


@attrs.frozen
class Nvlink:
    version: int
    links_per_gpu: int
    bandwidth_per_link_mbps: int
    c2c_enabled: bool = False
    switches: tuple[NvlinkSwitch, ...] = ()
    fields: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)


@attrs.frozen
class RootComplex:
    #: ``pciDDDD:BB``
    id: str
    numa_node: int
    #: canonical BDFs of the GPUs under this root, in profile order
    bdfs: tuple[str, ...] = ()
    #: CPU list for ``local_cpulist`` when the profile gives one (e.g. ``0-55``)
    cpulist: str | None = None


@attrs.frozen
class Infiniband:
    hca_type: str
    fw_version: str
    hw_rev: str
    board_id: str
    link_layer: str
    rate_gbps: int
    port_state: str
    phys_state: str
    hca_count: int
    #: per-HCA node GUIDs derived from the node name (``0x`` + 16 hex digits)
    node_guids: tuple[str, ...] = ()
    node_desc_template: str = "{node_name} mlx5_{idx}"


@attrs.frozen
class Clique:
    id: int
    nodes: tuple[str, ...]


@attrs.frozen
class Domain:
    uuid: str
    cliques: tuple[Clique, ...]
    name: str | None = None


@attrs.frozen
class Topology:
    """The ComputeDomain document, parsed, plus its text to stage verbatim."""

    domains: tuple[Domain, ...]
    #: the document as read (staged by the nvlink simulator)
    text: str = attrs.field(eq=True, repr=False)
    source: str = ""

    def placement(self, node_name: str) -> tuple[str, int] | None:
        """(domain uuid, clique id) of the first clique listing ``node_name``."""
        for domain in self.domains:
            for clique in domain.cliques:
                if node_name in clique.nodes:
                    return domain.uuid, clique.id
        return None


@attrs.frozen
class State:
    """Everything the node should look like, for one generation."""

    #: increases by one for every state a source emits with a new content hash
    generation: int
    #: sha256 over the canonical inputs; equal inputs give equal hashes
    content_hash: str
    node_name: str
    #: built-in profile name or the path it was read from
    profile_name: str
    system: System
    gpus: tuple[Gpu, ...]
    pcie_roots: tuple[RootComplex, ...] = ()
    nvlink: Nvlink | None = None
    infiniband: Infiniband | None = None
    topology: Topology | None = None
    #: injected Xids, from the profile's failure blocks and the overrides
    xids: tuple[Xid, ...] = ()
    feature_gates: Mapping[str, bool] = attrs.field(factory=dict)
    #: the profile's top-level mapping as loaded (for fields no typed part names)
    profile_fields: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def has_nvswitch(self) -> bool:
        """NVSwitch systems run a fabric manager (switches listed, or fabric state auto)."""
        if self.nvlink is not None and self.nvlink.switches:
            return True
        return any(g.fabric is not None and g.fabric.state == "auto" for g in self.gpus)

    @property
    def fabric_attached(self) -> bool:
        """Multi-node NVLink (GB200/GB300 style): IMEX is on for these by default.

        A profile is fabric-attached when its GPUs pair with Grace CPUs over
        C2C and carry a fabric identity: the NVL72 shape.
        """
        return bool(
            self.nvlink is not None
            and self.nvlink.c2c_enabled
            and any(g.fabric is not None for g in self.gpus)
        )

    def gpu(self, index: int) -> Gpu:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(index)
