"""NRI's wire by hand: byte strings from the ``.proto`` field numbers, and hostile input.

The expected bytes are written out from the published definitions, not
from our encoder: a protobuf key is ``field number << 3 | wire type``
(0 varint, 2 length-delimited), so ``0x0a`` is field 1 bytes, ``0x12``
field 2 bytes, ``0x10`` field 2 varint, ``0x18`` field 3 varint, ``0x1a``
field 3 bytes, ``0x22`` field 4 bytes, ``0x2a`` field 5, ``0x32`` field 6,
``0x42`` field 8, ``0x4a`` field 9, ``0x5a`` field 11:

* ``api.proto`` (github.com/containerd/nri, ``nri.pkg.api.v1alpha1``):
  ``RegisterPluginRequest{plugin_name=1, plugin_idx=2}``,
  ``ConfigureResponse{events=2}`` (event ``e`` is bit ``e-1``;
  ``CREATE_CONTAINER = 4``), ``SynchronizeRequest{more=3}``,
  ``SynchronizeResponse{more=2}``, ``CreateContainerRequest{pod=1,
  container=2}``, ``PodSandbox{id=1, name=2, uid=3, namespace=4,
  annotations=6}``, ``Container{id=1, name=3, annotations=6, env=8,
  mounts=9, linux=11}``, ``LinuxContainer{devices=2}``,
  ``LinuxDevice{path=1, type=2, major=3, minor=4}``,
  ``CreateContainerResponse{adjust=1}``, ``ContainerAdjustment{mounts=3,
  env=4}``, ``Mount{destination=1, type=2, source=3, options=4}``,
  ``KeyValue{key=1, value=2}``; a map entry is ``{key=1, value=2}``;
* ttrpc's ``request.proto``: ``Request{service=1, method=2, payload=3,
  timeout_nano=4}``, ``Response{status=1, payload=2}``, and
  ``google.rpc.Status{code=1, message=2}``; its header is ``length (u32 BE)
  | stream id (u32 BE) | type (u8) | flags (u8)``;
* NRI's multiplexer: ``conn id (u32 BE) | length (u32 BE)`` before each
  chunk, connection 1 the plugin's service, 2 the runtime's.
"""

from __future__ import annotations

import random
import time
import tracemalloc

import pytest

from mokka.simulators import protowire
from mokka.simulators.nri import model, ttrpc, wire
from mokka.simulators.protowire import WireError

pytestmark = pytest.mark.timeout(60)


def lp(key: int, data: bytes) -> bytes:
    """A length-delimited field written by hand: a varint length of one or two
    bytes (seven bits each, low first, the high bit set on all but the last)."""
    if len(data) < 128:
        return bytes([key, len(data)]) + data
    assert len(data) < 1 << 14
    return bytes([key, len(data) & 0x7F | 0x80, len(data) >> 7]) + data


# ---- protobuf writing -------------------------------------------------------


def test_varints() -> None:
    assert protowire.varint(0) == b"\x00"
    assert protowire.varint(300) == b"\xac\x02"
    # int64 -1: ten bytes of two's complement.
    assert protowire.varint(-1) == b"\xff" * 9 + b"\x01"


def test_register_plugin_request() -> None:
    assert wire.register_request("mokka", "10") == b"\x0a\x05mokka\x12\x0210"


def test_configure_response_subscribes_create_container_only() -> None:
    assert wire.configure_response() == b"\x10\x08"


def test_configure_request() -> None:
    payload = lp(0x0A, b"cfg") + lp(0x12, b"containerd") + lp(0x1A, b"2.1.9") + b"\x20\x88\x27"
    payload += b"\x28\xd0\x0f"  # request_timeout 2000 ms
    assert wire.decode_configure(payload) == wire.Configure("containerd", "2.1.9", 2000)


def test_synchronize_echoes_more() -> None:
    pods = lp(0x0A, lp(0x0A, b"pod-id"))
    assert wire.synchronize_response(pods + b"\x18\x01") == b"\x10\x01"
    assert wire.synchronize_response(pods) == b""


