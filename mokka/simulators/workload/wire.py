"""The Protocol Buffers reader the pod-resources client decodes with.

The reader itself (bounds, budgets, schemas) lives in
``mokka.simulators.protowire``, shared with the NRI plugin's wire; this
module keeps the names ``podresources`` and its tests use.
"""

from __future__ import annotations

from mokka.simulators.protowire import (
    CHECK_EVERY,
    EGROUP,
    I32,
    I64,
    LEN,
    SGROUP,
    VARINT,
    Budget,
    Field,
    Fields,
    Schema,
    WireError,
    decode,
    iter_fields,
    messages,
    string,
    strings,
)

__all__ = [
    "CHECK_EVERY", "EGROUP", "I32", "I64", "LEN", "SGROUP", "VARINT", "Budget", "Field",
    "Fields", "Schema", "WireError", "decode", "iter_fields", "messages", "string", "strings",
]
