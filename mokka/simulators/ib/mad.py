"""Management datagrams as bytes: the umad frame, the MAD header, control frames.

What travels on the shim's socket (``native/umadshim``) is exactly what a
kernel umad file reads and writes: one ``struct ib_user_mad`` per datagram,
a 64-byte header (``ib_user_mad_hdr`` of ``include/uapi/rdma/ib_user_mad.h``,
the "new" API with ``pkey_index``) followed by a 256-byte MAD.  Frames
shorter than the header are the shim's control frames (``Control``).

Byte order: the umad header's first five words are host order (the kernel
and the tools share the machine), the address fields network order; every
MAD field is network order.
"""

from __future__ import annotations

import struct

import attrs

#: ``struct ib_user_mad_hdr`` (64 bytes): id, status, timeout_ms, retries,
#: length (host order); qpn, qkey, lid, sl, path_bits, grh_present,
#: gid_index, hop_limit, traffic_class, gid[16], flow_label, pkey_index,
#: reserved[6].
_HOST = struct.Struct("=5I")
_ADDR = struct.Struct(">IIHBBBBBB16sI")
_PKEY = struct.Struct("=H6x")
UMAD_HEADER_SIZE = _HOST.size + _ADDR.size + _PKEY.size
MAD_SIZE = 256
assert UMAD_HEADER_SIZE == 64

#: Management classes the daemon serves.
CLASS_SMP_LID = 0x01
CLASS_SA = 0x03
CLASS_PERF = 0x04
CLASS_SMP_DR = 0x81
#: ``IB_VENDOR_OPENIB_PING_CLASS``: vendor range 2 with the OpenIB OUI.
CLASS_VENDOR_PING = 0x32

METHOD_GET = 0x01
METHOD_SET = 0x02
METHOD_GET_RESP = 0x81
#: The response bit of the method byte.
METHOD_RESPONSE = 0x80

#: MAD status codes (high byte class-specific, low bits common).
STATUS_OK = 0x0000
STATUS_UNSUP_METHOD_ATTR = 0x000C
STATUS_INVALID_FIELD = 0x001C
#: The D (direction) bit of a directed-route SMP's status word.
DR_DIRECTION = 0x8000

#: ``errno`` values the kernel puts in the umad ``status`` of a send that
#: got no answer, and (``ENOMEM``) of one it had no room for.
ETIMEDOUT = 110
ENOMEM = 12

#: QP and Q_Key of the general services interface (QP1).
GSI_QPN = 1
GSI_QKEY = 0x80010000
#: The permissive LID: the destination of a pure directed-route SMP.
PERMISSIVE_LID = 0xFFFF


@attrs.frozen(kw_only=True)
class Umad:
    """One ``struct ib_user_mad``: the header fields the daemon uses, and the MAD."""

    agent_id: int
    status: int = 0
    timeout_ms: int = 0
    retries: int = 0
    qpn: int = 0
    qkey: int = 0
    lid: int = 0
    sl: int = 0
    pkey_index: int = 0
    mad: bytes = bytes(MAD_SIZE)

    def pack(self) -> bytes:
        mad = self.mad.ljust(MAD_SIZE, b"\0")[:MAD_SIZE]
        return (
            _HOST.pack(self.agent_id, self.status, self.timeout_ms, self.retries,
                       UMAD_HEADER_SIZE + len(mad))
            + _ADDR.pack(self.qpn, self.qkey, self.lid, self.sl, 0, 0, 0, 0, 0, bytes(16), 0)
            + _PKEY.pack(self.pkey_index)
            + mad
        )

    @classmethod
    def unpack(cls, frame: bytes) -> Umad:
        """A frame from the shim; ``ValueError`` when it cannot be one."""
        if len(frame) < UMAD_HEADER_SIZE + 24:
            raise ValueError(f"umad frame of {len(frame)} bytes, expected at least 88")
        agent, status, timeout, retries, _length = _HOST.unpack_from(frame)
        qpn, qkey, lid, sl, *_rest = _ADDR.unpack_from(frame, _HOST.size)
        (pkey,) = _PKEY.unpack_from(frame, _HOST.size + _ADDR.size)
        return cls(
            agent_id=agent, status=status, timeout_ms=timeout, retries=retries, qpn=qpn,
            qkey=qkey, lid=lid, sl=sl, pkey_index=pkey,
            mad=frame[UMAD_HEADER_SIZE:].ljust(MAD_SIZE, b"\0")[:MAD_SIZE],
        )


