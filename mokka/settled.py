"""What an owner's last converge left, and how to tell that nothing has changed since.

The fast path of a pass that changes nothing: ``Host`` keeps one ``Settled``
record per owner and asks it whether the node still holds what it recorded,
before any converge work is set up.  It is a value of its own (not part of
``mokka.convergence``, which builds it) because the host keeps it between
calls while a ``Convergence`` lives for one call only.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import attrs

from mokka.artifacts import Artifact

#: An entry's ``signature``; ``None``: nothing there.
Signature = tuple[int, ...] | None


@attrs.frozen(eq=False)
class Settled:
    """An owner's converged part of the node, as ``lstat`` saw it right after the converge.

    What makes a pass that changes nothing cost one ``lstat`` per path.
    Asked for the same artifacts again, ``Host.converge`` compares the
    signature of every path placed, every directory above them, every
    copied source (``stat``) and the owner's manifest files with what they
    were (``holds``); when every one is unchanged, the node still is what
    the last converge made it, and there is nothing to resolve, read,
    compare or write.  Inode and change time are in the signature: any
    write, chmod, chown, rename over or delete changes the change time,
    which no one can set back, so an unchanged signature is an unchanged
    entry.  A directory's signature also changes when an entry in it is
    added or removed (another owner placed a file beside ours, a link was
    swapped in): the next converge is then a full one, which records anew,
    but still skips each path found as it was (``Convergence._still_placed``).
    """

    wanted: list[Artifact]
    #: node path -> (artifact, real path, signature after the converge)
    files: dict[str, tuple[Artifact, str, Signature]]
    #: real directory -> signature
    dirs: dict[str, Signature]
    sources: dict[str, Signature]
    bookkeeping: dict[str, Signature]
    degraded: tuple[str, ...]

    def holds(self, wanted: list[Artifact]) -> bool:
        """Whether ``wanted`` is what was converged and nothing it made has changed since."""
        return (
            wanted == self.wanted
            and all(signature(p, os.lstat) == sig for p, sig in self.bookkeeping.items())
            and all(signature(p, os.lstat) == sig for p, sig in self.dirs.items())
            and all(signature(real, os.lstat) == sig for _a, real, sig in self.files.values())
            and all(signature(p, os.stat) == sig for p, sig in self.sources.items())
        )


def signature(path: str, stat_fn: Callable[[str], os.stat_result]) -> Signature:
    """What identifies an entry's current version: device, inode, type and mode, size,
    owner, times (the change time above all, see ``Settled``)."""
    try:
        st = stat_fn(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
            st.st_uid, st.st_gid)
