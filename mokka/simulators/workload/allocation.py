"""From device grants to the workload file the mock NVML library reads.

Level-triggered: every poll hands the whole set of grants to
``allocation_for``, which recomputes which containers hold which of this
node's GPUs from nothing, so a missed or repeated poll changes nothing.

The workload file (``layout.WORKLOAD_CONFIG``, beside the engine config, in
the engine config's format) says only *who* holds each GPU: one process per
holding container, with a stable PID and a name that says which pod it is.
What that does to the readings (memory used, utilization, power,
temperature, clocks) is derived in the library, from these processes and
the board's own limits, so every reader sees one coherent board and the
derivation lives in one place.  See docs/workloads.md.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence

import attrs

from mokka.simulators.gpudriver.config_lines import format_line
from mokka.simulators.gpudriver.engine_config import FORMAT_VERSION
from mokka.simulators.workload.podresources import Grant, Holder
from mokka.state.model import State

#: PIDs handed to simulated processes: above what a fresh node's own
#: processes use, below the kernel's largest ``pid_max`` (2^22).
PID_BASE = 200_000
PID_SPAN = 4_194_304 - PID_BASE

#: ``<uuid>::<replica>``: a time-slicing replica of a GPU (the device
#: plugin's sharing mode); every replica is the same GPU.
_REPLICA = re.compile(r"::\d+$")
#: The NVIDIA DRA driver's device names: ``gpu-<index>``.
_DRA_NAME = re.compile(r"^gpu-(\d+)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@attrs.frozen
class Process:
    """A simulated compute process: one holding container on one GPU."""

    pid: int
    name: str


@attrs.frozen
class Allocation:
    """Who holds which GPU, by GPU position in the State."""

    #: position -> processes on that GPU (sorted by name: stable output)
    processes: Mapping[int, tuple[Process, ...]]
    #: grants that named a device of ours that is not a GPU of this node
    unresolved: tuple[str, ...] = ()

    @property
    def holders(self) -> int:
        return len({p.name for procs in self.processes.values() for p in procs})


def gpu_position(device: str, state: State) -> int | None:
    """The position of the GPU ``device`` names in ``state``, or None.

    Accepts a GPU UUID (any case), a time-slicing replica ``<uuid>::<n>``,
    an index, a DRA device name ``gpu-<index>``, and a CDI device name
    ``vendor/class=<any of those>``.
    """
    name = _REPLICA.sub("", device.rsplit("=", 1)[-1]).strip()
    dra = _DRA_NAME.match(name)
    if dra:
        name = dra.group(1)
    for position, gpu in enumerate(state.gpus):
        if name.isascii() and name.isdigit():
            if int(name) == gpu.index:
                return position
        elif name.lower() == gpu.uuid.lower():
            return position
    return None


def _pid(label: str, taken: set[int]) -> int:
    # A hash of the holder's name: the same container keeps its PID across
    # polls and daemon restarts; a collision takes the next free number.
    digest = int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "big")
    pid = PID_BASE + digest % PID_SPAN
    while pid in taken:
        pid = PID_BASE + (pid - PID_BASE + 1) % PID_SPAN
    return pid


def _display(holder: Holder) -> str:
    return _CONTROL.sub("?", f"k8s:{holder.label()}")


def allocation_for(
    grants: Iterable[Grant], state: State, *, resources: Sequence[str]
) -> Allocation:
    """Which container holds which GPU of ``state``, from the whole set of grants.

    Only grants whose resource (device-plugin resource name or DRA driver
    name) starts with one of ``resources`` count.  A container granted the
    same GPU twice (two time-slicing replicas) is one process on it; a
    container holding two GPUs is one process on each, with one PID, as a
    real process using two GPUs would be.
    """
    holders: dict[int, set[Holder]] = {}
    unresolved: set[str] = set()
    for grant in grants:
        if not grant.resource.startswith(tuple(resources)):
            continue
        position = gpu_position(grant.device, state)
        if position is None:
            unresolved.add(grant.device)
            continue
        holders.setdefault(position, set()).add(grant.holder)
    taken: set[int] = set()
    pids: dict[Holder, int] = {}
    for holder in sorted({h for hs in holders.values() for h in hs}, key=Holder.label):
        pids[holder] = _pid(holder.label(), taken)
        taken.add(pids[holder])
    processes = {
        position: tuple(
            sorted((Process(pids[h], _display(h)) for h in hs), key=lambda p: p.name)
        )
        for position, hs in sorted(holders.items())
    }
    return Allocation(processes, tuple(sorted(unresolved)))


@attrs.frozen(kw_only=True)
class Shares:
    """What one holding container does to its GPU (docs/workloads.md)."""

    #: Fraction of the GPU's memory each holder uses.
    memory: float
    #: GPU utilization (percent) each holder adds.
    utilization: int


def render_workload(state: State, allocation: Allocation, shares: Shares) -> str:
    """The workload file for ``allocation`` (deterministic: equal inputs, equal bytes)."""
    entries: list[tuple[str, object]] = [
        ("format", FORMAT_VERSION),
        ("generation", state.generation),
        ("source", "pod-resources"),
        ("workload.memory_share_per_holder", float(shares.memory)),
        ("workload.utilization_per_holder", shares.utilization),
        ("device_count", len(state.gpus)),
    ]
    for position in range(len(state.gpus)):
        procs = allocation.processes.get(position, ())
        entries.append((f"device.{position}.process_count", len(procs)))
        for k, proc in enumerate(procs):
            entries.append((f"device.{position}.process.{k}.pid", proc.pid))
            entries.append((f"device.{position}.process.{k}.name", proc.name))
    lines = [
        "# Workload of the mock NVML library: who holds each GPU (docs/workloads.md).",
        "# Written by the mokka node daemon from the kubelet's pod-resources API.",
    ]
    lines.extend(format_line(key, value) for key, value in entries)
    return "\n".join(lines) + "\n"
