"""Log lines a peer can provoke, kept to a few: the first, then a count.

Whoever holds a socket of the daemon decides how often something goes
wrong on it: a tool that writes junk as fast as it can would otherwise get
one WARNING per frame (hundreds of kB of log a second, from one client).
A ``LogLimit`` logs the first occurrence as it is, then at most one line per
``interval`` seconds, which says how many were left out since the last
line; ``flush`` (when the connection or the service goes) says it for the
rest.  No timer: a count waits for the next occurrence or the flush, so an
idle daemon stays idle.  Time is trio's clock (``autojump_clock`` in tests).
"""

from __future__ import annotations

import logging

import attrs
import trio

#: Seconds between two lines of one limit.
INTERVAL = 10.0


@attrs.define(eq=False)
class LogLimit:
    """One kind of WARNING of one source (a connection, the listener)."""

    logger: logging.Logger
    interval: float = INTERVAL
    #: trio time of the last line logged (``None``: nothing logged yet)
    _last: float | None = attrs.field(default=None, init=False)
    #: occurrences left out since the last line, and the newest one's text
    _left_out: int = attrs.field(default=0, init=False)
    _newest: str = attrs.field(default="", init=False)

    @property
    def left_out(self) -> int:
        """Occurrences not logged yet."""
        return self._left_out

    def warning(self, message: str, *args: object) -> None:
        """Log ``message % args``, or count it when a line went out less than
        ``interval`` seconds ago."""
        now = trio.current_time()
        text = message % args if args else message
        if self._last is not None and now - self._last < self.interval:
            self._left_out += 1
            self._newest = text
            return
        self._last = now
        self._line(text, self._left_out)
        self._left_out = 0

    def flush(self) -> None:
        """Say how many were left out, if any (the source is going away)."""
        if self._left_out:
            self._line(self._newest, self._left_out - 1)
            self._left_out = 0

    def _line(self, text: str, others: int) -> None:
        if others:
            self.logger.warning("%s (and %d more like it since the last such line)", text, others)
        else:
            self.logger.warning("%s", text)
