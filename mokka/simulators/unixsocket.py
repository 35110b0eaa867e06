"""Unix sockets the daemon listens on inside a node root: binding and removal.

``sun_path`` holds 108 bytes and a node root can be deeper, so a socket is
bound through its directory's descriptor (``/proc/self/fd/<fd>/<name>``),
which stays open until ``unlisten``.  Each socket is recorded in a
manifest *before* it is bound (an empty file converged at its path, so
``mokka cleanup`` after a SIGKILL removes it): binding replaces that file.
The blocking calls here run in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path


def listen(path: Path, kind: socket.SocketKind, *, mode: int,
           backlog: int) -> tuple[socket.socket, int, str]:
    """Bind a ``kind`` socket at ``path`` with ``mode`` and listen (blocking).

    Returns the non-blocking listener, the directory's descriptor and the
    address bound, for ``unlisten``.
    """
    dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    address = f"/proc/self/fd/{dirfd}/{path.name}"
    listener = socket.socket(socket.AF_UNIX, kind)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)  # the empty file that recorded the socket
        listener.bind(address)
        os.chmod(address, mode)
        listener.listen(backlog)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        os.close(dirfd)
        raise
    return listener, dirfd, address


def unlisten(dirfd: int, address: str) -> None:
    """Remove the socket file and let go of its directory (blocking)."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)
    finally:
        os.close(dirfd)