CREATE = lp(
    0x0A,  # pod
    lp(0x0A, b"sandbox") + lp(0x12, b"web") + lp(0x1A, b"uid-1") + lp(0x22, b"ns")
    + lp(0x32, lp(0x0A, b"mokka.dev/ambient") + lp(0x12, b"on")),
) + lp(
    0x12,  # container
    lp(0x0A, b"c1") + lp(0x12, b"sandbox") + lp(0x1A, b"app")
    + lp(0x32, lp(0x0A, b"cdi.k8s.io/x") + lp(0x12, b"nvidia.com/gpu=1"))
    + lp(0x42, b"PATH=/bin") + lp(0x42, b"NVIDIA_VISIBLE_DEVICES=1")
    + lp(0x4A, lp(0x0A, b"/data") + lp(0x12, b"bind") + lp(0x1A, b"/srv") + lp(0x22, b"rbind"))
    + lp(0x5A, lp(0x12, lp(0x0A, b"/dev/nvidia1") + lp(0x12, b"c") + b"\x18\xc3\x01\x20\x01")),
)


def test_create_container_request() -> None:
    assert wire.decode_create_container(CREATE) == model.Container(
        id="c1",
        name="app",
        pod_name="web",
        pod_namespace="ns",
        pod_uid="uid-1",
        annotations={"cdi.k8s.io/x": "nvidia.com/gpu=1"},
        pod_annotations={"mokka.dev/ambient": "on"},
        env=("PATH=/bin", "NVIDIA_VISIBLE_DEVICES=1"),
        mounts=(model.Mount("/data", "/srv", "bind", ("rbind",)),),
        devices=(model.Device("/dev/nvidia1", "c", 195, 1),),
    )


def test_create_container_response() -> None:
    adjustment = model.Adjustment(
        mounts=(model.Mount("/d", "/s", options=("rbind", "ro")),), env=("A=b=c",)
    )
    mount = lp(0x0A, b"/d") + lp(0x12, b"bind") + lp(0x1A, b"/s") + lp(0x22, b"rbind")
    mount += lp(0x22, b"ro")
    env = lp(0x0A, b"A") + lp(0x12, b"b=c")
    assert wire.create_container_response(adjustment) == lp(0x0A, lp(0x1A, mount) + lp(0x22, env))
    assert wire.create_container_response(model.Adjustment()) == b""


# ---- ttrpc and the multiplexer -----------------------------------------------


def test_frame() -> None:
    assert ttrpc.frame(2, 1, ttrpc.REQUEST, b"xyz") == (
        b"\0\0\0\x02\0\0\0\x0d" + b"\0\0\0\x03\0\0\0\x01\x01\x00xyz"
    )


def test_large_messages_go_in_chunks_the_runtime_can_read() -> None:
    body = bytes(range(256)) * 40
    data = ttrpc.frame(1, 7, ttrpc.RESPONSE, body)
    sizes, pos = [], 0
    while pos < len(data):
        assert data[pos : pos + 4] == b"\0\0\0\x01"
        size = int.from_bytes(data[pos + 4 : pos + 8], "big")
        sizes.append(size)
        pos += 8 + size
    assert max(sizes) == ttrpc.SEND_CHUNK
    assert sum(sizes) == 10 + len(body)
    # Fed a byte at a time, the deframer gives back the one message.
    deframer = ttrpc.Deframer()
    got = [m for i in range(len(data)) for m in deframer.feed(data[i : i + 1])]
    assert got == [ttrpc.Message(1, 7, ttrpc.RESPONSE, 0, body)]


def test_request_and_response_envelopes() -> None:
    request = ttrpc.Request(wire.PLUGIN_SERVICE, "Configure", b"\x10\x08", 2_000_000_000)
    encoded = ttrpc.encode_request(request)
    assert encoded == (
        lp(0x0A, wire.PLUGIN_SERVICE.encode()) + lp(0x12, b"Configure") + lp(0x1A, b"\x10\x08")
        + b"\x20" + protowire.varint(2_000_000_000)
    )
    assert ttrpc.decode_request(encoded) == request
    error = ttrpc.encode_response(ttrpc.Response(12, "no", b""))
    assert error == lp(0x0A, b"\x08\x0c" + lp(0x12, b"no")) + b"\x12\x00"
    assert ttrpc.decode_response(error) == ttrpc.Response(12, "no", b"")
    assert ttrpc.decode_response(b"\x12\x01x") == ttrpc.Response(0, "", b"x")


