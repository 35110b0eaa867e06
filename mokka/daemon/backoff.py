"""Capped exponential backoff, as a value.

Both the reconcile loop (a failed pass) and the supervisor (a crashed daemon)
wait ``initial * factor ** (attempt - 1)`` seconds, at most ``cap``, before
trying again.  No jitter: one daemon per node retries against its own node
only, so there is no herd to spread, and exact delays keep the tests exact.
"""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class Backoff:
    """Delay schedule; ``delay(1)`` is the wait after the first failure."""

    #: Seconds before the first retry.  1 s: a transient error (a busy file, a
    #: restarting containerd) is usually gone by then.
    initial: float = 1.0
    #: Growth per consecutive failure.
    factor: float = 2.0
    #: Longest wait, in seconds.  60 s: a persistent failure is retried once a
    #: minute, often enough to recover promptly and rare enough to keep logs short.
    cap: float = 60.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait after the ``attempt``-th consecutive failure (1-based)."""
        if attempt < 1:
            return 0.0
        # Step by step, stopping at the cap: no float overflow however long the outage.
        value = self.initial
        for _ in range(attempt - 1):
            value *= self.factor
            if value >= self.cap:
                return self.cap
        return min(value, self.cap)
