"""What the workload poller costs while the allocation does not change.

A real gRPC pod-resources server (grpcio, answers encoded with classes that
``grpc_tools`` generates from the project's own ``.proto``) runs in a child
process and reports the same allocation at every call: eight GPUs, each held
by one container.  In this process the ``workload`` simulator polls it every
``--interval`` seconds for ``--seconds``; the figures are this process's CPU
per poll (the calls, the decoding, the allocation, the comparison with what
was written) and how many times the workload file was written after the
first poll (nothing changed, so: none).  The floor, measured in the same run,
is the same window with the simulator pointed at a root with no socket (one
``stat`` per poll).

    .venv/bin/python bench/workload_idle.py [--seconds 20] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import importlib
import logging
import resource
import subprocess
import sys
import tempfile
from concurrent import futures
from pathlib import Path

import trio
from figures import report

from mokka.noderoot.host import Host
from mokka.simulators.workload import WorkloadSettings, WorkloadSimulator
from mokka.state.compile import compile_profile

QUICK_ARGS = ["--seconds", "5", "--interval", "0.25"]
ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "mokka/simulators/workload/api/podresources_v1.proto"
SOCKET = "var/lib/kubelet/pod-resources/kubelet.sock"


def serve(socket: Path, uuids: list[str]) -> None:
    """The child: answer every List with one container per GPU, until killed."""
    import os

    import grpc
    from grpc_tools import protoc

    out = Path(tempfile.mkdtemp(prefix="mokka-bench-pr-"))
    protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}", str(PROTO)])
    sys.path.insert(0, str(out))
    pb2 = importlib.import_module("podresources_v1_pb2")
    listing = pb2.ListPodResourcesResponse()
    for i, uuid in enumerate(uuids):
        pod = listing.pod_resources.add(name=f"train-{i}", namespace="bench")
        pod.containers.add(name="main").devices.add(resource_name="nvidia.com/gpu",
                                                    device_ids=[uuid])
    allocatable = pb2.AllocatableResourcesResponse()
    allocatable.devices.add(resource_name="nvidia.com/gpu", device_ids=uuids)
    answers = {"List": listing.SerializeToString(),
               "GetAllocatableResources": allocatable.SerializeToString()}

    def handler(answer: bytes):
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: answer, request_deserializer=None, response_serializer=None)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister", {name: handler(a) for name, a in answers.items()})])
    # Through the directory's descriptor: a temp root's path can be longer
    # than a unix socket address allows.
    fd = os.open(socket.parent, os.O_PATH | os.O_DIRECTORY)
    server.add_insecure_port(f"unix:/proc/self/fd/{fd}/{socket.name}")
    server.start()
    print("serving", flush=True)
    server.wait_for_termination()


class _WriteCounter(logging.Handler):
    """Counts the simulator's own "file written" log lines: one per write."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "workload: file written":
            self.count += 1


async def window(root: Path, seconds: float, interval: float) -> tuple[float, int, int]:
    """CPU seconds of this process, polls and file writes during ``seconds`` of polling."""
    host = Host(root)
    state = compile_profile("h100", node_name="bench-node")
    sim = WorkloadSimulator(settings=WorkloadSettings(poll_interval=interval))
    written = _WriteCounter()
    logging.getLogger("mokka.simulators.workload.simulator").addHandler(written)
    logging.getLogger("mokka.simulators.workload.simulator").setLevel(logging.INFO)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, host, state)
        await sim.polls.wait_value(lambda v: v >= 1)  # the first answer is written once
        first_writes, first_polls = written.count, sim.polls.value
        before = resource.getrusage(resource.RUSAGE_SELF)
        await trio.sleep(seconds)
        after = resource.getrusage(resource.RUSAGE_SELF)
        polls = sim.polls.value - first_polls
        nursery.cancel_scope.cancel()
    await sim.discard(host)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    logging.getLogger("mokka.simulators.workload.simulator").removeHandler(written)
    return cpu, polls, written.count - first_writes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between polls")
    parser.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(Path(args.serve[0]), args.serve[1:])
        return
    uuids = [g.uuid for g in compile_profile("h100", node_name="bench-node").gpus]
    with tempfile.TemporaryDirectory(prefix="mokka-bench-workload-") as tmp:
        busy, empty = Path(tmp) / "busy", Path(tmp) / "empty"
        empty.mkdir()
        socket = busy / SOCKET
        socket.parent.mkdir(parents=True)
        child = subprocess.Popen([sys.executable, __file__, "--serve", str(socket), *uuids],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "serving", "the server did not start"
            floor_cpu, floor_polls, _ = trio.run(window, empty, args.seconds, args.interval)
            cpu, polls, writes = trio.run(window, busy, args.seconds, args.interval)
        finally:
            child.kill()
            child.wait(10)
    print(f"{polls} polls of an unchanged allocation (8 GPUs held), every {args.interval:g} s")
    report("workload_idle", "poller CPU per poll, allocation unchanged", 1000 * cpu / max(polls, 1),
           "ms", floor=1000 * floor_cpu / max(floor_polls, 1), floor_name="no socket: one stat")
    report("workload_idle", "workload file writes after the first poll", writes, "count",
           goal="0 while the allocation is unchanged")
    per_minute = 60 / 5.0 * cpu / max(polls, 1)  # at the default 5 s interval
    report("workload_idle", "poller CPU per minute at the default 5 s poll", per_minute, "s")


if __name__ == "__main__":
    main()
