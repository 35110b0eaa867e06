"""The kubelet's pod-resources API (v1): which container holds which device.

The kubelet serves ``v1.PodResourcesLister`` over gRPC on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``).  Two calls matter here:

* ``List``: every pod on the node, its containers, and per container the
  device-plugin devices (``resource_name`` + ``device_ids``) and the DRA
  devices (``dynamic_resources`` -> claim resources: driver, pool, device
  name and CDI device names) it holds;
* ``GetAllocatableResources``: the devices the kubelet could hand out, which
  tells whether the device plugin registered this node's GPUs at all.

The message layouts are in ``api/podresources_v1.proto`` beside this module.
Answers are decoded by ``mokka.simulators.workload.wire``; this module turns
them into frozen ``Grant`` values and bounds what a hostile answer can make
the daemon hold (names are cut, counts are capped).

``PodResourcesClient`` makes the calls with ``grpcio`` (imported only when a
socket exists, so a local run never loads it).  Its calls block; callers run
them in a worker thread that cancellation abandons.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs

from mokka.simulators.workload import wire

#: Method paths of the v1 service.
LIST = "/v1.PodResourcesLister/List"
ALLOCATABLE = "/v1.PodResourcesLister/GetAllocatableResources"

#: Longest name kept (a Kubernetes object name is at most 253 characters).
MAX_NAME = 253
#: Most grants one answer may carry: far beyond any node (110 pods by
#: default, a few containers each, a few devices per container), small enough
#: that a hostile answer cannot grow the daemon's memory.
MAX_GRANTS = 20_000
#: Largest answer accepted from the socket (gRPC's own default is 4 MiB).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class AnswerError(ValueError):
    """An answer from the kubelet that does not decode as the v1 API says."""


@attrs.frozen
class Holder:
    """One container: who holds a device."""

    namespace: str
    pod: str
    container: str

    def label(self) -> str:
        """``namespace/pod/container``: what the process table shows."""
        return f"{self.namespace}/{self.pod}/{self.container}"


@attrs.frozen
class Grant:
    """One device handed to one container.

    ``device`` is what names it: a device-plugin device id (a GPU UUID, an
    index, a time-slicing replica ``<uuid>::<n>``), a DRA device name
    (``gpu-0``) or a CDI device name (``nvidia.com/gpu=0``).
    """

    holder: Holder
    resource: str
    device: str


def _check_count(grants: list[Grant]) -> None:
    if len(grants) > MAX_GRANTS:
        raise AnswerError(f"more than {MAX_GRANTS} device grants in one answer")


def _device_grants(holder: Holder, container: wire.Fields, grants: list[Grant]) -> None:
    for devices in wire.messages(container, 2):
        resource = wire.string(devices, 1, limit=MAX_NAME)
        for device in wire.strings(devices, 2, limit=MAX_NAME):
            grants.append(Grant(holder, resource, device))
        _check_count(grants)
    for dynamic in wire.messages(container, 5):
        for claim in wire.messages(dynamic, 4):
            driver = wire.string(claim, 2, limit=MAX_NAME)
            names = [
                wire.string(cdi, 1, limit=MAX_NAME) for cdi in wire.messages(claim, 1)
            ]
            device = wire.string(claim, 4, limit=MAX_NAME)
            # The DRA device name first; a claim without one still names its
            # CDI devices, which resolve the same way.
            for name in [device] if device else names:
                grants.append(Grant(holder, driver, name))
            _check_count(grants)


def decode_list(answer: bytes) -> tuple[Grant, ...]:
    """Every device grant in a ``ListPodResourcesResponse``."""
    try:
        grants: list[Grant] = []
        for pod in wire.messages(wire.decode(answer), 1):
            name = wire.string(pod, 1, limit=MAX_NAME)
            namespace = wire.string(pod, 2, limit=MAX_NAME)
            for container in wire.messages(pod, 3):
                holder = Holder(namespace, name, wire.string(container, 1, limit=MAX_NAME))
                _device_grants(holder, container, grants)
        return tuple(grants)
    except wire.WireError as exc:
        raise AnswerError(f"List answer does not decode: {exc}") from None


def decode_allocatable(answer: bytes) -> tuple[tuple[str, str], ...]:
    """``(resource name, device id)`` for every device in an ``AllocatableResourcesResponse``."""
    try:
        out = []
        for devices in wire.messages(wire.decode(answer), 1):
            resource = wire.string(devices, 1, limit=MAX_NAME)
            out.extend((resource, d) for d in wire.strings(devices, 2, limit=MAX_NAME))
            if len(out) > MAX_GRANTS:
                raise AnswerError(f"more than {MAX_GRANTS} allocatable devices")
        return tuple(out)
    except wire.WireError as exc:
        raise AnswerError(f"GetAllocatableResources answer does not decode: {exc}") from None


@attrs.define(eq=False)
class PodResourcesClient:
    """Blocking calls to the kubelet's pod-resources socket (run them in a thread)."""

    socket: Path
    #: Seconds one call may take before it counts as failed.
    timeout: float
    _channel: Any = attrs.field(default=None, init=False)
    #: The socket's directory, held open for the channel's life (see ``_call``).
    _dir_fd: int | None = attrs.field(default=None, init=False)

    def _call(self, method: str) -> bytes:
        if self._channel is None:
            import grpc  # only a node with a kubelet socket pays for loading it

            # A unix socket address holds at most 107 bytes, and a node root
            # can make the path longer; ``/proc/self/fd/<dir>/<name>`` is
            # short whatever the root, and pins the directory resolved here.
            self._dir_fd = os.open(self.socket.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            self._channel = grpc.insecure_channel(
                f"unix:/proc/self/fd/{self._dir_fd}/{self.socket.name}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
            )
        # Raw bytes both ways: the requests are empty messages, and the
        # answers are decoded (and bounded) by our own reader.
        stub = self._channel.unary_unary(
            method, request_serializer=lambda _: b"", response_deserializer=None
        )
        return stub(None, timeout=self.timeout)

    def list(self) -> tuple[Grant, ...]:
        return decode_list(self._call(LIST))

    def allocatable(self) -> tuple[tuple[str, str], ...]:
        return decode_allocatable(self._call(ALLOCATABLE))

    def poll(self) -> tuple[tuple[Grant, ...], tuple[tuple[str, str], ...]]:
        """Both calls, in one thread hop: the grants, then what is allocatable."""
        return self.list(), self.allocatable()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None