# ---- the MAD common header (24 bytes) -------------------------------------


def mgmt_class(mad: bytes) -> int:
    return mad[1]


def class_version(mad: bytes) -> int:
    return mad[2]


def method(mad: bytes) -> int:
    return mad[3]


def is_response(mad: bytes) -> bool:
    return bool(mad[3] & METHOD_RESPONSE)


def tid(mad: bytes) -> int:
    return int.from_bytes(mad[8:16], "big")


def attr_id(mad: bytes) -> int:
    return int.from_bytes(mad[16:18], "big")


def attr_mod(mad: bytes) -> int:
    return int.from_bytes(mad[20:24], "big")


def response(request: bytes, status: int = STATUS_OK, *, data_offset: int = 64,
             data: bytes = b"") -> bytes:
    """The GetResp for ``request``: same header with the response method and
    ``status``, ``data`` at ``data_offset`` (the rest of the request kept)."""
    mad = bytearray(request.ljust(MAD_SIZE, b"\0")[:MAD_SIZE])
    mad[3] = METHOD_GET_RESP
    word = int.from_bytes(mad[4:6], "big")
    keep = word & DR_DIRECTION if mgmt_class(request) == CLASS_SMP_DR else 0
    mad[4:6] = (keep | status).to_bytes(2, "big")
    if data:
        mad[data_offset : data_offset + len(data)] = data
    return bytes(mad)


# ---- directed-route SMP fields --------------------------------------------


def dr_hop_count(mad: bytes) -> int:
    return mad[7]


def dr_initial_path(mad: bytes) -> bytes:
    """Initial path bytes 1..hop count (byte 0 of the path is reserved)."""
    return mad[128 + 1 : 128 + 1 + dr_hop_count(mad)]


def dr_response(request: bytes, status: int, data: bytes) -> bytes:
    """A directed-route GetResp: D bit set, hop pointer at the hop count."""
    mad = bytearray(response(request, status, data_offset=64, data=data))
    word = int.from_bytes(mad[4:6], "big") | DR_DIRECTION
    mad[4:6] = word.to_bytes(2, "big")
    mad[6] = mad[7]
    return bytes(mad)


# ---- the shim's control frames ----------------------------------------------

CONTROL_MAGIC = b"MKIB"
CTL_HELLO = 1
CTL_REGISTER = 2
CTL_UNREGISTER = 3
#: ``mokka ctl ib-counter``: raise (or set) a port counter of a local HCA;
#: arg = HCA index, then ``_COUNTER``.
CTL_COUNTER = 4
#: request: magic, op, arg (host order), then ``struct ib_user_mad_reg_req``
_CONTROL = struct.Struct("=4sII")
#: ``ib_user_mad_reg_req``: id, method_mask[4], qpn, mgmt_class,
#: mgmt_class_version, oui[3], rmpp_version (27 bytes, padded to 28)
_REG_REQ = struct.Struct("=I16sBBB3sBx")
_REPLY = struct.Struct("=4sIiI")
#: counter name (NUL-padded), mode (``COUNTER_ADD`` or ``COUNTER_SET``), value
_COUNTER = struct.Struct("=32sIQ")
COUNTER_ADD = 0
COUNTER_SET = 1
#: The modes there are; any other is refused.
COUNTER_MODES = (COUNTER_ADD, COUNTER_SET)


@attrs.frozen
class Registration:
    """What an agent registered for (``IB_USER_MAD_REGISTER_AGENT``)."""

    mgmt_class: int
    class_version: int
    #: bit n set: the agent receives unsolicited requests with method n
    method_mask: int
    oui: int
    qpn: int

    def accepts(self, mad: bytes) -> bool:
        """Whether an unsolicited request is for this agent."""
        cls = mgmt_class(mad)
        if cls != self.mgmt_class or not self.method_mask >> method(mad) & 1:
            return False
        if 0x30 <= cls <= 0x4F:
            return int.from_bytes(mad[37:40], "big") == self.oui
        return True


