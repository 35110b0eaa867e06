"""Field checks shared by the profile, topology and overrides parsers.

Every input document is validated the same way: walk the ``yaml.safe_load``
output, and for every field the daemon reads check its type and shape,
recording each problem instead of stopping at the first.  A user fixing a
profile wants the whole list at once (``SpecError`` carries it), each entry
phrased ``<file>: <field path>: <what was found>, expected <what>`` or
``<file>: <field path>: <found> is not <expected>``.

The checkers return the converted value, or ``None`` after recording a
problem, so a parser can keep going and report the next field too.
Reading and parsing the files (bounded, see ``mokka.state.reader``) turn
unreadable input into the same kind of message.

The checks are plain functions over plain values rather than a schema
library: each message must use the user's own field path
(``devices[3].pci.bus_id``, not a JSON pointer), several rules span fields
(a bus id under at most one root, unique minor numbers) and a profile that
Helm re-rendered needs its numbers repaired before any type check runs
(``normalize_numbers``).  Nothing here raises on a bad value; only
``Problems.raise_if_any`` raises, always ``SpecError``.

Messages quote input only in short excerpts (``found``, ``sub``), and a
file's problems are capped at ``MAX_PROBLEMS``: they end in logs and in the
``/readyz`` body, which a hostile document must not be able to fill.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from mokka.errors import SpecError
from mokka.state.reader import excerpt

#: Canonical PCI address as profiles spell it (``0000:53:00.0``); NVML's
#: 8-digit domain (``00000000:53:00.0``, what ``nvidia-smi`` prints) is
#: accepted too, so a user can paste a bus id from a real node.  Groups:
#: domain, bus, device, function; the function is one digit 0..7 (three bits
#: of the address).  The device number's range (00..1f, five bits) is
#: checked by ``canonical_bdf``.
BDF_RE = re.compile(r"^([0-9a-fA-F]{4}|[0-9a-fA-F]{8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
#: An 8-4-4-4-12 hex UUID in either case (fabric cluster UUIDs, ComputeDomain
#: ``uuid``); callers lower-case what they keep, so two spellings of one UUID
#: compare equal and give the same content hash.
UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
#: NVML's GPU UUID, ``GPU-`` and the same groups; ``pattern[1:]`` drops the
#: inner ``^`` so the anchor sits before the prefix.
GPU_UUID_RE = re.compile(r"^GPU-" + UUID_RE.pattern[1:])
#: Problems reported per file: a list a person reads to fix the file, and
#: bounded, however many fields a generated document gets wrong.
MAX_PROBLEMS = 50


#: Characters of one problem's message (after the file and field it names).
MAX_MESSAGE = 300


class Problems:
    """Collects problems for one input file; ``raise_if_any`` ends the parse.

    One instance per document: ``source`` (a path, or a built-in's
    ``h100.yaml``) leads every message, so a ``SpecError`` that mixes the
    problems of several files (``compile.load_inputs``) still says which
    file each one is about.  ``items`` is public on purpose: a parser
    compares its length before and after a group of checks to learn
    whether that group failed, without every checker returning a status.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        """Record ``message`` about the field at ``path`` (``""``: the document itself)."""
        where = f"{self.source}: {path}" if path else self.source
        # The last word on length: a checker that quotes input without
        # ``found`` (a repeated id, an unparsable address) still cannot make
        # one problem bury the others, or carry a file's content.
        self.items.append(f"{where}: {excerpt(message, MAX_MESSAGE)}")

    def raise_if_any(self) -> None:
        """Raise one ``SpecError`` with every problem recorded so far, if any.

        ``SpecError`` is terminal for the reconciler (retrying the same input
        cannot help).  A parser calls it at the end, and earlier only where
        going on would report nonsense, e.g. when the document is not a mapping.
        """
        if len(self.items) > MAX_PROBLEMS:
            # Every problem is recorded (parsers compare ``len(items)``), only
            # the report is cut.
            more = f"{self.source}: and {len(self.items) - MAX_PROBLEMS} more problems"
            raise SpecError([*self.items[:MAX_PROBLEMS], more])
        if self.items:
            raise SpecError(self.items)


def sub(path: str, key: str | int) -> str:
    """Extend a field path: ``sub("devices", 3)`` → ``devices[3]``, ``sub("a", "b")`` → ``a.b``.

    A key is the user's text too (an unknown key may be a pasted blob), so
    a long one is cut like any quoted value.
    """
    if isinstance(key, int):
        return f"{path}[{key}]"
    key = excerpt(key, 60)
    return f"{path}.{key}" if path else key


def found(value: Any) -> str:
    """How a wrong value is quoted in a message: short, and typed enough to see the mistake."""
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    # A long value (a pasted file, a base64 blob) would bury the rest of the
    # message: 60 characters show the mistake, not the payload.
    return excerpt(repr(value), 60)


