"""State sources and the factory the daemon uses to pick one.

``make_source(settings, host)`` takes the daemon's ``Settings`` and anything
with a ``root`` and a ``resolve(node_path) -> Path`` method (the daemon
passes its ``Host``).  The host is typed structurally on purpose: the state
layer sits below ``mokka.noderoot.host`` and must not import it; all the factory
needs is where the node path of the overrides file lands under the root,
and the root itself, beneath which no link on the way to it is followed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from mokka.layout import OVERRIDES
from mokka.state.sources.base import SourceUpdate, StateSource
from mokka.state.sources.controlplane import ControlPlaneSource
from mokka.state.sources.file import FileSource

__all__ = ["ControlPlaneSource", "FileSource", "SourceUpdate", "StateSource", "make_source"]


class PathResolver(Protocol):
    root: Path

    def resolve(self, path: str) -> Path: ...


def make_source(settings: Any, host: PathResolver) -> StateSource:
    """The source ``settings.source`` names, configured from the settings.

    ``settings.overrides`` of ``None`` means the node's own overrides file
    (``mokka.layout.OVERRIDES`` under the root), where ``mokka ctl`` writes.
    """
    if settings.source == "control-plane":
        return ControlPlaneSource()
    overrides = settings.overrides if settings.overrides is not None else host.resolve(OVERRIDES)
    return FileSource(
        profile=settings.profile,
        node_name=settings.node_name,
        topology=settings.topology,
        overrides=Path(overrides),
        # the root's own file (not one an operator named): no link is followed
        overrides_root=host.root if settings.overrides is None else None,
        feature_gates=dict(settings.feature_gates),
        resync_interval=settings.resync_interval,
        debounce=settings.reload_debounce,
    )
