"""NRI's messages (``pkg/api/api.proto``, package ``nri.pkg.api.v1alpha1``), by hand.

Only what the plugin sends or reads, field numbers from the ``.proto``:

* sent: ``RegisterPluginRequest{plugin_name=1, plugin_idx=2}``,
  ``ConfigureResponse{events=2}`` (a bit mask: event ``e`` is bit ``e-1``),
  ``SynchronizeResponse{update=1, more=2}``, and
  ``CreateContainerResponse{adjust=1}`` with ``ContainerAdjustment{mounts=3,
  env=4}``, ``Mount{destination=1, type=2, source=3, options=4}`` and
  ``KeyValue{key=1, value=2}``;
* read: ``ConfigureRequest{runtime_name=2, runtime_version=3,
  request_timeout=5}``, ``SynchronizeRequest{more=3}`` and
  ``CreateContainerRequest{pod=1, container=2}``, decoded into
  ``model.Container``: ``PodSandbox{name=2, uid=3, namespace=4,
  annotations=6}``, ``Container{id=1, name=3, annotations=6, env=8,
  mounts=9, linux=11}``, ``LinuxContainer{devices=2}``,
  ``LinuxDevice{path=1, type=2, major=3, minor=4}``; a ``map<string,
  string>`` is a repeated entry message ``{key=1, value=2}``.

Every count and length is bounded (a container has no business with more
than ``MOST`` of anything), and the budget of one request covers every
field at every depth (see ``mokka.simulators.protowire``).
"""

from __future__ import annotations

import attrs

from mokka.simulators import protowire
from mokka.simulators.nri import model
from mokka.simulators.protowire import Budget, Field, Fields, WireError

#: The services' full names, as ttrpc's ``Request.service`` carries them.
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
#: ``Event.CREATE_CONTAINER``; the plugin subscribes to nothing else.
CREATE_CONTAINER = 4
#: Most entries of one repeated field (env, mounts, devices, annotations).
MOST = 4096
#: Most fields one request may hold, at every depth.
FIELDS = 200_000
#: Longest string kept (paths are at most 4096 bytes; an env value may be longer
#: and is cut, which only the policy's matching sees).
LIMIT = 32768


@attrs.frozen
class Configure:
    """What the runtime tells the plugin in ``Configure``."""

    runtime: str
    version: str
    #: The runtime's deadline for one plugin call, ms (0: not given).
    request_timeout_ms: int


def register_request(name: str, index: str) -> bytes:
    return protowire.string_field(1, name) + protowire.string_field(2, index)


def configure_response(events: tuple[int, ...] = (CREATE_CONTAINER,)) -> bytes:
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return protowire.varint_field(2, mask)


def decode_configure(payload: bytes) -> Configure:
    fields = protowire.decode(
        payload, Budget(64), {2: Field("runtime"), 3: Field("version"), 5: Field("timeout")}
    )
    return Configure(
        runtime=protowire.string(fields, 2, limit=256),
        version=protowire.string(fields, 3, limit=256),
        request_timeout_ms=_int(fields, 5),
    )


def synchronize_response(request: bytes) -> bytes:
    """No updates; ``more`` echoed, as the runtime requires of a split request."""
    # The pods and containers are not decoded, only counted by the budget.
    fields = protowire.decode(request, Budget(FIELDS), {3: Field("more")})
    return protowire.varint_field(2, 1) if _int(fields, 3) else b""


_POD = {2: Field("name"), 3: Field("uid"), 4: Field("namespace"), 6: Field("annotations", MOST)}
_CONTAINER = {
    1: Field("id"),
    3: Field("name"),
    6: Field("annotations", MOST),
    8: Field("env", MOST),
    9: Field("mounts", MOST),
    11: Field("linux"),
}
_ENTRY = {1: Field("key"), 2: Field("value")}
_MOUNT = {1: Field("destination"), 2: Field("type"), 3: Field("source"), 4: Field("options", 64)}
_LINUX = {2: Field("devices", MOST)}
_DEVICE = {1: Field("path"), 2: Field("type"), 3: Field("major"), 4: Field("minor")}


def decode_create_container(payload: bytes) -> model.Container:
    budget = Budget(FIELDS)
    request = protowire.decode(payload, budget, {1: Field("pod"), 2: Field("container")})
    pod = next(protowire.messages(request, 1, budget, _POD), {})
    ctr = next(protowire.messages(request, 2, budget, _CONTAINER), {})
    linux = next(protowire.messages(ctr, 11, budget, _LINUX), {})
    return model.Container(
        id=_str(ctr, 1),
        name=_str(ctr, 3),
        pod_name=_str(pod, 2),
        pod_namespace=_str(pod, 4),
        pod_uid=_str(pod, 3),
        annotations=_map(ctr, 6, budget),
        pod_annotations=_map(pod, 6, budget),
        env=tuple(protowire.strings(ctr, 8, limit=LIMIT)),
        mounts=tuple(
            model.Mount(
                destination=_str(m, 1),
                source=_str(m, 3),
                type=_str(m, 2),
                options=tuple(protowire.strings(m, 4, limit=256)),
            )
            for m in protowire.messages(ctr, 9, budget, _MOUNT)
        ),
        devices=tuple(
            model.Device(path=_str(d, 1), type=_str(d, 2), major=_int(d, 3), minor=_int(d, 4))
            for d in protowire.messages(linux, 2, budget, _DEVICE)
        ),
    )


def create_container_response(adjustment: model.Adjustment) -> bytes:
    adjust = b"".join(
        protowire.bytes_field(
            3,
            protowire.string_field(1, m.destination)
            + protowire.string_field(2, m.type)
            + protowire.string_field(3, m.source)
            + b"".join(protowire.string_field(4, option) for option in m.options),
        )
        for m in adjustment.mounts
    ) + b"".join(
        protowire.bytes_field(4, protowire.string_field(1, key) + protowire.string_field(2, value))
        for key, _, value in (entry.partition("=") for entry in adjustment.env)
    )
    return protowire.bytes_field(1, adjust) if adjust else b""


def _str(fields: Fields, number: int) -> str:
    return protowire.string(fields, number, limit=LIMIT)


def _int(fields: Fields, number: int) -> int:
    values = fields.get(number, [0])
    if not isinstance(values[-1], int):
        raise WireError(f"field {number}: expected a number, found bytes")
    # int64 on the wire: the top bit is the sign.
    value = values[-1]
    return value - (1 << 64) if value >= 1 << 63 else value


def _map(fields: Fields, number: int, budget: Budget) -> dict[str, str]:
    return {
        _str(entry, 1): _str(entry, 2)
        for entry in protowire.messages(fields, number, budget, _ENTRY)
    }
