"""ttrpc over NRI's connection multiplexer: the frames on the plugin's one socket.

An NRI plugin holds one Unix socket to the runtime and runs two ttrpc
conversations over it: it is a client of the runtime's ``Runtime`` service
(``RegisterPlugin``) and a server of its own ``Plugin`` service (the
runtime calls ``Configure``, ``Synchronize``, ``CreateContainer``...).  NRI's
multiplexer (``pkg/net/multiplex`` of github.com/containerd/nri) keeps them
apart:

* every chunk on the socket is ``conn id (u32 BE) | length (u32 BE) | bytes``;
  the bytes of one logical connection, concatenated, are a byte stream;
  connection 1 carries the ``Plugin`` service (the runtime calls, the plugin
  answers), connection 2 the ``Runtime`` service (the plugin calls);
* on each logical connection, ttrpc (github.com/containerd/ttrpc): a 10-byte
  header ``length (u32 BE) | stream id (u32 BE) | type (u8) | flags (u8)``,
  then ``length`` bytes (at most 4 MiB) of a protobuf ``Request``
  (type 1) or ``Response`` (type 2); a caller numbers its calls with odd
  stream ids, and the answer carries the call's id.

This module is sans-I/O: a ``Deframer`` turns received bytes into
``Message`` values and ``frame`` turns one message into bytes to send.  It
never decides anything about NRI (``mokka.simulators.nri.wire`` does); every
bound on what a peer may make it hold is here.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import attrs

from mokka.simulators import protowire
from mokka.simulators.protowire import Budget, Field, WireError

#: The multiplexer's logical connections (``PluginServiceConn``, ``RuntimeServiceConn``).
PLUGIN_CONN, RUNTIME_CONN = 1, 2
#: ttrpc message types.
REQUEST, RESPONSE = 1, 2
#: ttrpc's own limit on one message's body.
MAX_MESSAGE = 4 << 20
#: The multiplexer's limit on one chunk: one whole ttrpc message.
MAX_CHUNK = 10 + MAX_MESSAGE
#: The largest chunk this side sends.  The runtime reads a logical connection
#: through a 4 KiB ``bufio.Reader``, and the multiplexer refuses a read into a
#: buffer smaller than the chunk (``ENOMEM``): larger messages go in pieces.
SEND_CHUNK = 4096
#: gRPC status codes this side answers with.
UNIMPLEMENTED, UNAVAILABLE = 12, 14
#: Fields one ttrpc ``Request``/``Response`` envelope may hold (the payload is
#: one field; metadata pairs are not kept).
_ENVELOPE_FIELDS = 1024

_MUX = struct.Struct(">II")
_TTRPC = struct.Struct(">IIBB")


@attrs.frozen
class Message:
    """One ttrpc message on one logical connection."""

    conn: int
    stream: int
    type: int
    flags: int
    body: bytes


@attrs.frozen
class Request:
    service: str
    method: str
    payload: bytes
    #: The caller's deadline, nanoseconds from now (0: none given).
    timeout_ns: int = 0


@attrs.frozen
class Response:
    #: gRPC status code; 0 is success.
    code: int
    message: str
    payload: bytes


def frame(conn: int, stream: int, type_: int, body: bytes, flags: int = 0) -> bytes:
    """One ttrpc message as multiplexer chunks of at most ``SEND_CHUNK`` bytes."""
    if len(body) > MAX_MESSAGE:
        raise WireError(f"a {len(body)}-byte message exceeds ttrpc's {MAX_MESSAGE}")
    data = _TTRPC.pack(len(body), stream, type_, flags) + body
    return b"".join(
        _MUX.pack(conn, len(piece)) + piece
        for piece in (data[i : i + SEND_CHUNK] for i in range(0, len(data), SEND_CHUNK))
    )


@attrs.define(eq=False)
class Deframer:
    """Received bytes -> ``Message`` values; raises ``WireError`` on anything malformed.

    Holds at most one partial chunk and, per logical connection, one partial
    ttrpc message: both are bounded by their length fields, which are checked
    before anything is buffered.  Chunks of connections other than the two
    NRI uses are read and dropped, as the runtime's multiplexer does.
    """

    _pending: bytearray = attrs.field(factory=bytearray, init=False)
    _streams: dict[int, bytearray] = attrs.field(
        factory=lambda: {PLUGIN_CONN: bytearray(), RUNTIME_CONN: bytearray()}, init=False
    )

    def feed(self, data: bytes) -> Iterator[Message]:
        self._pending += data
        pos = 0
        try:
            while len(self._pending) - pos >= _MUX.size:
                conn, length = _MUX.unpack_from(self._pending, pos)
                if length > MAX_CHUNK:
                    raise WireError(f"a {length}-byte chunk exceeds the multiplexer's {MAX_CHUNK}")
                if len(self._pending) - pos - _MUX.size < length:
                    break
                start = pos + _MUX.size
                pos = start + length
                stream = self._streams.get(conn)
                if stream is not None and length:
                    stream += self._pending[start:pos]
                    yield from _messages(conn, stream)
        finally:
            del self._pending[:pos]


def _messages(conn: int, stream: bytearray) -> Iterator[Message]:
    pos = 0
    try:
        while len(stream) - pos >= _TTRPC.size:
            length, sid, type_, flags = _TTRPC.unpack_from(stream, pos)
            if length > MAX_MESSAGE:
                raise WireError(f"a {length}-byte ttrpc message exceeds {MAX_MESSAGE}")
            if type_ not in (REQUEST, RESPONSE):
                # Streaming (type 3 data) is no part of NRI's services.
                raise WireError(f"ttrpc message type {type_} on connection {conn}")
            if len(stream) - pos - _TTRPC.size < length:
                break
            start = pos + _TTRPC.size
            pos = start + length
            yield Message(conn, sid, type_, flags, bytes(stream[start:pos]))
    finally:
        del stream[:pos]


# ---- the envelopes (ttrpc's request.proto, google.rpc.Status) --------------

_REQUEST = {1: Field("service"), 2: Field("method"), 3: Field("payload"), 4: Field("timeout")}
_RESPONSE = {1: Field("status"), 2: Field("payload")}
_STATUS = {1: Field("code"), 2: Field("message")}
#: Service and method names are short; anything longer is not NRI's.
_NAME_LIMIT = 256


def encode_request(request: Request) -> bytes:
    return (
        protowire.string_field(1, request.service)
        + protowire.string_field(2, request.method)
        + protowire.bytes_field(3, request.payload)
        + (protowire.varint_field(4, request.timeout_ns) if request.timeout_ns else b"")
    )


def decode_request(body: bytes) -> Request:
    fields = protowire.decode(body, Budget(_ENVELOPE_FIELDS), _REQUEST)
    return Request(
        service=protowire.string(fields, 1, limit=_NAME_LIMIT),
        method=protowire.string(fields, 2, limit=_NAME_LIMIT),
        payload=_bytes(fields, 3),
        timeout_ns=_int(fields, 4),
    )


def encode_response(response: Response) -> bytes:
    status = b""
    if response.code:
        status = protowire.varint_field(1, response.code) + protowire.string_field(
            2, response.message
        )
    return protowire.bytes_field(1, status) + protowire.bytes_field(2, response.payload)


def decode_response(body: bytes) -> Response:
    budget = Budget(_ENVELOPE_FIELDS)
    fields = protowire.decode(body, budget, _RESPONSE)
    status = next(protowire.messages(fields, 1, budget, _STATUS), {})
    return Response(
        code=_int(status, 1),
        message=protowire.string(status, 2, limit=1024),
        payload=_bytes(fields, 2),
    )


def _bytes(fields: protowire.Fields, number: int) -> bytes:
    values = fields.get(number, [b""])
    if not isinstance(values[-1], bytes):
        raise WireError(f"field {number}: expected bytes, found a number")
    return values[-1]


def _int(fields: protowire.Fields, number: int) -> int:
    values = fields.get(number, [0])
    if not isinstance(values[-1], int):
        raise WireError(f"field {number}: expected a number, found bytes")
    return values[-1]
