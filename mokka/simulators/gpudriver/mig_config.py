"""A MIG-capable GPU's profile table and mode rules, as engine-config entries.

The library answers ``nvmlDeviceGetGpuInstanceProfileInfo`` and the MIG
mode setter's activation status from ``device.<n>.mig.*``; the table
itself is data in ``mokka.state.mig_profiles`` (the guide's), rendered
here only for a GPU whose profile has a ``mig`` block (a MIG-capable
board) and whose name the table knows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mokka.state import mig_profiles
from mokka.state.model import Gpu


def mig_entries(gpu: Gpu) -> Iterator[tuple[str, Any]]:
    """``mig.*`` entries of ``gpu``: nothing when the board is not MIG capable."""
    table = mig_profiles.board(gpu.name)
    if table is None or not isinstance(gpu.fields.get("mig"), dict):
        return
    yield "mig.reset_for_mode", "enabled" if table.reset_for_mode else "disabled"
    yield "mig.memory_slices", mig_profiles.MEMORY_SLICES
    yield "mig.gi_count", len(table.profiles)
    for k, profile in enumerate(table.profiles):
        prefix = f"mig.gi.{k}"
        yield f"{prefix}.name", profile.name
        yield f"{prefix}.nvml_id", profile.nvml_id
        yield f"{prefix}.smi_id", profile.smi_id
        yield f"{prefix}.slices", profile.slices
        yield f"{prefix}.memory_mib", profile.memory_mib
        yield f"{prefix}.instances", profile.instances
        yield f"{prefix}.multiprocessors", profile.multiprocessors
        yield f"{prefix}.decoders", profile.decoders
        yield f"{prefix}.jpegs", profile.jpegs
        yield f"{prefix}.ofas", profile.ofas
        yield f"{prefix}.size", profile.size
        yield f"{prefix}.starts", ",".join(str(s) for s in profile.starts)
