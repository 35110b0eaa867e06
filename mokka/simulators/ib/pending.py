"""A local tool's request waiting for its answer, and how long it may wait.

Each request a tool sends becomes a ``Pending`` entry on the origin daemon,
with one task that waits at most the request's own timeout
(``wait_seconds``: ``timeout_ms`` times (retries + 1), capped as the kernel
caps it) and then hands the request back with status ``ETIMEDOUT``, as the
kernel does; an answer before that cancels it.  How many may wait is
bounded (``MAX_PENDING_PER_CONNECTION``, ``MAX_PENDING``): past either, a
request comes back at once with ``ENOMEM``.
"""

from __future__ import annotations

import attrs
import trio

from mokka.simulators.ib import mad
from mokka.simulators.ib.umadsocket import Connection

#: ``timeout_ms`` 0 means the kernel's default of one second.
DEFAULT_TIMEOUT_MS = 1000
#: The kernel's bounds on how long a request waits: one wait for an answer
#: (``IB_MAD_MAX_TIMEOUT_MS``, a minute) and the request with all its retries
#: (``IB_MAD_MAX_DEADLINE``, five minutes).  A tool asking for 2**32-1 ms
#: would otherwise hold its entry for 49 days.
MAX_TIMEOUT_MS = 60_000
MAX_DEADLINE_MS = 300_000
#: Requests of one connection waiting for their answers (libibmad waits for
#: each answer; ``ibnetdiscover`` keeps a few outstanding), and of all
#: connections together; past either, a request comes back at once with
#: ``ENOMEM``, as a write to a kernel out of memory fails.
MAX_PENDING_PER_CONNECTION = 256
MAX_PENDING = 4096


def over_limit(of_connection: int, in_all: int) -> bool:
    """Whether a request must be refused, with ``of_connection`` requests of
    its tool and ``in_all`` of every tool waiting already."""
    return of_connection >= MAX_PENDING_PER_CONNECTION or in_all >= MAX_PENDING


@attrs.define(eq=False)
class Pending:
    """A request a local tool sent, waiting for its answer."""

    conn: Connection
    request: mad.Umad
    done: trio.Event = attrs.field(factory=trio.Event)
    #: the peer the relay carried it to: the one node whose answer (or
    #: hand-back, see ``MadService._forward``) is taken for it
    peer: int | None = None


def wait_seconds(umad: mad.Umad) -> float:
    """How long a request waits for its answer: ``timeout_ms`` (0: the default)
    times (retries + 1), each wait and the whole capped as the kernel caps them."""
    per_try = min(umad.timeout_ms or DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS)
    return min(per_try * (umad.retries + 1), MAX_DEADLINE_MS) / 1000