@attrs.frozen
class CounterChange:
    """What ``mokka ctl ib-counter`` asks for."""

    name: str
    mode: int
    value: int


@attrs.frozen
class Control:
    """A control frame from the shim (or from ``mokka ctl``)."""

    op: int
    arg: int
    registration: Registration | None = None
    counter: CounterChange | None = None

    @classmethod
    def unpack(cls, frame: bytes) -> Control:
        if len(frame) < _CONTROL.size or frame[:4] != CONTROL_MAGIC:
            raise ValueError(f"control frame of {len(frame)} bytes without the MKIB magic")
        _magic, op, arg = _CONTROL.unpack_from(frame)
        registration = None
        if op == CTL_REGISTER:
            if len(frame) < _CONTROL.size + _REG_REQ.size:
                raise ValueError("register frame without its ib_user_mad_reg_req")
            _id, mask, qpn, cls_, version, oui, _rmpp = _REG_REQ.unpack_from(frame, _CONTROL.size)
            registration = Registration(
                mgmt_class=cls_, class_version=version,
                method_mask=int.from_bytes(mask, "little"),
                oui=int.from_bytes(oui, "big"), qpn=qpn,
            )
        counter = None
        if op == CTL_COUNTER:
            if len(frame) < _CONTROL.size + _COUNTER.size:
                raise ValueError("counter frame without its counter")
            name, mode, value = _COUNTER.unpack_from(frame, _CONTROL.size)
            counter = CounterChange(name=name.rstrip(b"\0").decode(errors="replace"),
                                    mode=mode, value=value)
        return cls(op=op, arg=arg, registration=registration, counter=counter)


def control_frame(op: int, arg: int = 0, payload: bytes = b"") -> bytes:
    """A control frame as the shim writes it: magic, ``op``, ``arg``, ``payload``."""
    return _CONTROL.pack(CONTROL_MAGIC, op, arg) + payload


def counter_frame(hca: int, name: str, mode: int, value: int) -> bytes:
    """The control frame of a counter change (``CTL_COUNTER``)."""
    return control_frame(CTL_COUNTER, hca, _COUNTER.pack(name.encode()[:32], mode, value))


def parse_reply(frame: bytes) -> tuple[int, int, int]:
    """(op, result, value) of a control reply; ``ValueError`` when it is none."""
    if len(frame) != _REPLY.size or frame[:4] != CONTROL_MAGIC:
        raise ValueError(f"control reply of {len(frame)} bytes without the MKIB magic")
    _magic, op, result, value = _REPLY.unpack(frame)
    return op, result, value


def control_reply(op: int, result: int = 0, value: int = 0) -> bytes:
    """The shim's answer to a control frame: ``result`` 0 or ``-errno``."""
    return _REPLY.pack(CONTROL_MAGIC, op, result, value)


#: A ``CTL_COUNTER`` reply's whole value after the reply (the reply's own
#: value field has 32 bits; the data and packet counters have 64).
_WIDE = struct.Struct("=Q")


def counter_reply(result: int, value: int = 0) -> bytes:
    """The answer to ``CTL_COUNTER``: the reply, then the counter's 64-bit value."""
    return control_reply(CTL_COUNTER, result, min(value, 0xFFFFFFFF)) + _WIDE.pack(value)


def parse_counter_reply(frame: bytes) -> tuple[int, int]:
    """(result, value) of a ``counter_reply``; ``ValueError`` when it is none.

    A plain 16-byte reply (a daemon of an earlier release) gives the 32-bit value."""
    if len(frame) not in (_REPLY.size, _REPLY.size + _WIDE.size):
        raise ValueError(f"counter reply of {len(frame)} bytes, expected "
                         f"{_REPLY.size + _WIDE.size}")
    op, result, value = parse_reply(frame[: _REPLY.size])
    if op != CTL_COUNTER:
        raise ValueError(f"counter reply for op {op}")
    if len(frame) > _REPLY.size:
        (value,) = _WIDE.unpack_from(frame, _REPLY.size)
    return result, value
