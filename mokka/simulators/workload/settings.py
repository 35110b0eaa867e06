"""Settings of the workload simulator, built from the daemon's flags."""

from __future__ import annotations

import argparse
import math

import attrs

from mokka.errors import SpecError

MODES = ("auto", "off")

#: Where the kubelet serves the pod-resources API (a node path, read under
#: the node root: ``/host`` in the pod already shows it).
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: Resource names (device plugin) and DRA driver names whose devices count,
#: as prefixes: ``nvidia.com/gpu``, renamed or shared resources such as
#: ``nvidia.com/gpu.shared``, Mokka's own NRI kind, the NVIDIA DRA driver.
DEFAULT_RESOURCES = ("nvidia.com/", "mokka.nvidia.com/", "gpu.nvidia.com")


@attrs.frozen(kw_only=True)
class WorkloadSettings:
    """Knobs of the workload simulator (docs/workloads.md)."""

    #: ``auto``: poll the kubelet whenever its socket exists; ``off``: never.
    mode: str = "auto"
    #: The kubelet's pod-resources socket, as a node path.
    socket: str = DEFAULT_SOCKET
    #: Seconds between polls.  5 s: a pod start is seen about as soon as its
    #: container has started, at one small RPC per interval.
    poll_interval: float = 5.0
    #: Seconds one call may take; past it the poll counts as failed and the
    #: last good allocation stays.
    call_timeout: float = 2.0
    #: Fraction of a GPU's memory each holding container uses.  0.4: two
    #: time-sliced holders fill most of the board, as two real jobs would.
    memory_share: float = 0.4
    #: Utilization (percent) each holding container adds, capped at 100.
    utilization: int = 60
    #: Which grants count (prefixes of resource or DRA driver names).
    resources: tuple[str, ...] = DEFAULT_RESOURCES

    def __attrs_post_init__(self) -> None:
        problems = []
        if self.mode not in MODES:
            problems.append(f"workload settings: mode: {self.mode!r}, expected one of "
                            f"{', '.join(MODES)}")
        if not self.socket.startswith("/"):
            problems.append(f"workload settings: socket: {self.socket!r}, expected an "
                            "absolute node path")
        for field, value in (("poll_interval", self.poll_interval),
                             ("call_timeout", self.call_timeout)):
            if not (math.isfinite(value) and value > 0):
                problems.append(f"workload settings: {field}: {value!r}, expected seconds > 0")
        if not (math.isfinite(self.memory_share) and 0 <= self.memory_share <= 1):
            problems.append(f"workload settings: memory_share: {self.memory_share!r}, "
                            "expected a fraction from 0 to 1")
        if not 0 <= self.utilization <= 100:
            problems.append(f"workload settings: utilization: {self.utilization!r}, "
                            "expected a percentage from 0 to 100")
        if not self.resources or not all(self.resources):
            problems.append("workload settings: resources: expected one or more "
                            "non-empty name prefixes")
        if problems:
            raise SpecError(problems)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WorkloadSettings:
        """Build from the parsed daemon flags (see ``add_arguments``)."""
        return cls(
            mode=args.workload,
            socket=args.workload_socket,
            poll_interval=args.workload_poll_interval,
            memory_share=args.workload_memory_share,
            utilization=args.workload_utilization,
            resources=tuple(r.strip() for r in args.workload_resources.split(",")),
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the workload flags, in their own argument group."""
    group = parser.add_argument_group(
        "workload", "GPUs that pods hold look busy (kubelet pod-resources API)"
    )
    defaults = WorkloadSettings()
    group.add_argument("--workload", choices=MODES, default=defaults.mode, help=(
        "auto = poll the kubelet's pod-resources socket when it exists (default: %(default)s)"))
    group.add_argument("--workload-socket", default=defaults.socket, metavar="PATH", help=(
        "the kubelet's pod-resources socket, a node path under --root (default: %(default)s)"))
    group.add_argument("--workload-poll-interval", type=float, default=defaults.poll_interval,
                       metavar="SECONDS", help="seconds between polls (default: %(default)s)")
    group.add_argument("--workload-memory-share", type=float, default=defaults.memory_share,
                       metavar="FRACTION", help=(
                           "share of a GPU's memory each holding container uses "
                           "(default: %(default)s)"))
    group.add_argument("--workload-utilization", type=int, default=defaults.utilization,
                       metavar="PERCENT", help=(
                           "GPU utilization each holding container adds (default: %(default)s)"))
    group.add_argument("--workload-resources", default=",".join(defaults.resources),
                       metavar="PREFIXES", help=(
                           "resource or DRA driver name prefixes whose devices count "
                           "(default: %(default)s)"))
