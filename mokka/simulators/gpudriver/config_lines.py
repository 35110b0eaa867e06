"""The engine config's lines: one ``dotted.key: value`` each, as the C reader parses them.

``flatten`` turns a GPU's nested profile fields into dotted keys (lists get a
``.count``), and ``format_line`` writes one key and value in the format's
spelling (``docs/engine-config.md``), refusing with ``SpecError``, naming the
key, whatever the reader would refuse.  Kept apart from
``mokka.simulators.gpudriver.engine_config``, which decides *which* lines a
node's config holds; the workload file, read by the same parser, is written
with ``format_line`` too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from mokka.errors import SpecError
from mokka.state.engine_values import (
    KEY_SEGMENT,
    key_problem,
    number_problem,
    text_problem,
    value_problem,
)

# Under the engine config's name: its warnings are about that file.
logger = logging.getLogger("mokka.simulators.gpudriver.engine_config")

#: One key segment of a flattened profile field: a field with any other
#: segment is left out with a warning instead of corrupting the file.  This
#: and the reader's other limits (key and value lengths, what a value may
#: hold) are ``mokka.state.engine_values``': the overrides schema refuses by
#: them too, so ``mokka ctl`` never writes a change this writer would refuse.
_SEGMENT = KEY_SEGMENT

#: Segments already found to match ``_SEGMENT``: a node's GPUs share their
#: field names, so each name is matched once rather than once per GPU.
#: Bounded, as a hostile profile could name fields without end.
_GOOD_SEGMENTS: set[str] = set()
_GOOD_SEGMENTS_LIMIT = 4096

#: The leaf types of a profile document (YAML scalars), flattened as they are.
_SCALARS = (str, int, float, bool)


def flatten(value: Any, *, where: str) -> list[tuple[str, Any]]:
    """Nested dicts/lists → ``(dotted key, scalar)``; lists get ``.count`` and ``.<i>``.

    ``.count`` lets the C side walk a list without scanning for keys.  A
    ``None`` is left out, so the library falls back to its own default as
    if the profile had no such field.  ``where`` names the GPU in warnings.
    """
    flat: list[tuple[str, Any]] = []
    _flatten_into(flat, value, where, "")
    return flat


def _flatten_into(flat: list[tuple[str, Any]], value: Any, where: str, prefix: str) -> None:
    # Appends rather than nested generators: a GPU has hundreds of leaves,
    # and every ``yield from`` level would pass each of them up once more.
    # The exact-type tests come first: ``isinstance`` against the ``Mapping``
    # ABC costs several times more, and a GPU's fields are plain dicts and
    # scalars (the render of eight GPUs is a tenth of a cold pass).
    if type(value) is dict or isinstance(value, Mapping):
        for key, item in value.items():
            segment = key if type(key) is str else str(key)
            if segment not in _GOOD_SEGMENTS:
                if not _SEGMENT.fullmatch(segment):
                    logger.warning(
                        "engine config: %s: field %r left out: key segment %r is not "
                        "[A-Za-z0-9_-]+",
                        where,
                        prefix + segment,
                        segment,
                    )
                    continue
                if len(_GOOD_SEGMENTS) < _GOOD_SEGMENTS_LIMIT:
                    _GOOD_SEGMENTS.add(segment)
            if type(item) in _SCALARS:
                flat.append((prefix + segment, item))
            else:
                _flatten_into(flat, item, where, f"{prefix}{segment}.")
    elif isinstance(value, list | tuple):
        flat.append((f"{prefix}count", len(value)))
        for i, item in enumerate(value):
            _flatten_into(flat, item, where, f"{prefix}{i}.")
    elif value is not None:
        flat.append((prefix[:-1] if prefix.endswith(".") else prefix, value))


def format_line(key: str, value: Any) -> str:
    """One ``key: value`` line; ``SpecError`` if the key is longer than the reader allows."""
    problem = key_problem(key)
    if problem is not None:
        raise SpecError(f"engine config: {key[:60]}...: {problem}")
    return f"{key}: {_format_value(key, value)}"


def _format_value(key: str, value: Any) -> str:
    """A value in the format's spelling, readable by both the C reader and PyYAML.

    Strings are always double-quoted, so ``"1.0"`` or ``"on"`` stay strings
    to a YAML reader; the only escapes are ``\\"`` and ``\\\\``, the two the C
    reader undoes.  ``bool`` is tested before ``int`` (it is one to Python).
    """
    kind = type(value)  # the exact types first: most values are plain str and int
    if kind is str:
        return _quoted(key, value)
    if kind is int:
        return _number(key, value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return _number(key, value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _refused(key, value_problem(value))
        # repr: the shortest text that reads back as the same double (strtod)
        text = repr(value)
        # PyYAML (YAML 1.1) reads ``1e-05`` as a string: keep a dot in the mantissa.
        if "e" in text and "." not in text.split("e")[0]:
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        # PyYAML's float pattern also wants a signed exponent; ``repr`` always
        # writes the sign, so this is a guard rather than a case seen in practice
        if "e" in text and text.split("e")[1][0] not in "+-":
            mantissa, exponent = text.split("e")
            text = f"{mantissa}e+{exponent}"
        return text
    if isinstance(value, str):
        return _quoted(key, value)
    raise _refused(key, value_problem(value))


def _refused(key: str, problem: str | None) -> SpecError:
    """The refusal of a line the reader would refuse: ``engine_values``' words, naming ``key``."""
    return SpecError(f"engine config: {key}: {problem}")


def _number(key: str, value: int) -> str:
    """An integer's digits; refused, naming ``key``, when the reader would refuse the line."""
    problem = number_problem(value)
    if problem is not None:
        raise _refused(key, problem)
    return str(value)


def _quoted(key: str, value: str) -> str:
    """A string value double-quoted, refused (naming ``key``) if the reader cannot take it."""
    problem = text_problem(value)
    if problem is not None:
        raise _refused(key, problem)
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
