"""The engine config format of ``docs/engine-config.md``, restated in Python:
the oracle of the NVML fuzz tests (``tests/nvml_fuzz_support.py``).

``parse_engine_config`` accepts or refuses a file as the library must;
``expected_answers`` says what the fuzz driver must then print for it
(nvmlInit's code, and each device's UUID and memory size).  It is written
from the format's description, not from the C parser, so where the two
disagree one of them is wrong.
"""

from __future__ import annotations

import re

import attrs

# The reader's limits (native/nvml/mock.h; docs/engine-config.md).
MAX_KEY = 200
MAX_VALUE = 4096
MAX_LINE = MAX_KEY + 2 * MAX_VALUE + 16
MAX_BYTES = 16 << 20
MAX_DEVICES = 64
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
UUID_BUFFER = 96  # the driver's buffer for nvmlDeviceGetUUID


_KEY = re.compile(rb"[A-Za-z0-9_.-]+")
_UNSIGNED = re.compile(rb"[0-9]+|0[xX][0-9a-fA-F]+")


def _unquote(value: bytes) -> bytes | None:
    """A double-quoted value without its quotes; None when malformed."""
    out = bytearray()
    i = 1
    while i < len(value) and value[i : i + 1] != b'"':
        if value[i : i + 1] == b"\\":
            i += 1
            if value[i : i + 1] not in (b"\\", b'"'):
                return None
        out += value[i : i + 1]
        i += 1
    if value[i : i + 1] != b'"':
        return None
    rest = value[i + 1 :].lstrip(b" \t")
    if rest and not rest.startswith(b"#"):
        return None
    return bytes(out)


def parse_unsigned(value: bytes | None) -> int | None:
    """A decimal or 0x-hex number that fits 64 bits, as the format allows."""
    if value is None or not _UNSIGNED.fullmatch(value):
        return None
    number = int(value, 16) if value[:2] in (b"0x", b"0X") else int(value)
    return number if number < 1 << 64 else None


def sanitise_utf8(data: bytes) -> bytes:
    """``data``, each byte outside well-formed UTF-8 replaced by ``?`` (as the library reads it)."""
    out = bytearray()
    while True:
        try:
            data.decode()
        except UnicodeDecodeError as error:
            out += data[:error.start] + b"?" * (error.end - error.start)
            data = data[error.end:]
        else:
            return bytes(out + data)


def parse_engine_config(data: bytes) -> dict[bytes, bytes] | None:
    """The entries of a valid engine config (later duplicates win); None
    when the library must refuse the file."""
    if len(data) > MAX_BYTES or b"\0" in data:
        return None
    data = sanitise_utf8(data)
    entries: dict[bytes, bytes] = {}
    for raw in data.split(b"\n"):
        line = raw.rstrip(b"\r \t")
        if not line or line.startswith(b"#"):
            continue
        if len(line) > MAX_LINE:
            return None
        sep = line.find(b": ")
        if sep < 0 and line.endswith(b":"):
            sep = len(line) - 1
        if sep < 0:
            return None
        key = line[:sep]
        if not 1 <= len(key) <= MAX_KEY or not _KEY.fullmatch(key):
            return None
        value = line[sep + 2 :].lstrip(b" ")
        if value.startswith(b'"'):
            unquoted = _unquote(value)
            if unquoted is None:
                return None
            value = unquoted
        else:
            comment = value.find(b" #")
            if comment >= 0:
                value = value[:comment]
            value = value.rstrip(b" ")
        if len(value) > MAX_VALUE:
            return None
        entries[key] = value
    if entries.get(b"format") != b"1":
        return None
    count = parse_unsigned(entries.get(b"device_count"))
    if count is None or count > MAX_DEVICES:
        return None
    return entries


def escape(value: bytes) -> str:
    """The driver's spelling of a string: printable ASCII, the rest as \\xNN."""
    return "".join(chr(b) if 0x20 < b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in value)


@attrs.frozen(kw_only=True)
class Expected:
    """What the driver must print for one config (no device filtering)."""

    #: nvmlInit's return code: 0, or NVML_ERROR_UNKNOWN for a refused file.
    init: int
    #: Per visible device, in index order: (uuid answer, memory answer or None
    #: when either a value or GPU_IS_LOST is right, for a GPU set to fail).
    devices: tuple[tuple[str, str | None], ...] = ()


def expected_answers(data: bytes) -> Expected:
    entries = parse_engine_config(data)
    if entries is None:
        return Expected(init=NVML_ERROR_UNKNOWN)
    count = parse_unsigned(entries[b"device_count"])
    assert count is not None
    devices = []
    for pos in range(count):
        uuid = entries.get(f"device.{pos}.uuid".encode())
        if uuid is None:
            uuid_answer = f"!{NVML_ERROR_NOT_SUPPORTED}"
        elif len(uuid) + 1 > UUID_BUFFER:
            uuid_answer = f"!{NVML_ERROR_INSUFFICIENT_SIZE}"
        else:
            uuid_answer = escape(uuid)
        mode = entries.get(f"device.{pos}.failure.mode".encode())
        memory_answer: str | None
        if mode in (b"lost", b"fallen_off_bus"):
            memory_answer = None  # depends on the calls before (after_calls, probability)
        else:
            total = parse_unsigned(entries.get(f"device.{pos}.memory.total_bytes".encode()))
            memory_answer = f"!{NVML_ERROR_NOT_SUPPORTED}" if total is None else str(total)
        devices.append((uuid_answer, memory_answer))
    return Expected(init=NVML_SUCCESS, devices=tuple(devices))
