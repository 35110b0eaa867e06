"""What a state source hands the daemon.

A source runs as a task in the daemon's nursery and publishes
``SourceUpdate`` values into a ``trio_util.AsyncValue`` the daemon owns.  The
reconciler only ever looks at the newest value (level-triggered): a burst of
updates coalesces into one pass over the last good state.  An update that
carries an ``error`` leaves the last good ``state`` in force (the source
passes it along unchanged) and makes the error visible in logs and metrics.
"""

from __future__ import annotations

from typing import Protocol

import attrs
import trio
import trio_util

from mokka.errors import SpecError
from mokka.state.model import State


@attrs.frozen
class SourceUpdate:
    #: the newest good state (``None`` until the first one compiles)
    state: State | None
    #: the newest input error, or ``None`` when the inputs compiled
    error: SpecError | None = None
    #: ``trio.current_time()`` when the update was made
    at: float = 0.0


class StateSource(Protocol):
    async def run(
        self,
        out: trio_util.AsyncValue[SourceUpdate | None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Publish updates into ``out`` until cancelled; ``started()`` after the first read."""
        ...
