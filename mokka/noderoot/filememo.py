"""What was made of a bookkeeping file's content, kept while the file is unchanged.

Every converge reads its owner's manifest snapshot, and asks other owners'
journals and snapshots whether they made a directory it found
(``mokka.noderoot.shared_dirs``).  Between two converges those files rarely change,
yet reading and checking one is a JSON parse and a check of every record:
for an owner of a thousand paths, more than the rest of a converge that
changes nothing.  ``FileMemo`` keeps the parsed value of each file under
its ``lstat`` signature: device, inode, size, modification and change
times, mode and owner.  An append, a rewrite, a rename over, a chmod or a
chown each changes the signature, and a file with a new signature is read
again through ``read_private`` with its trust checks.  (The same-size
rewrite within one timestamp tick that ``Settled`` describes is the one
change a signature can miss; the bookkeeping directory is Mokka's own,
0700, and every write Mokka makes there, the daemon's or ``mokka ctl``'s
for the overrides file's owners, is an append or a rename over.)
"""

from __future__ import annotations

import os
from typing import Final

#: An entry's identity and version as ``lstat`` sees it.
FileSignature = tuple[int, ...]

#: ``get``'s answer when nothing is kept for that signature.
MISSING: Final = object()


def file_signature(path: str) -> FileSignature | None:
    """``path``'s signature now; ``None`` when there is no such file (other errors raise)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
            st.st_mode, st.st_uid, st.st_gid)


class FileMemo:
    """Parsed values of files, each kept under the signature the file had when it was read.

    The signature is taken *before* the read: a change made during the
    read gives the file a newer signature, so the next ``get`` misses and
    reads it again.  Values are shared, not copied: callers that change
    what they get keep a copy instead.
    """

    def __init__(self) -> None:
        self._kept: dict[str, tuple[FileSignature, object]] = {}

    def get(self, path: str, signature: FileSignature | None) -> object:
        """The value kept for ``path`` at ``signature``; ``MISSING`` for anything else."""
        kept = self._kept.get(path)
        if kept is None or signature is None or kept[0] != signature:
            return MISSING
        return kept[1]

    def keep(self, path: str, signature: FileSignature | None, value: object) -> None:
        """Remember ``value`` as what ``path`` held at ``signature`` (``None``: forget it)."""
        if signature is None:
            self._kept.pop(path, None)
        else:
            self._kept[path] = (signature, value)
