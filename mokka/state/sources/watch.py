"""Watching paths for change: the directories on the way, and which names in them matter.

``watch_plan`` says which directories to watch for a path (every symlink on
the way followed, a missing component watched for in its parent);
``WatchSet`` keeps one inotify descriptor's watches on such a plan and
tells a relevant event from noise.  The file source follows its inputs
with it; a simulator that would otherwise re-check a file on a timer
(the fabric manager's marker, the kubelet's socket) waits on one instead,
so an idle daemon sleeps until something it depends on changes.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable

from mokka.state.sources.inotify import (
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MOVE_SELF,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Event,
    Inotify,
)
from mokka.state.sources.shared_inotify import View, open_shared

logger = logging.getLogger(__name__)

#: Symlink hops followed before giving up (the kernel's own limit is 40).
MAX_SYMLINK_HOPS = 40


def watch_plan(path: str | os.PathLike[str]) -> dict[str, set[str]]:
    """Directories to watch for ``path`` and, in each, the names that matter.

    Every symlink on the way is recorded (the directory holding it, its
    name) and followed; the final target's directory is recorded with the
    file's name.  A component that does not exist yet is recorded in its
    parent, so its creation is noticed.

    For a ConfigMap mount of ``/etc/mokka/config.yaml`` the plan is
    ``/etc/mokka: {config.yaml, ..data, ..2026_…}`` and
    ``/etc/mokka/..2026_…: {config.yaml}``.  Plain directories higher up
    are not watched: one of them being swapped is left to the resync.
    """
    plan: dict[str, set[str]] = {}
    _walk(os.path.abspath(os.fspath(path)), plan, 0)
    return plan


def _walk(path: str, plan: dict[str, set[str]], hops: int) -> str | None:
    """Resolve ``path`` like ``realpath``, recording watches; ``None`` if it does not resolve.

    ``current`` never contains a symlink (each one is resolved as it is
    met), so ``..`` can be taken lexically.  A relative link target is
    joined to the directory holding the link, as the kernel does.
    """
    if hops > MAX_SYMLINK_HOPS:
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    current = "/"
    for i, name in enumerate(parts):
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            st = os.lstat(candidate)
        except OSError:
            # missing (or unreadable): watch for it to appear, plan no further
            plan.setdefault(current, set()).add(name)
            return None
        if stat.S_ISLNK(st.st_mode):
            plan.setdefault(current, set()).add(name)
            try:
                target = os.readlink(candidate)
            except OSError:
                return None
            resolved = _walk(os.path.join(current, target), plan, hops + 1)
            if resolved is None:
                return None
            current = resolved
        else:
            if i == len(parts) - 1:
                plan.setdefault(current, set()).add(name)
            current = candidate
    return current


class WatchSet:
    """One inotify descriptor's watches over the plans of some paths.

    ``plan`` (blocking: it ``lstat``s the way to each path) installs the
    watches, new ones before old ones go, so a directory still wanted is
    never unwatched in between; ``relevant`` says whether an event can
    mean one of the paths changed; ``changed`` waits for such an event.
    """

    def __init__(self, inotify: Inotify | View) -> None:
        self.inotify = inotify
        #: watch descriptor -> (directory, the names in it that matter)
        self.watches: dict[int, tuple[str, frozenset[str]]] = {}
        #: events read, relevant or not
        self.events = 0

    @classmethod
    def open(cls) -> WatchSet | None:
        """A watch set on a view of the process's descriptor (``shared_inotify``);
        ``None`` when inotify is unavailable."""
        try:
            return cls(open_shared())
        except OSError as exc:
            logger.debug("inotify unavailable: %s", exc)
            return None

    def plan(self, paths: Iterable[str | os.PathLike[str]], *, why: str = "") -> None:
        """Watch exactly the directories ``paths`` resolve through now.

        Two paths to one inode (a bind mount) share a descriptor, and their
        names are merged.  A watch that fails is logged (``why`` says what
        covers for it) and left out.
        """
        plan: dict[str, set[str]] = {}
        for path in paths:
            for directory, names in watch_plan(path).items():
                plan.setdefault(directory, set()).update(names)
        watches: dict[int, tuple[str, frozenset[str]]] = {}
        for directory, names in sorted(plan.items()):
            try:
                wd = self.inotify.add_watch(directory)
            except OSError as exc:
                logger.warning("cannot watch %s (%s)%s", directory, exc, why)
                continue
            previous = watches.get(wd, (directory, frozenset()))[1]
            watches[wd] = (directory, previous | frozenset(names))
        for wd in set(self.watches) - set(watches):
            self.inotify.rm_watch(wd)
        self.watches = watches

    def relevant(self, ev: Event) -> bool:
        """Whether ``ev`` can mean new content: a watched name, or the watch set itself changing.

        Forgets a watch the kernel dropped (its directory went away), so
        the caller re-plans.
        """
        if ev.mask & IN_Q_OVERFLOW:
            return True  # events were lost: assume anything changed
        entry = self.watches.get(ev.wd)
        if entry is None:
            return False  # a watch we dropped; its last events do not matter
        if ev.mask & IN_IGNORED:
            del self.watches[ev.wd]
            return True
        if not ev.name:
            # an event on the directory itself: only its going away matters
            return bool(ev.mask & (IN_DELETE_SELF | IN_MOVE_SELF))
        return ev.name in entry[1]

    async def changed(self) -> bool:
        """Until a read of the descriptor holds at least one relevant event.

        Returns whether one of them was a file renamed onto a watched name
        (``IN_MOVED_TO``): an editor's save, ``mokka ctl``'s write, the
        kubelet's ``..data`` swap.  A rename lands a whole file at once, so
        there is nothing more of that write to wait for.
        """
        while True:
            events = await self.inotify.read_events()
            self.events += len(events)
            # A list, not a generator: ``relevant`` forgets dropped watches as
            # a side effect, so every event must be seen, not just up to the first hit.
            hits = [ev for ev in events if self.relevant(ev)]
            if hits:
                return any(ev.mask & IN_MOVED_TO for ev in hits)

    def close(self) -> None:
        self.inotify.close()
        self.watches = {}

