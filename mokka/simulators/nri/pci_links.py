"""The PCI bus as links, for ``--nri-sys-devices``: one staged directory per function.

On a real node ``/sys/bus/pci/devices/<bdf>`` is a link,
``../../../devices/pci<domain>:<bus>/.../<bdf>``, and programs that look
for a device's PCIe root (the DRA driver's ``pcieRoot``,
``filepath.EvalSymlinks``) follow it.  A bind mount cannot put a link at a
path, and a container must see only its own GPUs' links, so the plugin
mounts at ``/sys/bus/pci/devices`` a read-only overlay whose lower layers
are one directory per visible function, each holding just that function's
link.  The directories are staged here (under the owner ``nri``) for every
function of the PCI tree ``pcibus`` stages, and a directory with nothing in
it, since an overlay without an upper layer needs two lower ones.

Directory names are the BDF with ``-`` for ``:``, since the overlay's
``lowerdir`` option separates its layers with ``:``.
"""

from __future__ import annotations

from mokka import layout
from mokka.noderoot import Artifact, Directory, Symlink
from mokka.simulators.pcibus.hierarchy import PciTree

#: Manifest owner of the staged link directories.
OWNER = "nri"
#: Where the per-function directories are staged (a node path).
PCI_LINKS = f"{layout.STATE_ROOT}/nri/pci-devices"
#: The layer with nothing in it (no BDF has this name).
EMPTY = "none"
#: Where a link sits in a container, relative to ``/sys``.
_BUS_TO_SYS = "../../../"


def link_dir(bdf: str) -> str:
    """The name of ``bdf``'s directory below ``PCI_LINKS``."""
    return bdf.replace(":", "-")


def link_artifacts(tree: PciTree) -> list[Artifact]:
    """Every function's directory with its one link, and the empty layer.

    The link's text is the one a real node's bus holds: relative to
    ``/sys/bus/pci/devices`` in the container, so it resolves there, not on
    the node.
    """
    artifacts: list[Artifact] = [Directory(f"{PCI_LINKS}/{EMPTY}")]
    for fn in tree.functions:
        artifacts.append(
            Symlink(f"{PCI_LINKS}/{link_dir(fn.bdf)}/{fn.bdf}", _BUS_TO_SYS + fn.path)
        )
    return artifacts
