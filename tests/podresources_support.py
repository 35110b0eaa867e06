"""A real gRPC pod-resources server for the tests, built from the project's own .proto.

``grpc_tools.protoc`` compiles ``mokka/simulators/workload/api/podresources_v1.proto``
into Python classes once per session; the server encodes its answers with
those (the real protobuf runtime), so the daemon's own wire reader is checked
against an independent encoder.  The server runs grpcio's real server on a
unix socket, in its own threads, and answers from a list the test changes.

Modes a test can switch to: ``ok`` (answer from ``pods``), ``garbage``
(bytes that are no protobuf message), ``raw`` (the bytes in ``raw``, as they
are: a hostile kubelet), ``stall`` (hold the call until the test releases
it: the client's deadline must end the wait), ``error`` (an UNAVAILABLE
status).

The ``pb2`` and ``server`` fixtures (the server on a test's node root) and
``workload`` (the file the simulator wrote there) serve every module that
runs the workload simulator against the server.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType

import attrs
import grpc
import pytest
import yaml

from mokka import layout
from tests.support import ROOT

PROTO = ROOT / "mokka/simulators/workload/api/podresources_v1.proto"
#: The kubelet's pod-resources socket, under a node root.
SOCKET = "var/lib/kubelet/pod-resources/kubelet.sock"


def compile_api(out: Path) -> tuple[ModuleType, ModuleType]:
    """``(pb2, pb2_grpc)`` generated from the project's .proto into ``out``."""
    return compile_proto(PROTO, out)


def compile_proto(proto: Path, out: Path) -> tuple[ModuleType, ModuleType]:
    """``(pb2, pb2_grpc)`` that grpcio-tools generates from ``proto`` into ``out``
    (a self-contained .proto: it may import nothing but its own directory)."""
    from grpc_tools import protoc

    rc = protoc.main([
        "protoc", f"-I{proto.parent}", f"--python_out={out}", f"--grpc_python_out={out}",
        str(proto),
    ])
    assert rc == 0, f"protoc failed on {proto}"
    sys.path.insert(0, str(out))
    try:
        return (importlib.import_module(f"{proto.stem}_pb2"),
                importlib.import_module(f"{proto.stem}_pb2_grpc"))
    finally:
        sys.path.remove(str(out))


@attrs.define
class Pod:
    namespace: str
    name: str
    #: container name -> [(resource name, [device ids])]
    containers: dict[str, list[tuple[str, list[str]]]]
    #: container name -> [(driver, device name, [CDI names])] (DRA claims)
    claims: dict[str, list[tuple[str, str, list[str]]]] = attrs.field(factory=dict)


@attrs.define(eq=False)
class PodResourcesServer:
    """The server; ``pods``, ``allocatable`` and ``mode`` may change at any time."""

    pb2: ModuleType
    socket: Path
    pods: list[Pod] = attrs.field(factory=list)
    allocatable: list[tuple[str, list[str]]] = attrs.field(factory=list)
    mode: str = "ok"
    #: what every call answers in ``raw`` mode
    raw: bytes = b""
    calls: int = 0
    #: set at every call (a test clears it, then waits for the next call)
    called: threading.Event = attrs.field(factory=threading.Event)
    #: a stalled call returns once this is set
    release: threading.Event = attrs.field(factory=threading.Event)
    _server: grpc.Server | None = None
    _dir_fd: int | None = None

    def list_answer(self):
        pb2 = self.pb2
        response = pb2.ListPodResourcesResponse()
        for pod in self.pods:
            message = response.pod_resources.add(name=pod.name, namespace=pod.namespace)
            for cname in sorted(set(pod.containers) | set(pod.claims)):
                container = message.containers.add(name=cname)
                for resource, ids in pod.containers.get(cname, []):
                    container.devices.add(resource_name=resource, device_ids=ids)
                for driver, device, cdi in pod.claims.get(cname, []):
                    dynamic = container.dynamic_resources.add(claim_name=f"{cname}-claim")
                    claim = dynamic.claim_resources.add(driver_name=driver, device_name=device)
                    for name in cdi:
                        claim.cdi_devices.add(name=name)
        return response

    def _handle(self, answer):
        def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.calls += 1
            self.called.set()
            if self.mode == "garbage":
                return b"\x0a\xff\xff\xff\xff\x0f"  # a length far past the end
            if self.mode == "raw":
                return self.raw
            if self.mode == "stall":
                self.release.wait(30)
            if self.mode == "error":
                context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
            return answer().SerializeToString()
        return grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=None, response_serializer=None
        )

    def _allocatable_answer(self):
        response = self.pb2.AllocatableResourcesResponse()
        for resource, ids in self.allocatable:
            response.devices.add(resource_name=resource, device_ids=ids)
        return response

    def start(self) -> None:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {"List": self._handle(self.list_answer),
             "GetAllocatableResources": self._handle(self._allocatable_answer)},
        )])
        # Bound through the directory's descriptor: a test root's path can be
        # longer than a unix socket address allows.
        self._dir_fd = os.open(self.socket.parent, os.O_PATH | os.O_DIRECTORY)
        server.add_insecure_port(f"unix:/proc/self/fd/{self._dir_fd}/{self.socket.name}")
        server.start()
        self._server = server

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(10)
            self._server = None
        self.socket.unlink(missing_ok=True)
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None


