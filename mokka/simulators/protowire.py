"""The Protocol Buffers wire format, by hand: every bound in one place.

The daemon speaks protobuf to two peers, the kubelet's pod-resources API
(``mokka.simulators.workload``) and containerd's NRI (``mokka.simulators.nri``),
and reads both here rather than through generated ``protobuf`` classes: that
keeps the daemon free of a code generator and of the ``protobuf`` runtime
(memory per node matters in a DaemonSet), and puts every bound on a hostile
or damaged message in one place: lengths are checked against the buffer,
varints stop at ten bytes, groups (a wire type neither API uses) are refused.

What one message may cost is bounded too, before it is paid:

* a ``Budget`` counts every field read, at every depth, known or not, and
  refuses the message past its limit: the CPU one decode takes is bounded by
  the limit, not by what the sender packed into the bytes it may send (4 MiB
  of two-byte empty messages are two million of them);
* a message keeps only the fields its reader asks for (``Field``), each at
  most ``most`` times: an unknown field costs its budget and nothing else,
  and a repeated field past its count ends the decode at once;
* sub-messages are decoded one at a time (``messages`` is a generator), so
  no more than one of each level is held decoded at once, and only as deep
  as the reader's code descends: nesting in the bytes is never followed on
  its own;
* the budget's ``checkpoint`` is called every ``CHECK_EVERY`` fields: a
  decode running in a worker thread that its caller abandoned stops there
  (``trio.from_thread.check_cancelled`` raises) instead of running on.

A message is decoded into ``Fields``: field number -> the values kept for
it, in order (a repeated field has several; a singular one keeps only its
last value, which wins, as protobuf says).

Writing is the few helpers at the end (``varint_field``, ``bytes_field``,
``string_field``): a message is the concatenation of its fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import attrs

#: Wire types (https://protobuf.dev/programming-guides/encoding/).
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5

#: A varint is at most ten bytes (64 bits, seven per byte).
_MAX_VARINT_BYTES = 10
#: Fields read between two calls of a budget's ``checkpoint``: often enough
#: that an abandoned decode stops within a millisecond or so, rarely enough
#: that the call costs nothing measurable.
CHECK_EVERY = 1024

Fields = dict[int, list[int | bytes]]


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message, or exceed a bound."""


@attrs.frozen
class Field:
    """A field a reader keeps: ``what`` it is (for errors), at most ``most`` values.

    ``most=None``: a singular field; only its last value is kept.
    """

    what: str
    most: int | None = None


#: Which fields of a message a reader keeps: field number -> ``Field``.
Schema = Mapping[int, Field]


@attrs.define(eq=False)
class Budget:
    """What decoding one message may still cost: fields read, at every depth."""

    #: Most fields the message may hold, at every depth.
    fields: int
    #: Called every ``CHECK_EVERY`` fields; may raise to stop the decode.
    checkpoint: Callable[[], object] | None = None
    #: Fields read so far.
    spent: int = attrs.field(default=0, init=False)

    def spend(self) -> None:
        self.spent += 1
        if self.spent > self.fields:
            raise WireError(f"more than {self.fields} fields in one message")
        if self.checkpoint is not None and self.spent % CHECK_EVERY == 0:
            self.checkpoint()


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(buf):
            raise WireError(f"varint at byte {pos} runs past the end of the message")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value & 0xFFFF_FFFF_FFFF_FFFF, pos + i + 1
        shift += 7
    raise WireError(f"varint at byte {pos} is longer than {_MAX_VARINT_BYTES} bytes")


def _fixed(buf: bytes, pos: int, size: int) -> tuple[int, int]:
    if pos + size > len(buf):
        raise WireError(f"{size}-byte field at byte {pos} runs past the end of the message")
    return int.from_bytes(buf[pos : pos + size], "little"), pos + size


def iter_fields(buf: bytes, budget: Budget) -> Iterator[tuple[int, int, int | bytes]]:
    """``(number, wire type, value)`` for every field of one message, in order."""
    pos = 0
    while pos < len(buf):
        budget.spend()
        key, pos = _varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire_type == VARINT:
            value, pos = _varint(buf, pos)
        elif wire_type == I64:
            value, pos = _fixed(buf, pos, 8)
        elif wire_type == I32:
            value, pos = _fixed(buf, pos, 4)
        elif wire_type == LEN:
            length, pos = _varint(buf, pos)
            if length > len(buf) - pos:
                raise WireError(f"field {number}: {length} bytes announced, {len(buf) - pos} left")
            value, pos = bytes(buf[pos : pos + length]), pos + length
        else:
            raise WireError(f"field {number}: wire type {wire_type} is not used by this API")
        yield number, wire_type, value


def decode(buf: bytes, budget: Budget, schema: Schema) -> Fields:
    """Field number -> the values kept of that field, in order (see ``Field``)."""
    fields: Fields = {}
    for number, _, value in iter_fields(buf, budget):
        field = schema.get(number)
        if field is None:
            continue  # not read: paid for in the budget, not kept
        if field.most is None:
            fields[number] = [value]
            continue
        values = fields.setdefault(number, [])
        if len(values) >= field.most:
            raise WireError(f"more than {field.most} {field.what}")
        values.append(value)
    return fields


def messages(fields: Fields, number: int, budget: Budget, schema: Schema) -> Iterator[Fields]:
    """The sub-messages in field ``number``, decoded one at a time as they are consumed."""
    for value in fields.get(number, ()):
        if not isinstance(value, bytes):
            raise WireError(f"field {number}: expected a message, found a number")
        yield decode(value, budget, schema)


def strings(fields: Fields, number: int, *, limit: int) -> list[str]:
    """The strings in field ``number``, each cut to ``limit`` characters.

    Invalid UTF-8 is replaced, not refused: a name is for display and for
    matching, and one odd byte should not discard a whole message.
    """
    out = []
    for value in fields.get(number, ()):
        if not isinstance(value, bytes):
            raise WireError(f"field {number}: expected a string, found a number")
        # Cut before decoding too: a kept value may be megabytes long.
        out.append(value[: 4 * limit].decode("utf-8", errors="replace")[:limit])
    return out


def string(fields: Fields, number: int, *, limit: int) -> str:
    """A singular string field (the last value wins; absent: empty)."""
    values = strings(fields, number, limit=limit)
    return values[-1] if values else ""


# ---- writing ---------------------------------------------------------------


def varint(value: int) -> bytes:
    """``value`` as a varint; a negative one as its 64-bit two's complement (ten
    bytes), which is how ``int32``/``int64`` fields carry it."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint_field(number: int, value: int) -> bytes:
    """A varint field (``int32``, ``int64``, ``uint32``, ``bool``, enums); zero is
    written too, so the caller decides what is left out."""
    return varint(number << 3 | VARINT) + varint(value)


def bytes_field(number: int, value: bytes) -> bytes:
    """A length-delimited field: bytes, a string's UTF-8, or an encoded sub-message."""
    return varint(number << 3 | LEN) + varint(len(value)) + value


def string_field(number: int, value: str) -> bytes:
    return bytes_field(number, value.encode())