def test_other_connections_are_dropped() -> None:
    deframer = ttrpc.Deframer()
    other = b"\0\0\0\x09\0\0\0\x03abc"
    assert list(deframer.feed(other + ttrpc.frame(1, 3, ttrpc.REQUEST, b""))) == [
        ttrpc.Message(1, 3, ttrpc.REQUEST, 0, b"")
    ]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\0\0\0\x01\xff\xff\xff\xff", "chunk exceeds"),
        (b"\0\0\0\x01\0\0\0\x0a" + b"\x7f\xff\xff\xff\0\0\0\x01\x01\0", "ttrpc message exceeds"),
        (b"\0\0\0\x01\0\0\0\x0a" + b"\0\0\0\0\0\0\0\x01\x03\0", "type 3"),
    ],
    ids=["huge chunk", "huge message", "stream data"],
)
def test_malformed_frames(data: bytes, words: str) -> None:
    with pytest.raises(WireError, match=words):
        list(ttrpc.Deframer().feed(data))


# ---- bounds and fuzz ---------------------------------------------------------


def container_with(field_bytes: bytes) -> bytes:
    return protowire.bytes_field(2, field_bytes)


def test_counts_are_bounded() -> None:
    env = protowire.string_field(8, "A=b") * (wire.MOST + 1)
    with pytest.raises(WireError, match="more than 4096 env"):
        wire.decode_create_container(container_with(env))


def test_fields_are_bounded() -> None:
    # Unknown fields cost the budget too: two bytes each.
    unknown = b"\x78\x00" * (wire.FIELDS + 1)
    with pytest.raises(WireError, match="fields in one message"):
        wire.decode_create_container(container_with(unknown))


def test_deep_nesting_is_not_followed() -> None:
    # 2,000 levels of sub-messages where the container's linux field is: the
    # decoder reads only the levels its schema names, never recurses further.
    deep = b""
    for _ in range(2000):
        deep = protowire.bytes_field(2, deep)
    payload = container_with(protowire.bytes_field(11, deep))
    (device,) = wire.decode_create_container(payload).devices
    # Level 3 is LinuxDevice.type, a string: the rest is its (cut) text.
    assert device.path == ""
    assert 0 < len(device.type) <= wire.LIMIT


def test_huge_strings_are_cut() -> None:
    payload = container_with(protowire.string_field(3, "n" * 1_000_000))
    assert wire.decode_create_container(payload).name == "n" * wire.LIMIT


def test_endless_empty_chunks_hold_nothing() -> None:
    deframer = ttrpc.Deframer()
    empty = b"\0\0\0\x01\0\0\0\0" * 10_000
    tracemalloc.start()
    try:
        for _ in range(20):  # 200,000 chunks, no message
            assert list(deframer.feed(empty)) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(empty)


def test_fuzz_frames_and_decoders() -> None:
    """Seeded mutations of a good stream: a message or ``WireError``, nothing else, fast."""
    rng = random.Random(20261207)
    good = ttrpc.frame(
        1, 3, ttrpc.REQUEST,
        ttrpc.encode_request(ttrpc.Request(wire.PLUGIN_SERVICE, "CreateContainer", CREATE)),
    )
    started = time.monotonic()
    outcomes = {"message": 0, "error": 0}
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            what = rng.random()
            pos = rng.randrange(len(data))
            if what < 0.5:
                data[pos] = rng.randrange(256)
            elif what < 0.7:
                del data[pos : pos + rng.randint(1, 16)]
            else:
                data[pos:pos] = rng.randbytes(rng.randint(1, 16))
        try:
            for message in ttrpc.Deframer().feed(bytes(data)):
                request = ttrpc.decode_request(message.body)
                wire.decode_create_container(request.payload)
                wire.decode_configure(request.payload)
                wire.synchronize_response(request.payload)
                outcomes["message"] += 1
        except WireError:
            outcomes["error"] += 1
    assert outcomes["message"] > 100, outcomes
    assert outcomes["error"] > 100, outcomes
    assert time.monotonic() - started < 30