def normalize_numbers(value: Any) -> Any:
    """Integral floats become ints, recursively.

    Helm reads values as float64 and ``toYaml`` writes large ones back in
    exponent form (``2.06158430208e+11``); a profile that went through a
    chart must still load, with its byte counts as integers.  The bound
    keeps the result within a signed 64-bit integer, the widest the engine
    config's C reader parses (``strtoll``); anything larger stays a float
    (and fails any integer check made on it).
    """
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {k: normalize_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize_numbers(v) for v in value]
    return value


def check_keys(p: Problems, path: str, mapping: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Record every key of ``mapping`` not in ``allowed``.

    The message lists the allowed keys sorted, so a typo (``nvlink.speed``)
    comes with the spelling the user meant right beside it.
    """
    allowed = tuple(allowed)
    for key in mapping:
        if key not in allowed:
            expected = ", ".join(sorted(allowed))
            p.add(sub(path, str(key)), f"unknown key, expected one of: {expected}")


def as_mapping(p: Problems, path: str, value: Any) -> dict[str, Any] | None:
    """A mapping, copied to a ``dict`` so a parser may add keys without touching its input."""
    if isinstance(value, Mapping):
        return dict(value)
    p.add(path, f"{found(value)} is not a mapping")
    return None


def as_list(p: Problems, path: str, value: Any) -> list[Any] | None:
    if isinstance(value, list):
        return value
    p.add(path, f"{found(value)} is not a list")
    return None


def as_int(
    p: Problems, path: str, value: Any, *, lo: int | None = None, hi: int | None = None
) -> int | None:
    """An integer within ``lo..hi`` (either bound optional).

    ``bool`` is refused although Python counts it as an ``int``: YAML reads
    ``yes``/``true`` as a bool, and ``minor_number: true`` is a mistake, not 1.
    Floats are refused too; ``normalize_numbers`` has already turned the
    integral ones (Helm's exponent form) into ints.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        p.add(path, f"{found(value)} is not an integer")
        return None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        p.add(path, f"{value} is out of range, expected {bounds}")
        return None
    return value


def as_float(
    p: Problems, path: str, value: Any, *, lo: float | None = None, hi: float | None = None
) -> float | None:
    """A number within ``lo..hi``, as a float; an integer is accepted (``probability: 1``).

    NaN (``.nan`` in YAML) is refused: it compares false with both bounds,
    so the range check alone would let it through.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or (
        isinstance(value, float) and math.isnan(value)
    ):
        p.add(path, f"{found(value)} is not a number")
        return None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        p.add(path, f"{value} is out of range, expected {lo}..{hi}")
        return None
    return float(value)


def as_bool(p: Problems, path: str, value: Any) -> bool | None:
    """A real YAML boolean; the strings ``"true"``/``"false"`` are refused, not guessed at."""
    if isinstance(value, bool):
        return value
    p.add(path, f"{found(value)} is not true or false")
    return None


def as_str(p: Problems, path: str, value: Any, *, nonempty: bool = True) -> str | None:
    """A string, by default with something besides whitespace in it.

    Numbers are not turned into strings: a field that expects text and got
    ``580.105`` (YAML read an unquoted version as a float) should say so.
    """
    if not isinstance(value, str):
        p.add(path, f"{found(value)} is not a string")
        return None
    if nonempty and not value.strip():
        p.add(path, "empty string, expected a value")
        return None
    return value


#: The widest integers NVML hands out (``unsigned int``, ``unsigned long long``):
#: a larger value in a profile or an overrides patch is no answer the library
#: can give, and used to read as N/A or as another number.
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1

#: The longest value the mock NVML library's engine config reader takes
#: (``MOCK_MAX_VALUE`` in ``native/nvml/mock.h``), and so the longest text a
#: device field may carry.
TEXT_VALUE_MAX_BYTES = 4096

#: Characters no one-line text value may hold: the C0 controls, DEL and the C1
#: controls (a C1 character also makes a file unreadable to a YAML reader).
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def as_text(
    p: Problems, path: str, value: Any, *, max_bytes: int, nonempty: bool = True
) -> str | None:
    """``as_str``, on one line without control characters, at most ``max_bytes`` of UTF-8
    (the buffer, file or attribute the value is written to, its terminating NUL left out)."""
    text = as_str(p, path, value, nonempty=nonempty)
    if text is None:
        return None
    if CONTROL_RE.search(text):
        p.add(path, f"{found(text)} holds a control character (a line break, tab, escape...), "
                    "expected text on one line")
        return None
    size = len(text.encode())
    if size > max_bytes:
        p.add(path, f"is {size} bytes long, expected at most {max_bytes}")
        return None
    return text


def check_text_leaves(
    p: Problems, path: str, value: Any, *, max_bytes: int, checked: frozenset[str] = frozenset()
) -> None:
    """Every string in a nested block (mapping and list items, keys aside) is one line of
    at most ``max_bytes``, and every other leaf a finite number, a boolean or null:
    refused where it is read, not where a file made of it is written (the engine
    config has no spelling for a ``!!binary`` value's bytes, a YAML date, ``.inf``).
    ``checked``: the paths whose own check (a pattern) already refuses more."""
    if path in checked:
        return
    if isinstance(value, str):
        # an empty pass-through string is the profile's business, as before
        as_text(p, path, value, max_bytes=max_bytes, nonempty=False)
    elif isinstance(value, float) and not math.isfinite(value):
        p.add(path, f"{found(value)}, expected a finite number")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            name = key if isinstance(key, str) else str(key)
            check_text_leaves(p, sub(path, name), item, max_bytes=max_bytes, checked=checked)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_text_leaves(p, sub(path, index), item, max_bytes=max_bytes, checked=checked)
    elif not is_plain(value):
        p.add(path, f"{found(value)} (a {type(value).__name__} value), expected a string, "
                    "number or boolean")


def is_plain(value: Any) -> bool:
    """A value JSON could hold too: what YAML gives but ``!!binary`` bytes, dates, sets."""
    return value is None or isinstance(value, str | int | float | Mapping | list)


def as_choice(p: Problems, path: str, value: Any, choices: Iterable[str]) -> str | None:
    """One of ``choices`` (lower-case), matched without regard to case, returned lower-case.

    Profiles and ``nvidia-smi`` output mix cases (``Completed``, ``P0``);
    the compiled state and the engine config only ever carry lower case.
    """
    choices = tuple(choices)
    if isinstance(value, str) and value.lower() in choices:
        return value.lower()
    p.add(path, f"{found(value)} is not one of: {', '.join(choices)}")
    return None


def as_match(p: Problems, path: str, value: Any, regex: re.Pattern[str], what: str) -> str | None:
    """A string matching ``regex`` whole; ``what`` names the expected shape in the message.

    ``fullmatch``, not ``match``: a pattern's ``$`` also matches before a
    final newline, so ``"580.105.08\n"`` (a YAML block scalar) would pass
    and carry its newline into files that are one value per line.
    """
    if isinstance(value, str) and regex.fullmatch(value):
        return value
    p.add(path, f"{found(value)} is not {what}")
    return None


def as_bdf(p: Problems, path: str, value: Any) -> str | None:
    """A PCI address, returned canonical: 4-digit domain, lower case (sysfs spelling)."""
    text = as_match(p, path, value, BDF_RE, "a PCI address DDDD:BB:DD.F")
    if text is None:
        return None
    try:
        return canonical_bdf(text)
    except ValueError as exc:
        p.add(path, f"{exc}, expected a PCI address DDDD:BB:DD.F")
        return None


def canonical_bdf(text: str) -> str:
    """``00000000:1A:00.0`` or ``0000:1A:00.0`` → ``0000:1a:00.0``; raises ValueError otherwise."""
    match = BDF_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a PCI address DDDD:BB:DD.F")
    domain, bus, dev, fn = match.groups()
    # NVML's 8-digit spelling admits domains above ffff; the canonical form
    # (and root ids ``pciDDDD:BB``) has four digits, so refuse rather than
    # write an address nothing downstream expects.
    if int(domain, 16) > 0xFFFF:
        raise ValueError(f"{text!r}: PCI domain above ffff")
    # Five bits of device number: lspci and the kernel never show more.
    if int(dev, 16) > 0x1F:
        raise ValueError(f"{text!r}: PCI device number above 1f")
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def require(p: Problems, path: str, mapping: Mapping[str, Any], key: str, what: str) -> Any:
    """``mapping[key]``, recording ``missing, expected <what>`` when absent or null."""
    value = mapping.get(key)
    if value is None:
        p.add(sub(path, key), f"missing, expected {what}")
    return value


def deep_merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``patch`` over ``base``: mappings merge key by key, anything else replaces.

    Lists replace rather than concatenate: a device that lists its own
    ``supported_clocks`` means exactly those.  Inputs are not modified.
    """
    merged: dict[str, Any] = {k: _copy(v) for k, v in base.items()}
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = _copy(value)
    return merged


#: The scalar types YAML produces, told apart by ``type`` alone: an ABC
#: ``isinstance`` costs a cache lookup, and a profile's per-device merge
#: copies tens of thousands of scalars.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _copy(value: Any) -> Any:
    """A deep copy of the containers YAML produces (scalars are immutable and shared)."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
