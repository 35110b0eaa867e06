"""The capabilities of a GPU's MIG instances: procfs descriptors and ``nvidia-cap`` nodes.

A process reaches a MIG device through its GPU's node and two capability
nodes, one for its GPU instance and one for its compute instance.  The
driver describes each capability in procfs and the device plugin, the
container toolkit and Slurm's gres scripts read the minor from there, then
hand ``/dev/nvidia-caps/nvidia-cap<minor>`` to the container::

    /proc/driver/nvidia/capabilities/gpu<G>/mig/gi<I>/access
    /proc/driver/nvidia/capabilities/gpu<G>/mig/gi<I>/ci<C>/access

each holding ``DeviceFileMinor:``, ``DeviceFileMode:`` and
``DeviceFileModify:`` lines (``procfs.render_capability``).  The minors
are the driver's fixed numbering (``/proc/driver/nvidia-caps/mig-minors``
on a real host): 1 and 2 are MIG config and monitor, then per GPU minor
``G`` nine minors for each of its 15 GPU instance ids ``I``, the GPU
instance's own then its compute instances 0..7 ``C``::

    gpu<G>/gi<I>/access      3 + 135 G + 9 I
    gpu<G>/gi<I>/ci<C>/access  3 + 135 G + 9 I + 1 + C

(so ``gpu0/gi0/access`` is 3 and ``gpu3/gi3/ci3/access`` is 439, as on a
real host).  Only the instances the GPU's layout holds now exist, as the
driver creates and removes them with the instances; the layout is the
runtime overrides' ``mig.instances`` (``mig_layout``), so a change made by
``nvidia-smi mig`` reaches these files on the daemon's next pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from mokka import layout
from mokka.state import mig_layout
from mokka.state.model import Gpu, State

#: The minors before the first GPU's (MIG config, MIG monitor).
FIRST_GPU_MINOR = 3
#: GPU instance ids per GPU, and minors per GPU instance (its own and 8 CIs).
GI_IDS = 15
MINORS_PER_GI = 9
#: Mode of an instance's access capability: every user may read (0444,
#: ``DeviceFileMode: 292``), as the driver creates them.
ACCESS_MODE = 0o444


def gi_minor(gpu_minor: int, gi: int) -> int:
    """The ``nvidia-cap`` minor of GPU instance ``gi`` on the GPU with minor ``gpu_minor``."""
    return FIRST_GPU_MINOR + GI_IDS * MINORS_PER_GI * gpu_minor + MINORS_PER_GI * gi


def ci_minor(gpu_minor: int, gi: int, ci: int) -> int:
    """The ``nvidia-cap`` minor of compute instance ``ci`` in GPU instance ``gi``."""
    return gi_minor(gpu_minor, gi) + 1 + ci


@attrs.frozen
class MigCap:
    """One instance's capability: its procfs descriptor (relative to
    ``capabilities/``) and the minor of its node."""

    proc_path: str
    minor: int


@attrs.frozen
class MigDevice:
    """One MIG device of a GPU: its GPU and compute instance and their capabilities."""

    gpu: Gpu
    gi: int
    ci: int
    profile: int
    gi_cap: MigCap
    ci_cap: MigCap

    @property
    def uuid(self) -> str:
        return mig_uuid(self.gpu.uuid, self.gi, self.ci)


_MASK = (1 << 64) - 1
_FNV_PRIME = 1099511628211


def _mig_hash(parent: str, gi: int, ci: int, seed: int) -> int:
    """FNV-1a over the parent's UUID and the instance ids, then splitmix64's
    finaliser: the mock NVML library's (``native/nvml/mig_devices.c``)."""
    h = 1469598103934665603 ^ seed
    for byte in [*parent.encode(), gi, ci]:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK
    return h ^ (h >> 31)


def mig_uuid(parent_uuid: str, gi: int, ci: int) -> str:
    """The ``MIG-`` UUID NVML gives the MIG device of these instances on that GPU."""
    a = _mig_hash(parent_uuid, gi, ci, 0)
    b = _mig_hash(parent_uuid, gi, ci, 0x9E3779B97F4A7C15)
    return (f"MIG-{a >> 32:08x}-{(a >> 16) & 0xFFFF:04x}-{(a & 0x0FFF) | 0x4000:04x}-"
            f"{((b >> 48) & 0x3FFF) | 0x8000:04x}-{b & 0xFFFFFFFFFFFF:012x}")


