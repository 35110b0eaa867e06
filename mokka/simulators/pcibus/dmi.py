"""The DMI identity of the board's system, as ``/sys/class/dmi/id`` shows it.

GPU feature discovery labels ``nvidia.com/gpu.machine`` from
``/sys/class/dmi/id/product_name``, and inventory tools read the vendor and
board names beside it; without this they would see the machine the daemon
runs on.  The kernel keeps these attributes on a virtual device and links
the class directory to it::

    devices/virtual/dmi/id/{sys_vendor,product_name,product_family,
                            board_vendor,board_name}      (0444, one line each)
    class/dmi/id -> ../../devices/virtual/dmi/id

A profile states its system with ``system.dmi`` (every built-in profile
whose system is known does); each attribute it leaves out follows from the
state's board (its GPUs' name and how many there are), matched against the
systems that carry those boards, so a profile written before the field
existed still gets its system's identity:

* 8x ``NVIDIA H100 80GB HBM3``: NVIDIA DGX H100, ``NVIDIA``/``DGXH100``
  (the product name NVIDIA's own MLPerf tooling reads back as the system
  name, NVIDIA/mlperf-common#7; family ``DGX`` as DGX systems report it,
  lablup/backend.ai#113).
* 8x ``NVIDIA B200``: NVIDIA DGX B200, ``NVIDIA``/``DGXB200`` (the b200
  profile numbers its buses as a DGX B200 does; the name follows the DGX
  H100's spelling, no public capture of it was found).
* 4x ``NVIDIA GB300``: a Supermicro GB300 NVL72 compute tray,
  ``Supermicro``/``ARS-121GL-NB3-LCC-R1`` (the tray of Supermicro's
  SRS-GB300-NVL72 rack, netbox-community/devicetype-library#4508).
* anything else (the cloud VM profiles a100, l40s, t4, and the GB200 tray,
  whose OEM identity has no public capture): the generic identity below,
  which names the simulator rather than guessing a vendor.
"""

from __future__ import annotations

from collections import Counter

import attrs

from mokka import layout
from mokka.noderoot import Artifact, File, Symlink
from mokka.state.model import State

#: The directory the kernel keeps DMI attributes in, below the mock ``/sys``.
DMI_DEVICE_DIR = "devices/virtual/dmi/id"
#: The class view every reader opens, a link to ``DMI_DEVICE_DIR``.
DMI_CLASS_DIR = "class/dmi/id"


@attrs.frozen
class DmiIdentity:
    """What ``/sys/class/dmi/id`` says about the system."""

    sys_vendor: str
    product_name: str
    product_family: str
    board_vendor: str
    board_name: str


#: A system Mokka knows no real identity for.
GENERIC = DmiIdentity(
    sys_vendor="Mokka",
    product_name="Mokka simulated GPU node",
    product_family="Mokka",
    board_vendor="Mokka",
    board_name="Mokka simulated GPU node",
)

#: (GPU name, GPU count) → the system that carries that board.
KNOWN_SYSTEMS: dict[tuple[str, int], DmiIdentity] = {
    ("NVIDIA H100 80GB HBM3", 8): DmiIdentity("NVIDIA", "DGXH100", "DGX", "NVIDIA", "DGXH100"),
    ("NVIDIA B200", 8): DmiIdentity("NVIDIA", "DGXB200", "DGX", "NVIDIA", "DGXB200"),
    ("NVIDIA GB300", 4): DmiIdentity(
        "Supermicro", "ARS-121GL-NB3-LCC-R1", "GB300 NVL72", "Supermicro",
        "ARS-121GL-NB3-LCC-R1",
    ),
}


def system_identity(state: State) -> DmiIdentity:
    """The identity of the system carrying ``state``'s GPUs: what the profile's
    ``system.dmi`` states, the rest from ``board_system``."""
    stated = {name: value for name, value in attrs.asdict(state.system.dmi).items()
              if value is not None}
    return attrs.evolve(board_system(state), **stated)


def board_system(state: State) -> DmiIdentity:
    """The system known to carry ``state``'s GPUs (``GENERIC`` when unknown).

    A node whose GPUs are not all one model is no system we know.
    """
    names = Counter(gpu.name for gpu in state.gpus)
    if len(names) != 1:
        return GENERIC
    ((name, count),) = names.items()
    return KNOWN_SYSTEMS.get((name, count), GENERIC)


def dmi_artifacts(identity: DmiIdentity) -> list[Artifact]:
    """The DMI attribute files and the class link, under ``mokka.layout.SYS_ROOT``."""
    base = f"{layout.SYS_ROOT}/{DMI_DEVICE_DIR}"
    files: list[Artifact] = [
        File(f"{base}/{field.name}", f"{getattr(identity, field.name)}\n", 0o444)
        for field in attrs.fields(DmiIdentity)
    ]
    link = Symlink(f"{layout.SYS_ROOT}/{DMI_CLASS_DIR}", "../../" + DMI_DEVICE_DIR)
    return [*files, link]
