"""Whether another owner's bookkeeping records a directory as one it created.

A converge that finds a directory it did not create asks every other
owner's journal and snapshot whether that owner made it, and shares it if
so (``Convergence._ensure_dir``), so whichever owner leaves last removes it:
a converge removing a directory it recorded first asks whether another
owner still records it (``listed``, every owner's directories at once) and
then only forgets it.
A cold h100 pass asks about a hundred times, and each ask read and parsed
every other owner's journal again.  ``OwnerListings`` keeps each file's
parsed answer until the file's ``lstat`` signature changes: an append, a
compaction (a new snapshot, the journal gone), a chmod or a chown all
change it, and a changed file is read again through ``read_private`` with
its trust checks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from mokka.errors import UntrustedBookkeepingError
from mokka.layout import JOURNAL_SUFFIX, SNAPSHOT_SUFFIX
from mokka.noderoot.filememo import MISSING, FileMemo, file_signature
from mokka.noderoot.private_files import read_private
from mokka.noderoot.statedir import manifest_owners

#: A file that failed its trust checks or could not be read: it lists nothing.
_REFUSED: Final = object()


class OwnerListings:
    """Parsed journals and snapshots of other owners, each kept while its file is unchanged.

    Not thread-safe by itself: a converge asks under the host's directory lock.
    """

    def __init__(self) -> None:
        self._files = FileMemo()
        #: Directory records noted by this process's converges so far (any
        #: owner): a reading of the others' bookkeeping (``listed``) taken
        #: when no other converge has noted one since still holds, within
        #: this process.  Counted under the host's directory lock.
        self.notes = 0

    def listed_by_any(self, directory: Path, exclude: str, key: str) -> bool:
        """Whether an owner other than ``exclude`` records ``key`` as a directory (``lists``)."""
        return any(self.lists(directory, owner, key) for owner in _others(directory, exclude))

    def listed(self, directory: Path, exclude: str) -> frozenset[str]:
        """Every directory an owner other than ``exclude`` records: ``lists``, for all keys."""
        found: set[str] = set()
        for owner in _others(directory, exclude):
            ops = self._parsed(f"{directory}/{owner}{JOURNAL_SUFFIX}", _journal_ops)
            if ops is _REFUSED:
                continue
            journal = ops if isinstance(ops, dict) else {}
            dirs = self._parsed(f"{directory}/{owner}{SNAPSHOT_SUFFIX}", _snapshot_dirs)
            if isinstance(dirs, frozenset):
                found.update(key for key in dirs if journal.get(key) is None)
            found.update(key for key, op in journal.items() if op == "add")
        return frozenset(found)

    def lists(self, directory: Path, owner: str, key: str) -> bool:
        """Whether ``owner``'s manifest records ``key`` as a directory it created.

        Another owner converges at the same time: its journal is looked at
        before its snapshot, because a compaction writes the snapshot
        before it deletes the journal, so an entry noted before we looked
        is in one or the other.  Bookkeeping that fails the trust checks
        lists nothing (that owner's own converge refuses it loudly).
        """
        ops = self._parsed(f"{directory}/{owner}{JOURNAL_SUFFIX}", _journal_ops)
        if ops is _REFUSED:
            return False
        last = ops.get(key) if isinstance(ops, dict) else None
        if last is not None:
            return last == "add"
        dirs = self._parsed(f"{directory}/{owner}{SNAPSHOT_SUFFIX}", _snapshot_dirs)
        return isinstance(dirs, frozenset) and key in dirs

    def _parsed(self, path: str, parse: Callable[[bytes], object]) -> object:
        """``parse`` of the file's content, from the cache while its signature holds;
        ``None`` when there is no such file."""
        try:
            signature = file_signature(path)
        except OSError:
            return _REFUSED
        if signature is None:
            return None
        cached = self._files.get(path, signature)
        if cached is not MISSING:
            return cached
        try:
            content = read_private(Path(path))
        except (UntrustedBookkeepingError, OSError):
            parsed: object = _REFUSED
        else:
            parsed = None if content is None else parse(content)
        self._files.keep(path, signature, parsed)
        return parsed


def _others(directory: Path, exclude: str) -> list[str]:
    """The owners with bookkeeping in ``directory`` but ``exclude``, in name order (an
    owner with only a half-written snapshot is none: ``statedir.manifest_owners``)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(manifest_owners(names) - {exclude})


def _journal_ops(content: bytes) -> dict[str, object]:
    """Each path's last journal record: its ``op`` for a directory, ``None`` for another kind."""
    ops: dict[str, object] = {}
    for line in content.decode(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line being written right now
        if isinstance(record, dict) and isinstance(record.get("path"), str):
            ops[record["path"]] = (
                record.get("op") if record.get("kind", "dir") == "dir" else None
            )
    return ops


def _snapshot_dirs(content: bytes) -> object:
    """The directories a snapshot records; ``_REFUSED`` for one that is not JSON."""
    try:
        snapshot = json.loads(content or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _REFUSED
    entries = snapshot.get("entries") if isinstance(snapshot, dict) else None
    if not isinstance(entries, dict):
        return frozenset()
    return frozenset(path for path, kind in entries.items() if kind == "dir")
