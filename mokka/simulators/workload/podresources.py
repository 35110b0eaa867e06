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
the daemon hold and spend (names are cut; pods, containers, lists, grants
and fields are counted, and the decode ends at the first count past its cap).

``PodResourcesClient`` makes the calls with ``grpcio`` (imported only when a
socket exists, so a local run never loads it).  Its calls block; callers run
them in a worker thread that cancellation abandons, and pass a checkpoint
that stops an abandoned decode (``wire.Budget``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
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
#: Most pods one answer may list: the kubelet's ``--max-pods`` is 110 by
#: default and a few hundred on the largest nodes.
MAX_PODS = 5_000
#: Most values of any list inside a pod (containers, device lists, claims,
#: CDI devices): a pod has a handful of each.
MAX_INNER = 256
#: Most fields one answer may hold, at every depth, known or not.  About a
#: microsecond of CPU each: 100,000 is 0.1 s, while a 110-pod node's answer
#: has a few thousand.  Without it 4 MiB of empty pods cost seconds of CPU
#: and hundreds of MB per decode.
MAX_FIELDS = 100_000
#: Largest answer accepted from the socket (gRPC's own default is 4 MiB).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

_NAME = wire.Field("name")
#: What is read of each message (``wire.Field``); everything else is skipped.
_LIST = {1: wire.Field("pods", MAX_PODS)}
_POD = {1: _NAME, 2: _NAME, 3: wire.Field("containers in one pod", MAX_INNER)}
_CONTAINER = {
    1: _NAME,
    2: wire.Field("device lists in one container", MAX_INNER),
    5: wire.Field("dynamic resources in one container", MAX_INNER),
}
_DEVICES = {1: _NAME, 2: wire.Field("device grants", MAX_GRANTS)}
_DYNAMIC = {4: wire.Field("claim resources in one dynamic resource", MAX_INNER)}
_CLAIM = {1: wire.Field("CDI devices in one claim", MAX_INNER), 2: _NAME, 4: _NAME}
_CDI = {1: _NAME}
_ALLOCATABLE = {1: wire.Field("device lists", MAX_INNER)}


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


def _check_count(count: int) -> None:
    """Refuse before adding: a grant past the cap is never built."""
    if count > MAX_GRANTS:
        raise AnswerError(f"more than {MAX_GRANTS} device grants in one answer")


def _device_grants(holder: Holder, container: wire.Fields, grants: list[Grant],
                   budget: wire.Budget) -> None:
    for devices in wire.messages(container, 2, budget, _DEVICES):
        resource = wire.string(devices, 1, limit=MAX_NAME)
        _check_count(len(grants) + len(devices.get(2, ())))
        for device in wire.strings(devices, 2, limit=MAX_NAME):
            grants.append(Grant(holder, resource, device))
    for dynamic in wire.messages(container, 5, budget, _DYNAMIC):
        for claim in wire.messages(dynamic, 4, budget, _CLAIM):
            driver = wire.string(claim, 2, limit=MAX_NAME)
            device = wire.string(claim, 4, limit=MAX_NAME)
            # The DRA device name first; a claim without one still names its
            # CDI devices, which resolve the same way.
            names = [device] if device else [
                wire.string(cdi, 1, limit=MAX_NAME)
                for cdi in wire.messages(claim, 1, budget, _CDI)
            ]
            _check_count(len(grants) + len(names))
            grants.extend(Grant(holder, driver, name) for name in names)


def _budget(checkpoint: Callable[[], object] | None) -> wire.Budget:
    return wire.Budget(MAX_FIELDS, checkpoint)


def decode_list(answer: bytes, budget: wire.Budget | None = None) -> tuple[Grant, ...]:
    """Every device grant in a ``ListPodResourcesResponse``.

    ``budget``: what the decode may cost (default: ``MAX_FIELDS``, no
    checkpoint); a caller in a worker thread passes one whose checkpoint
    stops an abandoned decode.
    """
    budget = budget or _budget(None)
    try:
        grants: list[Grant] = []
        for pod in wire.messages(wire.decode(answer, budget, _LIST), 1, budget, _POD):
            name = wire.string(pod, 1, limit=MAX_NAME)
            namespace = wire.string(pod, 2, limit=MAX_NAME)
            for container in wire.messages(pod, 3, budget, _CONTAINER):
                holder = Holder(namespace, name, wire.string(container, 1, limit=MAX_NAME))
                _device_grants(holder, container, grants, budget)
        return tuple(grants)
    except wire.WireError as exc:
        raise AnswerError(f"List answer does not decode: {exc}") from None


def decode_allocatable(answer: bytes, budget: wire.Budget | None = None,
                       ) -> tuple[tuple[str, str], ...]:
    """``(resource name, device id)`` for every device in an ``AllocatableResourcesResponse``."""
    budget = budget or _budget(None)
    try:
        out = []
        top = wire.decode(answer, budget, _ALLOCATABLE)
        for devices in wire.messages(top, 1, budget, _DEVICES):
            if len(out) + len(devices.get(2, ())) > MAX_GRANTS:
                raise AnswerError(f"more than {MAX_GRANTS} allocatable devices")
            resource = wire.string(devices, 1, limit=MAX_NAME)
            out.extend((resource, d) for d in wire.strings(devices, 2, limit=MAX_NAME))
        return tuple(out)
    except wire.WireError as exc:
        raise AnswerError(f"GetAllocatableResources answer does not decode: {exc}") from None


@attrs.define(eq=False)
class PodResourcesClient:
    """Blocking calls to the kubelet's pod-resources socket (run them in a thread).

    ``close`` may be called from another thread while a call runs (a caller
    that abandoned the call): the call in flight is cancelled by the
    channel's close, and no later call opens a channel again.
    """

    socket: Path
    #: Seconds one call may take before it counts as failed.
    timeout: float
    _channel: Any = attrs.field(default=None, init=False)
    #: The socket's directory, held open for the channel's life (see ``_call``).
    _dir_fd: int | None = attrs.field(default=None, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    #: Guards opening and closing the channel, which two threads may race.
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def _open(self) -> Any:
        with self._lock:
            if self._closed:
                raise AnswerError("the client was closed")
            if self._channel is None:
                import grpc  # only a node with a kubelet socket pays for loading it

                # A unix socket address holds at most 107 bytes, and a node
                # root can make the path longer; ``/proc/self/fd/<dir>/<name>``
                # is short whatever the root, and pins the directory resolved here.
                self._dir_fd = os.open(
                    self.socket.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
                )
                self._channel = grpc.insecure_channel(
                    f"unix:/proc/self/fd/{self._dir_fd}/{self.socket.name}",
                    options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
                )
            return self._channel

    def _call(self, method: str) -> bytes:
        # Raw bytes both ways: the requests are empty messages, and the
        # answers are decoded (and bounded) by our own reader.
        stub = self._open().unary_unary(
            method, request_serializer=lambda _: b"", response_deserializer=None
        )
        return stub(None, timeout=self.timeout)

    def list(self, checkpoint: Callable[[], object] | None = None) -> tuple[Grant, ...]:
        return decode_list(self._call(LIST), _budget(checkpoint))

    def allocatable(self, checkpoint: Callable[[], object] | None = None,
                    ) -> tuple[tuple[str, str], ...]:
        return decode_allocatable(self._call(ALLOCATABLE), _budget(checkpoint))

    def poll(self, checkpoint: Callable[[], object] | None = None,
             ) -> tuple[tuple[Grant, ...], tuple[tuple[str, str], ...]]:
        """Both calls, in one thread hop: the grants, then what is allocatable.

        ``checkpoint`` is called between the calls and throughout each
        decode (``wire.Budget``): when it raises, the poll stops there.
        """
        grants = self.list(checkpoint)
        if checkpoint is not None:
            checkpoint()
        return grants, self.allocatable(checkpoint)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._channel is not None:
                self._channel.close()
                self._channel = None
            if self._dir_fd is not None:
                os.close(self._dir_fd)
                self._dir_fd = None