def enabled(gpu: Gpu) -> bool:
    """Whether the GPU's MIG mode is on now."""
    mig = _mig(gpu)
    return mig.get("mode_current") == "enabled"


def mig_devices(gpu: Gpu) -> list[MigDevice]:
    """The GPU's MIG devices in the layout's order (NVML's MIG device index)."""
    return [
        MigDevice(gpu=gpu, gi=int(gi["id"]), ci=int(ci["id"]), profile=int(gi["profile"]),
                  gi_cap=_gi_cap(gpu, gi), ci_cap=_ci_cap(gpu, gi, ci))
        for gi in _instances(gpu) for ci in gi["compute"]
    ]


def capabilities(state: State) -> Iterator[MigCap]:
    """Every instance capability the node's layouts hold, each once.

    A GPU instance without compute instances has its capability too, as
    the driver makes it with the instance.
    """
    for gpu in state.gpus:
        for gi in _instances(gpu):
            yield _gi_cap(gpu, gi)
            for ci in gi["compute"]:
                yield _ci_cap(gpu, gi, ci)


def _instances(gpu: Gpu) -> list[dict[str, Any]]:
    """The layout's instances whose ids the numbering has room for (the
    daemon's own layouts always do; a hand-edited one may not)."""
    if not enabled(gpu):
        return []
    kept = []
    for gi in mig_layout.current(gpu.name, _mig(gpu)):
        if not (_id(gi, GI_IDS) and _id(gi, None, "profile")):
            continue
        compute = [ci for ci in gi["compute"] if _id(ci, MINORS_PER_GI - 1)]
        kept.append({**gi, "compute": compute})
    return kept


def _id(entry: Mapping[str, Any], bound: int | None, key: str = "id") -> bool:
    value = entry.get(key)
    return (isinstance(value, int) and not isinstance(value, bool) and value >= 0
            and (bound is None or value < bound))


def _gi_cap(gpu: Gpu, gi: Mapping[str, Any]) -> MigCap:
    gi_id = int(gi["id"])
    return MigCap(f"gpu{gpu.minor}/mig/gi{gi_id}/access", gi_minor(gpu.minor, gi_id))


def _ci_cap(gpu: Gpu, gi: Mapping[str, Any], ci: Mapping[str, Any]) -> MigCap:
    gi_id, ci_id = int(gi["id"]), int(ci["id"])
    return MigCap(f"gpu{gpu.minor}/mig/gi{gi_id}/ci{ci_id}/access",
                  ci_minor(gpu.minor, gi_id, ci_id))


def render_minors(state: State) -> str:
    """``/proc/driver/nvidia-caps/mig-minors``: every capability name the
    node's GPUs may have and its minor, one ``<name> <minor>`` a line.

    The driver lists them all, whether the instance exists or not; the
    container toolkit, the device plugin and Slurm look a MIG device's two
    minors up here (a fixed path, so a client in a mount namespace of its
    own sees the driver root's copy bound over ``/proc/driver``).
    """
    lines = ["config 1", "monitor 2"]
    for gpu_minor in sorted({gpu.minor for gpu in state.gpus}):
        for gi in range(GI_IDS):
            lines.append(f"gpu{gpu_minor}/gi{gi}/access {gi_minor(gpu_minor, gi)}")
            lines += [f"gpu{gpu_minor}/gi{gi}/ci{ci}/access {ci_minor(gpu_minor, gi, ci)}"
                      for ci in range(MINORS_PER_GI - 1)]
    return "".join(f"{line}\n" for line in lines)


def cap_node(minor: int) -> str:
    """Node path of capability ``minor`` in the driver root."""
    return f"{layout.DRIVER_DEV}/nvidia-caps/nvidia-cap{minor}"


def _mig(gpu: Gpu) -> Mapping[str, Any]:
    mig = gpu.fields.get("mig")
    return mig if isinstance(mig, Mapping) else {}
