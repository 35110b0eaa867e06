"""Logging setup: one line per record on stdout, as text or JSON.

Text lines read ``ts level logger msg key=value ...`` where the key/value
pairs are the record's ``extra=`` fields; JSON lines carry the same fields as
one object.  Text is for people: a traceback follows its line as the block
Python prints (one line of ``\n`` escapes is unreadable).  JSON is for
collectors: the traceback is the ``exc`` field of the one object, so a record
is never split into many.  Stdout, not stderr: container
runtimes collect both, and the kubelet's log rotation treats them alike, but
the pod's log then reads in order.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

#: Attributes every ``LogRecord`` has; anything else came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime", "taskName"}
)


def _timestamp(record: logging.LogRecord) -> str:
    """UTC, millisecond precision, ISO 8601 with a ``Z``: sortable and unambiguous."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's ``extra=`` fields, in the order they were given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _text_value(value: Any) -> str:
    """A value as one token: quoted (with escapes) if it holds spaces, quotes or newlines."""
    text = value if isinstance(value, str) else repr(value) if value is None else str(value)
    if text == "" or any(c in text for c in ' "=\n\r\t\\'):
        return json.dumps(text)
    return text


class TextFormatter(logging.Formatter):
    """``ts level logger msg key=value ...`` on one line, then a traceback's block if any."""

    def format(self, record: logging.LogRecord) -> str:
        """Newlines in the message are escaped, extras follow as ``key=value``; a
        traceback follows on its own lines, each indented so it reads as part of
        the record above it."""
        message = record.getMessage().replace("\n", "\\n")
        parts = [_timestamp(record), record.levelname, record.name, message]
        fields = extra_fields(record)
        parts.extend(f"{key}={_text_value(value)}" for key, value in fields.items())
        line = " ".join(parts)
        if record.exc_info:
            block = self.formatException(record.exc_info)
            line += "\n" + "\n".join(f"    {text}" for text in block.splitlines())
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg`` and the extras."""

    def format(self, record: logging.LogRecord) -> str:
        """One object; an extra never overwrites the four fixed keys, and
        values JSON cannot spell (paths, exceptions) become their ``str``."""
        doc: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, separators=(",", ":"))


def setup_logging(
    *, level: int | str = logging.INFO, fmt: str = "text", stream: TextIO | None = None
) -> logging.Handler:
    """Route every record to ``stream`` (stdout) in ``fmt``; replaces earlier handlers.

    Returns the handler so a caller (a test) can remove it again.
    """
    handler = logging.StreamHandler(sys.stdout if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
