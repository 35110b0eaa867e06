"""Host commands (systemctl, nvidia-ctk, mount): the runner ``Host.run`` goes through.

Apart from ``mokka.noderoot.host`` because it is a seam of its own: the daemon runs
real commands (``SubprocessRunner``), tests inject a runner that records
them (``CommandRunner``).  ``mokka.noderoot.host`` re-exports both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from mokka.errors import CommandError

if TYPE_CHECKING:
    import subprocess


class CommandRunner(Protocol):
    """Runs a host command (systemctl, nvidia-ctk); injectable so tests record calls."""

    def run(
        self, argv: Sequence[str], *, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]: ...


@attrs.frozen
class SubprocessRunner:
    """The real runner: a subprocess with captured text output."""

    def run(
        self, argv: Sequence[str], *, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv``; a non-zero exit is returned (callers decide), a failure to run raises.

        ``CommandError`` only when the command could not run at all (missing
        binary, timeout): the caller's readiness reason then says which.
        """
        # imported here: a ``Host`` that runs no command (``mokka ctl``) need not load it
        import subprocess

        try:
            return subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CommandError(f"{argv[0]}: {exc}") from exc
