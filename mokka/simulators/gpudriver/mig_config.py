"""A MIG-capable GPU's profile table and mode rules, as engine-config entries.

The library answers ``nvmlDeviceGetGpuInstanceProfileInfo`` and the MIG
mode setter's activation status from ``device.<n>.mig.*``; the table
itself is data in ``mokka.state.mig_profiles`` (the guide's), rendered
here only for a GPU whose profile has a ``mig`` block (a MIG-capable
board) and whose name the table knows.  So is the layout in force, a
declared one checked against the table here, and the ``nvidia-cap`` minor
of each of its instances as the driver numbers them (``mig_caps``): the
library shows a process only the MIG devices whose capability nodes it
can see, and takes the numbering from here rather than repeat it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mokka.errors import SpecError
from mokka.simulators.gpudriver import mig_caps
from mokka.simulators.gpudriver.config_lines import flatten
from mokka.state import mig_layout, mig_profiles
from mokka.state.model import Gpu


def mig_entries(gpu: Gpu, profile_name: str) -> Iterator[tuple[str, Any]]:
    """``mig.*`` entries of ``gpu``: nothing when the board is not MIG capable.

    The layout in force (``mig_layout.current``) goes in as
    ``mig.instances``; a declared ``mig.layout`` the board cannot hold is a
    ``SpecError`` naming the profile, the field and what the board holds.
    """
    table = mig_profiles.board(gpu.name)
    mig = gpu.fields.get("mig")
    if "layout" in (mig if isinstance(mig, dict) else {}):
        _check_declared(gpu, profile_name, table, mig)
    if table is None or not isinstance(mig, dict):
        return
    yield from flatten({"mig": {"instances": mig_layout.current(gpu.name, mig)}},
                       where=f"gpu {gpu.index}")
    yield from _cap_minors(gpu)
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


def _check_declared(gpu: Gpu, profile_name: str, table: mig_profiles.MigBoard | None,
                    mig: dict[str, Any]) -> None:
    where = f"{profile_name}: devices[index={gpu.index}].mig.layout"
    if table is None:
        raise SpecError(f"{where}: {gpu.name} is not MIG capable, expected no layout")
    if mig.get("mode_current") != "enabled":
        raise SpecError(f"{where}: needs mig.mode_current: enabled, got "
                        f"{mig.get('mode_current')!r}")
    try:
        mig_layout.declared(table, mig["layout"])
    except mig_layout.LayoutRefusal as refusal:
        raise SpecError(f"{where}: {gpu.name}: {refusal.reason}") from None


def _cap_minors(gpu: Gpu) -> Iterator[tuple[str, int]]:
    """``mig.caps.gi<I>.access`` and ``mig.caps.gi<I>.ci<C>.access``: the minor
    of each MIG device's two capability nodes, named as procfs names them."""
    # Each key once: a GPU instance may hold several compute instances, and a
    # hand-written layout may name an instance twice (a repeated key would
    # make the whole config one the library refuses).
    minors = {}
    for device in mig_caps.mig_devices(gpu):
        minors[f"mig.caps.gi{device.gi}.access"] = device.gi_cap.minor
        minors[f"mig.caps.gi{device.gi}.ci{device.ci}.access"] = device.ci_cap.minor
    yield from minors.items()
