"""A module's logger that imports ``logging`` only when something is logged.

``mokka ctl`` runs the host's code for one small write per call and logs
nothing on the way, yet ``logging`` (with ``threading``, ``traceback`` and
``string``) was about a tenth of such a call's imports.  The host-level
modules a call reaches (``Host``, ``Manifest``, the overrides file) take
their logger from here; the daemon has imported ``logging`` long before,
so for it this is ``logging.getLogger(name)`` fetched on first use.
"""

from __future__ import annotations

from typing import Any


class LazyLogger:
    """Stands in for ``logging.getLogger(name)``; every attribute is the real logger's."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        # only reached for the logger's own attributes (``warning``, ``level``):
        # the slots above are found without it
        if self._logger is None:
            import logging

            self._logger = logging.getLogger(self._name)
        return getattr(self._logger, attr)
