"""The Protocol Buffers wire format, read-only, just enough for the kubelet's answers.

The pod-resources answers are a handful of nested messages of strings,
integers and sub-messages.  Reading them here, rather than through generated
``protobuf`` classes, keeps the daemon free of a code generator and of the
``protobuf`` runtime (memory per node matters in a DaemonSet), and puts every
bound on a hostile or damaged answer in one place: lengths are checked
against the buffer, varints stop at ten bytes, groups (a wire type the
pod-resources API never uses) are refused.

An answer is decoded into ``Fields``: field number -> the values seen for it,
in order (a repeated field has several; a singular one's last value wins, as
protobuf says).
"""

from __future__ import annotations

from collections.abc import Iterator

#: Wire types (https://protobuf.dev/programming-guides/encoding/).
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5

#: A varint is at most ten bytes (64 bits, seven per byte).
_MAX_VARINT_BYTES = 10

Fields = dict[int, list[int | bytes]]


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


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


def iter_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """``(number, wire type, value)`` for every field of one message, in order."""
    pos = 0
    while pos < len(buf):
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
                raise WireError(
                    f"field {number}: {length} bytes announced, {len(buf) - pos} left"
                )
            value, pos = bytes(buf[pos : pos + length]), pos + length
        else:
            raise WireError(f"field {number}: wire type {wire_type} is not used by this API")
        yield number, wire_type, value


def decode(buf: bytes) -> Fields:
    """Field number -> every value of that field, in order."""
    fields: Fields = {}
    for number, _, value in iter_fields(buf):
        fields.setdefault(number, []).append(value)
    return fields


def messages(fields: Fields, number: int) -> list[Fields]:
    """The sub-messages in field ``number`` (a repeated or singular message field)."""
    out = []
    for value in fields.get(number, ()):
        if not isinstance(value, bytes):
            raise WireError(f"field {number}: expected a message, found a number")
        out.append(decode(value))
    return out


def strings(fields: Fields, number: int, *, limit: int) -> list[str]:
    """The strings in field ``number``, each cut to ``limit`` characters.

    Invalid UTF-8 is replaced, not refused: a name is for display and for
    matching, and one odd byte should not discard a whole answer.
    """
    out = []
    for value in fields.get(number, ()):
        if not isinstance(value, bytes):
            raise WireError(f"field {number}: expected a string, found a number")
        out.append(value.decode("utf-8", errors="replace")[:limit])
    return out


def string(fields: Fields, number: int, *, limit: int) -> str:
    """A singular string field (the last value wins; absent: empty)."""
    values = strings(fields, number, limit=limit)
    return values[-1] if values else ""
