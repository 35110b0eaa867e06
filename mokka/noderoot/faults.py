"""What a node root's expected faults mean for the operator, as one line.

A full disk, a read-only filesystem, a quota or a permission refused are
faults of the node, not bugs: ``Host`` turns each into one
``HostFaultError`` line naming the owner, the path, the error and what it
means (logged, and shown in ``/readyz``), instead of a traceback.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from mokka.errors import HostFaultError

#: Faults a node root can be expected to have, and what each means for the operator.
EXPECTED_FAULTS: dict[int, str] = {
    errno.ENOSPC: "the filesystem holding the node root is full",
    errno.EDQUOT: "the disk quota of the node root is used up",
    errno.EROFS: "the node root is on a read-only filesystem",
    errno.EACCES: "the daemon (uid {uid}) may not write there",
    errno.EPERM: "the daemon (uid {uid}) may not change that",
}


def node_path_of(root: Path, real: str | os.PathLike[str] | None) -> str:
    """A real path beneath ``root`` as the node path it is (others as they are)."""
    if real is None:
        return "?"
    path = Path(os.fsdecode(real))
    try:
        return "/" + path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def owner_line(owner: str, exc: BaseException) -> str:
    """``exc`` as one line naming ``owner`` once (a ``HostFaultError`` names it already)."""
    text = str(exc)
    return text if text.startswith(f"{owner}: ") else f"{owner}: {text}"


def as_fault(root: Path, owner: str, exc: OSError) -> HostFaultError | None:
    """``exc`` met converging ``owner`` as one line (which path, what, what it means);
    ``None`` when it is no expected fault (a bug: keep its traceback)."""
    gone = exc.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.isdir(root)
    if exc.errno not in EXPECTED_FAULTS and not gone:
        return None
    code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    if gone:
        meaning = f"the node root {root} is gone"
    else:
        meaning = EXPECTED_FAULTS[exc.errno].format(uid=os.geteuid())
    where = node_path_of(root, exc.filename)
    return HostFaultError(f"{owner}: {where}: {exc.strerror} ({code}): {meaning}")
