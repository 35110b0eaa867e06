"""Mokka's private state directory beneath the node root, from first converge to last discard.

Every owner's manifest, journal and backups live in one directory
(``mokka.layout.MOKKA_STATE_DIR``).  It exists only while some owner has
bookkeeping there: the first converge in flight creates it (and, on an
empty root, the ancestors above it, recorded first so they can go again),
the last one out removes it once nothing waits in it, so teardown leaves
the root as it was found.

Kept apart from ``mokka.noderoot.host`` because this lifecycle (who may create it,
when it may go, what a killed process left half removed) is a concern of
its own with its own lock, while the host maps paths and runs converges.
``Host`` holds one ``StateDir`` and asks it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

from mokka.errors import HostPathError, UntrustedBookkeepingError
from mokka.layout import JOURNAL_SUFFIX, MOKKA_MANIFESTS, SNAPSHOT_SUFFIX, SNAPSHOT_TMP_SUFFIX
from mokka.layout import MOKKA_STATE_DIR as STATE_DIR
from mokka.noderoot.fsops import rmdir_empty_tree
from mokka.noderoot.manifest import is_node_path
from mokka.noderoot.paths import NodeRoot
from mokka.noderoot.private_files import (
    check_private_dir,
    make_private_dir,
    read_private,
    write_private,
    write_private_replacing,
)

#: Where releases before the record moved to the top of the root kept it (in the state directory).
_LEGACY_PARENTS_MARKER = "created-parents.json"
#: An owner's files in the manifest directory: ``<owner><suffix>``.
_MANIFEST_SUFFIXES = (SNAPSHOT_SUFFIX, JOURNAL_SUFFIX, SNAPSHOT_TMP_SUFFIX)


def manifest_owners(names: Iterable[str]) -> set[str]:
    """The owners whose files are among ``names`` (a manifest directory's listing)."""
    return {
        name.removesuffix(suffix)
        for name in names
        for suffix in _MANIFEST_SUFFIXES
        if name.endswith(suffix) and name != suffix
    }


def bookkeeping_owner(path: str) -> str:
    """The owner a bookkeeping file belongs to (``manifests/<owner>.*``, ``backups/<owner>/*``)."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[-3] == "backups":
        return parts[-2]
    name = parts[-1]
    for suffix in _MANIFEST_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


@attrs.define(eq=False)
class StateDir:
    """The state directory of one node root and the converges using it."""

    root: Path
    paths: NodeRoot
    #: Guards the shared state directory: created by the first converge in
    #: flight, removed by the last one out when no manifest remains.
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _users: int = attrs.field(default=0, init=False)

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """Hold the state directory (created if need be) for one converge."""
        with self._lock:
            self.ensure()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self.cleanup()

    def cleanup_if_idle(self) -> None:
        """``cleanup`` unless a converge is using the state directory right now."""
        with self._lock:
            if self._users == 0:
                self.cleanup()

    @property
    def path(self) -> Path:
        """Mokka's bookkeeping directory (manifests, backups), really, beneath the root.

        Followed to the end: ``var/lib/mokka`` may be a symlink (to
        ``/data/mokka``, re-rooted), and what is created and removed is the
        directory it names.
        """
        return self.paths.resolve(STATE_DIR, follow_last=True)

    def manifest_dir(self) -> Path:
        """Where every owner's manifest and journal live."""
        return self.paths.resolve(MOKKA_MANIFESTS, follow_last=True)

    @property
    def parents_marker(self) -> Path:
        """The record of the state directory's ancestors a converge created.

        At the top of the root, not in the state directory: the ancestors
        are removed *after* the state directory, and a record inside it would
        be gone by then, so a kill between the two would leave ``/var/lib``
        behind with nothing saying it was ours.  It exists only while such
        ancestors do (an empty root: tests, a local run; never on a real host).
        """
        return self.root / ".mokka-created-parents.json"

    def ensure(self) -> None:
        """Create the private state directory, recording first which ancestors will be ours.

        On an empty root (tests, a local run) ``/var`` and ``/var/lib`` do not
        exist; recording them (before they are made, like every manifest
        entry) lets the last discard remove them again, so the root ends
        exactly as it started.  The ancestors are node directories (0755);
        the state directory itself is 0700, whatever the umask.  One that
        exists is checked instead: refused unless private and ours.
        """
        state = self.path
        if check_private_dir(state):
            return
        parts = state.relative_to(self.root).parts
        missing = [
            "/" + "/".join(parts[:i])
            for i in range(1, len(parts))
            if not os.path.isdir(self.root.joinpath(*parts[:i]))
        ]
        if missing:
            recorded = self.created_parents()
            data = json.dumps(recorded + missing).encode()
            if recorded:  # left by a process killed while removing them
                write_private_replacing(self.parents_marker, data)
            else:
                write_private(self.parents_marker, data)
        for rel in missing:
            real = self.root / rel.lstrip("/")
            with contextlib.suppress(FileExistsError):
                os.mkdir(real, 0o755)
                os.chmod(real, 0o755)
        make_private_dir(state)

    def cleanup(self) -> None:
        """Remove the state directory, then the ancestors it created, once it records nothing.

        Also finishes the job of a process killed half way through it: the
        state directory gone, the ancestors (and their record) not yet.
        """
        state = self.path
        if check_private_dir(state):
            if _holds_a_file(state / "manifests") or _holds_a_file(state / "backups"):
                return  # a manifest or a backup still waits for its owner's discard
            for probe in state.glob(".mknod-probe-*"):
                # The device-node probe's scratch directory, left by a kill mid-probe
                # (``shutil`` imported only here: ``mokka ctl`` never comes this way).
                import shutil

                shutil.rmtree(probe, ignore_errors=True)
            legacy = self.created_parents(state / _LEGACY_PARENTS_MARKER)
            if legacy:
                # An earlier release kept the record inside: move it out first.
                merged = self.created_parents() + legacy
                write_private_replacing(self.parents_marker, json.dumps(merged).encode())
            with contextlib.suppress(FileNotFoundError):
                os.unlink(state / _LEGACY_PARENTS_MARKER)
            rmdir_empty_tree(state)
            if os.path.lexists(state):
                return
        if not os.path.lexists(self.parents_marker):
            return  # (checked first: on a read-only root, unlink says EROFS, not ENOENT)
        created = self.created_parents()
        for rel in sorted(created, key=lambda r: -r.count("/")):
            # OSError: something else now lives there, so it stays.
            with contextlib.suppress(OSError):
                os.rmdir(self.root / rel.lstrip("/"))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.parents_marker)

    def created_parents(self, marker: Path | None = None) -> list[str]:
        """The recorded ancestors of the state directory (checked: ancestors, nothing else)."""
        marker = marker or self.parents_marker
        raw = read_private(marker)
        if raw is None:
            return []
        try:
            created = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            created = None
        state_rel = "/" + self.path.relative_to(self.root).as_posix()
        if not isinstance(created, list) or not all(
            is_node_path(p) and state_rel.startswith(p + "/") for p in created
        ):
            raise UntrustedBookkeepingError(
                f"{marker}: expected a list of the directories above {state_rel}; "
                "nothing in this file is acted on"
            )
        return created

    def leftovers(self) -> list[str]:
        """Node paths of bookkeeping still waiting: manifests, journals, temp files, backups."""
        try:
            state = self.path
            if not check_private_dir(state):
                return []
        except (HostPathError, OSError):
            return []
        left: list[str] = []
        for sub in ("manifests", "backups"):
            if os.path.islink(state / sub):
                # Planted: named, never walked (it could lead out of the root).
                left.append("/" + (state / sub).relative_to(self.root).as_posix())
                continue
            for dirpath, _dirnames, filenames in os.walk(state / sub):
                for name in sorted(filenames):
                    rel = (Path(dirpath) / name).relative_to(self.root).as_posix()
                    left.append("/" + rel)
        return sorted(left)

    def has_bookkeeping(self, owner: str) -> bool:
        """Whether ``owner`` has a manifest, journal or temp snapshot under the root."""
        try:
            directory = self.manifest_dir()
        except HostPathError:
            return False
        return any(
            os.path.lexists(directory / f"{owner}{suffix}") for suffix in _MANIFEST_SUFFIXES
        )

    def owners(self) -> list[str]:
        """Every owner with bookkeeping under the root."""
        try:
            return self.owners_in(self.manifest_dir())
        except HostPathError:
            return []

    @staticmethod
    def owners_in(directory: Path) -> list[str]:
        """The owners with bookkeeping in ``directory`` (a manifest directory we trust)."""
        if not check_private_dir(directory):
            return []
        return sorted(manifest_owners(os.listdir(directory)))


def _holds_a_file(directory: Path) -> bool:
    """Whether anything but directories lies beneath ``directory`` (stops at the first).

    What ``StateDir.cleanup`` asks after every converge: the answer is
    nearly always yes, at the first name, where ``leftovers`` lists them all.
    A link in its place counts as a file, and is not followed.
    """
    if os.path.islink(directory):
        return True
    return any(filenames for _dirpath, _dirnames, filenames in os.walk(directory))
