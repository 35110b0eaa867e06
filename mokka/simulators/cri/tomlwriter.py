"""A TOML writer for the subset containerd configs use (the stdlib only reads TOML).

Tables nest as ``[a."b.c".d]`` headers, in the order the mapping holds them;
values are strings, booleans, integers, floats, dates and arrays of those
(arrays of mappings become inline tables).  ``tomllib.loads(dumps(doc)) ==
doc`` for every document of that shape; anything else raises ``TypeError``
rather than writing something containerd would read differently.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def dumps(doc: Mapping[str, Any]) -> str:
    """The document as TOML text, ending with a newline."""
    lines: list[str] = []
    _table(lines, [], doc)
    return "\n".join(lines).lstrip("\n") + "\n"


def _table(lines: list[str], path: list[str], table: Mapping[str, Any]) -> None:
    """Append ``table`` at ``path``: its own keys under its header, then each sub-table.

    Keys must come before sub-table headers, or TOML would file them under
    the last sub-table.
    """
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)]
    tables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    # A header is needed for the table's own keys, and for an empty table
    # (which would otherwise vanish); a table holding only sub-tables is
    # implied by their headers.
    if path and (scalars or not tables):
        lines.append("")
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
    for key, value in scalars:
        lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in tables:
        _table(lines, [*path, key], value)


#: What a TOML basic string cannot hold literally: ``"``, ``\\``, the C0
#: controls and DEL.
_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n",
          "\f": "\\f", "\r": "\\r"}


def _string(text: str) -> str:
    """A TOML basic string.

    Not ``json.dumps``: it leaves DEL raw and writes characters beyond the
    BMP as surrogate pairs, both of which TOML refuses, so a value read from
    the node's own config could come back unreadable.  Everything else is
    written as itself (TOML files are UTF-8).
    """
    return '"' + _ESCAPE.sub(
        lambda m: _SHORT.get(m.group(), f"\\u{ord(m.group()):04x}"), text
    ) + '"'


def _key(key: str) -> str:
    """A bare key where TOML allows one, else a quoted one (``"io.containerd.grpc.v1.cri"``)."""
    return key if _BARE_KEY.match(key) else _string(key)


def _value(value: Any) -> str:
    """One value in TOML's spelling; ``TypeError`` for anything TOML cannot say (``None``)."""
    # bool before int: True is an int in Python.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as TOML")
