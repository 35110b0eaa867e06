"""Recording what one simulator call asks of the host, and telling whether it still holds.

The drift check of a replayed call: while ``record`` is open, ``Host``
notes here every node path the call looks at (``note_looked_at``), every
machine path outside the root it depends on (``note_outside``) and any
command it runs, each with the signature it had then, in the ``Activity``
of ``mokka.noderoot.settled``.  ``unchanged`` later says whether the node is still
exactly what that call found and left, so the reconcile waves skip a
repeated call over the same input (``mokka.daemon.waves.Replays``).

Kept apart from ``mokka.noderoot.host`` because it is a concern of its own (what
identifies a path's version, procfs and sysfs included) that the host only
reports to: the host maps paths and converges, this module watches.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping

from mokka.errors import HostPathError
from mokka.noderoot.paths import NodeRoot, ResolveCache
from mokka.noderoot.settled import (
    RECORDING,
    UNCOMPARABLE,
    Activity,
    Seen,
    Settled,
    content_signature,
    signature,
)

#: Top directories whose files change content with no change of signature
#: (procfs, sysfs): a looked-at file there is compared by content (``seen``).
_PSEUDO_FILESYSTEMS = frozenset({"proc", "sys"})


@contextlib.contextmanager
def record() -> Iterator[Activity]:
    """Record what the calls made in this context ask of the host (``Activity``)."""
    activity = Activity()
    token = RECORDING.set(activity)
    try:
        yield activity
    finally:
        RECORDING.reset(token)
        activity.closed = True


def current() -> Activity | None:
    """The ``Activity`` being recorded in this context, if any and still open."""
    activity = RECORDING.get()
    return None if activity is None or activity.closed else activity


def note_looked_at(
    paths: NodeRoot,
    path: str | os.PathLike[str],
    follow_last: bool,
    parts: list[str] | None = None,
) -> None:
    """Note a node path a recorded call looks at, with what it finds there now.

    ``parts``: the path as the caller has just resolved it
    (``NodeRoot.resolve_parts``), so the record is of the very entry the
    caller goes on to use, and the path is not resolved a second time.
    """
    activity = current()
    if activity is None:
        return
    path = os.fspath(path)
    found = seen(paths, path, follow_last, parts=parts)
    if found == UNCOMPARABLE:
        activity.opaque = f"looks at {path}"
    activity.looked_at[(path, follow_last)] = found


def note_outside(path: str | os.PathLike[str]) -> None:
    """Note a machine path outside the root a recorded call depends on (``Host.depends_on``)."""
    activity = current()
    if activity is not None:
        path = os.fspath(path)
        found = activity.outside[path] = outside_seen(path)
        if found == UNCOMPARABLE:
            activity.opaque = f"depends on {path}"


def absorb_own_writes(activity: Activity, paths: NodeRoot) -> None:
    """Record each path the call looked at and then placed itself as the call left it.

    A stage that looks for a file and, finding none, creates it (the kernel
    log's stand-in, a publication's link, an owner's own manifest) would
    otherwise find its own write on the next check and be made again, once,
    for nothing.  Taking such a path's signature at the end of the call is
    sound because a call over the same input is idempotent: made again on
    the node it left, it converges the same artifacts.  What anyone else
    does to the path afterwards is still seen: the owner's ``Settled``
    record holds it too, with the signature the converge left.
    """
    placed: set[str] = set()
    for left in activity.converged.values():
        if left is not None:
            placed.update(real for _artifact, real, _sig in left.files.values())
            placed.update(left.bookkeeping)
    if not placed:
        return
    cache: ResolveCache = {}  # the directories on the way, resolved once for both looks
    for (path, follow_last), found in activity.looked_at.items():
        try:
            real = str(paths.resolve(path, follow_last=follow_last, cache=cache))
        except HostPathError:
            continue
        if real in placed and found != UNCOMPARABLE:
            activity.looked_at[(path, follow_last)] = seen(paths, path, follow_last, cache)


def seen(
    paths: NodeRoot,
    path: str,
    follow_last: bool,
    cache: ResolveCache | None = None,
    *,
    parts: list[str] | None = None,
) -> Seen:
    """What identifies a looked-at node path's current version (``settled.signature``).

    Beneath ``/proc`` or ``/sys`` a file's content changes (a module
    registers a device major) with no change of signature: a file
    there is identified by its content too (``content_signature``).
    ``parts``: the path already resolved (``note_looked_at``).
    """
    if parts is None:
        try:
            parts = paths.resolve_parts(path, follow_last=follow_last, cache=cache)
        except HostPathError:
            return "outside the root"
    real = str(paths.real(parts))
    stat_fn = os.stat if follow_last else os.lstat
    if parts and parts[0] in _PSEUDO_FILESYSTEMS:
        return content_signature(real, stat_fn)
    return signature(real, stat_fn)


def outside_seen(path: str) -> Seen:
    """What identifies a machine path's current version (``Host.depends_on``): its
    ``stat`` signature; for a ``/proc`` or ``/sys`` file, its content too."""
    top = path.lstrip("/").split("/", 1)[0]
    if path.startswith("/") and top in _PSEUDO_FILESYSTEMS:
        return content_signature(path, os.stat)
    return signature(path, os.stat)


def unchanged(
    activity: Activity,
    *,
    paths: NodeRoot,
    settled: Mapping[str, Settled],
    has_bookkeeping: Callable[[str], bool],
    cache: ResolveCache | None = None,
    holds: Callable[[Settled], bool] = lambda left: left.holds(left.wanted),
) -> bool:
    """Whether the node is still exactly what ``activity`` found and left (``Host.unchanged``).

    ``settled`` is the host's record of each owner's last converge, and
    ``has_bookkeeping`` tells whether an owner has any under the root;
    ``holds`` whether a record still holds (``DriftWatch.holds`` spares the
    ``lstat``s when no event says anything changed).
    """
    if activity.opaque is not None:
        return False
    for owner, left in activity.converged.items():
        if left is None:
            if owner in settled or has_bookkeeping(owner):
                return False
        elif settled.get(owner) is not left or not holds(left):
            return False
    if any(outside_seen(path) != found for path, found in activity.outside.items()):
        return False
    if cache is None:
        cache = {}
    return all(
        seen(paths, path, follow, cache) == found
        for (path, follow), found in activity.looked_at.items()
    )