# The two fixtures below are imported by the test modules that use them; the
# ``name=`` keeps a test's parameter from shadowing the imported function.


@pytest.fixture(scope="module", name="pb2")
def pb2_fixture(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The generated message classes, compiled once per test module."""
    return compile_api(tmp_path_factory.mktemp("podresources-api"))[0]


@pytest.fixture(name="server")
def server_fixture(pb2: ModuleType, node_root: Path) -> Iterator[PodResourcesServer]:
    """A server on the node root's kubelet socket, answering ``ok`` with no pods."""
    server = PodResourcesServer(pb2, node_root / SOCKET)
    server.start()
    yield server
    server.stop()


def workload(node_root: Path) -> dict | None:
    """The workload file the simulator wrote under ``node_root``, parsed (``None``: none yet)."""
    path = node_root / layout.WORKLOAD_CONFIG.lstrip("/")
    return yaml.safe_load(path.read_text()) if path.exists() else None


# --- hostile answers, encoded by hand (no encoder would make them) -----------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, body: bytes) -> bytes:
    """One length-delimited field (a string or a sub-message)."""
    return varint(number << 3 | 2) + varint(len(body)) + body


def nested(depth: int) -> bytes:
    """``depth`` messages, each the only field of the one around it."""
    blob = b""
    for _ in range(depth):
        blob = field(1, blob)
    return blob


def _container(devices: int, ids: int) -> bytes:
    device_list = field(1, b"nvidia.com/gpu") + field(2, b"0") * ids
    return field(1, b"main") + field(2, device_list) * devices


#: name -> (a List answer under the 4 MiB cap, what the refusal says; None:
#: it may decode).  Each is cheap to refuse: the decoder stops at its first
#: cap (``mokka.simulators.workload.podresources``).
HOSTILE_LISTS = {
    "two million empty pods": (b"\x0a\x00" * 2_000_000, "more than 5000 pods"),
    "two million unknown fields": (b"\x48\x01" * 2_000_000, "more than 100000 fields"),
    "a pod of 100,000 containers": (
        field(1, field(3, b"") * 100_000), "more than 256 containers in one pod"),
    "300 device lists in a container": (
        field(1, field(3, _container(300, 1))), "more than 256 device lists"),
    "20,100 grants in 100 containers": (
        field(1, field(3, _container(1, 201)) * 100), "more than 20000 device grants"),
    "a 3 MiB pod name": (field(1, field(1, b"p" * (3 << 20))), None),
    "nested 2,000 deep as a container": (field(1, field(3, nested(2_000))), None),
    "a varint of eleven bytes": (b"\x0a\x0b" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
    "a group": (b"\x0b" * 1000, "wire type 3"),
}
