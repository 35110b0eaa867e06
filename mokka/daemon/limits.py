"""The daemon's file descriptor limit: the soft limit raised to the hard one.

Every client of a socket the daemon serves holds one of its descriptors (a
tool on the umad socket, a peer on the relay, a probe on the health port),
and so does every file a pass reads or writes.  The soft limit a shell or a
container runtime hands down is often 1,024 while the hard limit is far
higher (systemd's 524,288; containerd's 1,048,576): at 1,024 a burst of
clients leaves no descriptor for the next pass, which then fails for
reasons that have nothing to do with the node.  Raising the soft limit up
to the hard one needs no privilege, and is what systemd asks of services
that expect many clients.  Each socket still caps its own connections, so
no one client can take all of them.
"""

from __future__ import annotations

import logging
import resource

logger = logging.getLogger(__name__)


def raise_fd_limit() -> int:
    """Raise ``RLIMIT_NOFILE``'s soft limit to its hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:
        # An infinite hard limit the kernel will not take as a soft one
        # (above ``fs.nr_open``): keep what was given; the sockets' caps
        # still hold.
        logger.debug("could not raise the open file limit from %d to %d: %s", soft, hard, exc)
        return soft
    return hard
