"""``mokka cleanup``'s work: discard every owner with bookkeeping under a node root.

Kept apart from ``mokka.host``, whose ``discard_all`` calls it: only the
cleanup command (and a daemon's teardown fallback) discards everything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mokka.artifacts import ConvergeReport
from mokka.errors import HostPathError, MokkaError
from mokka.faults import owner_line
from mokka.lazylogger import LazyLogger
from mokka.statedir import bookkeeping_owner

if TYPE_CHECKING:
    from mokka.host import Host

logger = LazyLogger("mokka.host")


def discard_every_owner(host: Host) -> ConvergeReport:
    """Discard every owner with a manifest.

    Every owner is tried even when one fails (the manual recovery must
    not stop at the first stuck path); the failures are raised together
    afterwards, as one ``HostPathError`` naming each owner and every
    bookkeeping file still left (a half-written snapshot included).
    """
    try:
        directory = host.state.manifest_dir()
    except HostPathError as exc:
        # A link on the way leads out of the root: no bookkeeping of ours
        # can be there (nothing was ever written through it).
        logger.warning("no Mokka bookkeeping under %s to discard: %s", host.root, exc)
        return ConvergeReport()
    removed: list[str] = []
    failures: list[str] = []
    failed: set[str] = set()
    for owner in host.state.owners_in(directory):
        try:
            removed.extend(host.discard(owner).removed)
        except (OSError, MokkaError) as exc:
            logger.warning("could not discard everything of %s: %s", owner, exc)
            failures.append(owner_line(owner, exc))
            failed.add(owner)
    # Finish what a process killed while removing the state directory
    # left: no owner is left to do it in its discard.
    host.state.cleanup_if_idle()
    # What a failed owner keeps is said above; anything else is news.
    left = [p for p in host.leftovers() if bookkeeping_owner(p) not in failed]
    if left:
        failures.append(f"left under the root: {', '.join(left)}")
    if failures:
        raise HostPathError("; ".join(failures))
    return ConvergeReport(removed=tuple(removed))
