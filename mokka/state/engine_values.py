"""What one line of the engine config can hold: the limits of the mock library's reader.

The engine config (``docs/engine-config.md``) is one ``dotted.key: value``
a line, and the C library refuses the whole file over one line it cannot
take (a key or a value longer than its buffers, a line break inside a
string), which leaves every NVML client on the node without it.  Two
places refuse such a line before it exists, in the same words:

* the writer (``mokka.simulators.gpudriver.config_lines``), which fails
  the Stage wave naming the line's key;
* the overrides schema (``mokka.state.override_schema``), for the open
  subtrees it otherwise passes through (``fan``, ``processes``): the
  daemon reports such a file as a bad input, and ``mokka ctl`` refuses to
  write it (exit 2), instead of a file that leaves the node unready.

Here, in the state layer, because both need it: the writer is a
simulator, and neither the schema nor ``mokka ctl`` may load one.
"""

from __future__ import annotations

import math
import re
from typing import Any

from mokka.state.checks import CONTROL_RE, TEXT_VALUE_MAX_BYTES, found

#: Length limits the C parser enforces (it rejects longer keys and values)
#: (``MOCK_MAX_KEY`` and ``MOCK_MAX_VALUE`` in ``native/nvml/mock.h``; the
#: value limit is in bytes of UTF-8).
MAX_KEY_LENGTH = 200
MAX_VALUE_LENGTH = TEXT_VALUE_MAX_BYTES

#: One key segment of a flattened field (matched whole: ``$`` alone would
#: let a trailing newline through and split the line).  Anything else
#: (spaces, colons, quotes, line breaks) cannot appear in a plain YAML key.
KEY_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")

#: The longest prefix a GPU's keys get in the file: ``device.<position>.``,
#: the position below the library's 64 devices (``MOCK_MAX_DEVICES``).  An
#: overrides field is checked with it, as it may apply to any GPU.
LONGEST_DEVICE_PREFIX = "device.63."

#: Bits of the widest integer whose digits are counted: at most 4275
#: digits, under Python's limit on converting an int to text (4300), and
#: over ``MAX_VALUE_LENGTH``'s, so every wider one is too long anyway.
_COUNTABLE_BITS = 14_200


def key_problem(key: str) -> str | None:
    """Why the reader would refuse ``key`` as a line's key; ``None`` if it takes it."""
    if len(key) > MAX_KEY_LENGTH:
        return f"key is {len(key)} characters, expected at most {MAX_KEY_LENGTH}"
    return None


def value_problem(value: Any) -> str | None:
    """Why no line can carry ``value`` (a scalar of a profile or overrides field); else ``None``.

    ``bool`` is tested before ``int`` (it is one to Python); a type the
    format has no spelling for (a YAML date, ``!!binary`` bytes) is refused.
    """
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return number_problem(value)
    if isinstance(value, float):
        return None if math.isfinite(value) else f"got {value!r}, expected a finite number"
    return f"got a {type(value).__name__}, expected a string, number or boolean"


def text_problem(value: str) -> str | None:
    """Why a string cannot be a value: a line break or control, not UTF-8, too long."""
    # one line per key: no C0 or C1 control or DEL (a YAML reader refuses the
    # whole file over a C1 one), and none has any business in an NVML string
    if CONTROL_RE.search(value):
        return f"got {found(value)}, expected a string without newlines or control characters"
    try:
        size = len(value.encode())
    except UnicodeEncodeError:  # a lone surrogate: bytes of a command line that were not UTF-8
        return f"got {found(value)}, expected UTF-8 text"
    if size > MAX_VALUE_LENGTH:
        return f"value is {size} bytes, expected at most {MAX_VALUE_LENGTH}"
    return None


def number_problem(value: int) -> str | None:
    """Why an integer cannot be a value: more digits than the reader's buffer holds."""
    if value.bit_length() > _COUNTABLE_BITS:
        return (f"a number of more than {MAX_VALUE_LENGTH} digits, "
                f"expected at most {MAX_VALUE_LENGTH}")
    size = len(str(value))
    if size > MAX_VALUE_LENGTH:
        return f"a number of {size} digits, expected at most {MAX_VALUE_LENGTH}"
    return None
