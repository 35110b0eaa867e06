"""A node root that ``mokka daemon --once`` made: marked, so the last one out removes it.

A local run removes the ``./mokka-node`` it made when it stops.  ``--once``
leaves its files for ``mokka cleanup``, a separate process that cannot
tell a root ``--once`` made from one the user made (and may want kept):
so ``--once`` marks a root it made with ``.mokka-made-root`` at its top,
before anything is staged (a kill mid-pass leaves the mark too), and
whoever leaves that root holding nothing but the mark, ``--once`` without a
state to reconcile or ``cleanup`` after discarding everything, removes the
mark and the root.  A root with anything else in it stays as it is.

Apart from the daemon's modules because ``cleanup`` uses it too, and it is
plain ``os``: no ``Host``, since the mark sits outside every manifest
(like the state directory's ``.mokka-created-parents.json``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: The mark's name at the top of the root.
MARK = ".mokka-made-root"


def mark_made(root: Path) -> None:
    """Mark ``root``, just made, as Mokka's to remove once it is empty again."""
    fd = os.open(root / MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    os.close(fd)


def remove_if_emptied(root: Path) -> bool:
    """Remove ``root`` if it is marked and holds nothing else; whether it went."""
    try:
        if sorted(os.listdir(root)) != [MARK]:
            return False
        os.unlink(root / MARK)
    except OSError:
        return False
    with contextlib.suppress(OSError):  # something appeared meanwhile: it stays
        os.rmdir(root)
        return True
    return False
