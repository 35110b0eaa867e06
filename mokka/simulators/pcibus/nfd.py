"""The Node Feature Discovery local feature file (pcibus Apply).

NFD's ``local`` source reads every file in its ``features.d`` directory and
turns each ``name=value`` line into a node label
``feature.node.kubernetes.io/<name>=<value>``.  NFD's own PCI source cannot
see the mock tree (its worker is a static Go binary, beyond the reach of
``libmockfs.so``), so Apply states the one fact GPU consumers select on:
``pci-10de.present=true`` (the GPU Operator's node selector).  The file is
ours alone: the directory is shared with other writers and is never wiped.
"""

from __future__ import annotations

from mokka.noderoot import Artifact, File
from mokka.state.model import State

#: Our file in the features directory.
FEATURE_FILE = "mokka.features"


def feature_lines(state: State) -> list[str]:
    """One ``pci-<vendor>.present=true`` line per PCI vendor of the GPUs."""
    vendors = sorted({gpu.pci_vendor_id for gpu in state.gpus})
    return [f"pci-{vendor:04x}.present=true" for vendor in vendors]


def feature_artifacts(state: State, features_dir: str) -> list[Artifact]:
    """The feature file, or nothing when the state has no GPU to announce."""
    lines = feature_lines(state)
    if not lines:
        return []
    return [File(f"{features_dir.rstrip('/')}/{FEATURE_FILE}", "".join(f"{ln}\n" for ln in lines))]
