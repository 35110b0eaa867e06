"""``ControlPlaneSource`` (MEP-0001): desired state pushed by a control plane.

Planned, not built: a cluster-level controller would push each node's
state (profile, clique, overrides) instead of the node reading mounted
files.  Until then, selecting it (``--source control-plane``) fails at once
with a message that says so, rather than running a node that silently
never receives a state.
"""

from __future__ import annotations

import trio
import trio_util

from mokka.errors import SpecError
from mokka.state.sources.base import SourceUpdate

MESSAGE = (
    "--source control-plane: the control-plane state source (MEP-0001) is not implemented; "
    "the file source (--source file, the default) is the one in use"
)


class ControlPlaneSource:
    """A stub that refuses to run; see the module docstring."""

    async def run(
        self,
        out: trio_util.AsyncValue[SourceUpdate | None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        raise SpecError(MESSAGE)
