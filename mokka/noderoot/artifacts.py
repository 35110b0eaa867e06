"""What a simulator asks the node root for: declarative artifacts.

A simulator describes the files, links, device nodes and directories it
wants and hands the whole set to ``Host.converge``; it never touches the
filesystem itself.  ``ConvergeReport`` is what comes back.
"""

from __future__ import annotations

from pathlib import Path

import attrs


@attrs.frozen
class File:
    """A regular file with exact content and mode."""

    path: str
    content: bytes = attrs.field(converter=lambda c: c.encode() if isinstance(c, str) else c)
    mode: int = 0o644


@attrs.frozen
class CopyOf:
    """A regular file copied from a path outside the root (a built library, a binary).

    Compared by content digest, so an unchanged source is not copied again.
    """

    path: str
    source: Path = attrs.field(converter=Path)
    mode: int = 0o755


@attrs.frozen
class Symlink:
    """A symbolic link; ``target`` is written verbatim (use relative targets)."""

    path: str
    target: str


@attrs.frozen
class CharDevice:
    """A character device node.

    Without CAP_MKNOD (a laptop run as a normal user, a restricted pod) a
    regular placeholder file is written instead and the convergence reports it
    as degraded, so readiness can say why consumers will not open it.
    """

    path: str
    major: int
    minor: int
    mode: int = 0o666


@attrs.frozen
class Directory:
    """A directory that must exist (parents are created implicitly anyway)."""

    path: str
    mode: int = 0o755


Artifact = File | CopyOf | Symlink | CharDevice | Directory


@attrs.frozen
class ConvergeReport:
    """What one ``converge`` call changed, for logs and readiness."""

    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    #: Reasons the result is not what consumers expect (e.g. placeholder devices).
    degraded: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.removed)
