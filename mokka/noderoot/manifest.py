"""The manifest: what one owner created under the node root, and the trust put in it.

Kept apart from ``mokka.noderoot.host`` (which decides *what* to create) because its
one job is the bookkeeping itself:

* durability: the record of a path is written before the path exists, so a
  fresh process can discard what a killed one left behind;
* privacy: every bookkeeping directory is created 0700 and every file 0600
  whatever the umask (``mokka.noderoot.private_files``, with the check that they still
  are), because the daemon (usually root) acts on what they say;
* trust: before anything in a manifest, journal or backup is acted on, the
  file and its directory must be private (``check_private``), and every
  record must be one the daemon could have written (a node path beneath the
  root, outside the bookkeeping, of a kind it knows).  Anything else is
  refused with ``UntrustedBookkeepingError`` naming the file and why, and
  *nothing* from that file is acted on.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from pathlib import Path

import attrs

from mokka.errors import UntrustedBookkeepingError
from mokka.layout import JOURNAL_SUFFIX, MOKKA_STATE_DIR, SNAPSHOT_SUFFIX, SNAPSHOT_TMP_SUFFIX
from mokka.lazylogger import LazyLogger
from mokka.noderoot.filememo import MISSING, FileMemo, file_signature
from mokka.noderoot.private_files import (
    PRIVATE_FILE_MODE,
    check_private,
    check_private_dir,
    make_private_dir,
    read_private,
    write_private,
)

logger = LazyLogger(__name__)

#: What a manifest records a path as (``mokka.noderoot.convergence`` notes these).
KINDS = frozenset({"file", "symlink", "device", "dir"})
#: A backup's name: the first 32 hex digits of the sha256 of its node path.
_BACKUP_NAME = re.compile(r"[0-9a-f]{32}")


# --------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------


def is_node_path(path: object) -> bool:
    """Whether ``path`` is a node path as the host spells it: ``/a/b``, no '.', '..', '//'."""
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        return False
    parts = path[1:].split("/")
    return all(p not in ("", ".", "..") for p in parts)


def _in_bookkeeping(path: str) -> bool:
    """Whether ``path`` is Mokka's state directory or under it (never an owner's artifact)."""
    return path == MOKKA_STATE_DIR or path.startswith(MOKKA_STATE_DIR + "/")


def _check_entry(source: Path, where: str, path: object, kind: object, backup: object) -> None:
    """One recorded path, as the daemon could have written it; else refuse ``source``."""
    def refuse(problem: str) -> UntrustedBookkeepingError:
        return UntrustedBookkeepingError(
            f"{source}: {where}: {problem}; nothing in this file is acted on"
        )

    if not is_node_path(path):
        raise refuse(f"path {path!r} is not a node path, expected '/dir/name' without '.' or '..'")
    if _in_bookkeeping(path):  # type: ignore[arg-type]
        raise refuse(f"path {path} lies in Mokka's own bookkeeping, expected an artifact path")
    if kind not in KINDS:
        raise refuse(f"kind {kind!r} of {path}, expected one of {', '.join(sorted(KINDS))}")
    if backup not in ("", None) and not (
        isinstance(backup, str) and _BACKUP_NAME.fullmatch(backup)
    ):
        raise refuse(f"backup {backup!r} of {path}, expected 32 hex digits")


@attrs.define(eq=False)
class Manifest:
    """Paths one owner created, in creation order, with the kind of each.

    Persisted as a snapshot (``<owner>.json``) plus an append-only journal
    (``<owner>.journal``): a path is appended to the journal *before* it is
    created, so a process killed mid-batch still leaves a record of it.  A
    journal line costs one unbuffered ``write`` on a descriptor kept open for
    the converge (no fsync: a killed process loses no page cache; a crashed
    machine reboots the node anyway).  ``close`` (or ``compact``) ends it.
    """

    owner: str
    directory: Path
    entries: dict[str, str] = attrs.field(factory=dict)  # path -> kind
    backups: dict[str, str] = attrs.field(factory=dict)  # path -> backup file name
    #: The journal, open for appending while this converge notes paths.
    _journal: int | None = attrs.field(default=None, init=False, repr=False)
    #: The journal may end in half a record (a failed or short write): the
    #: next record starts on a line of its own.
    _torn: bool = attrs.field(default=False, init=False, repr=False)
    #: Whether a journal was found or written: without one, the snapshot
    #: already says everything and ``compact`` has nothing to fold.
    _journaled: bool = attrs.field(default=False, init=False, repr=False)
    #: Where ``load`` found the folded snapshot, and ``compact`` leaves the new one.
    _snapshots: FileMemo | None = attrs.field(default=None, init=False, repr=False)
    #: Records noted ``held``: written with the next record, or by ``flush``.
    _held: list[bytes] = attrs.field(factory=list, init=False, repr=False)

    @property
    def snapshot_path(self) -> Path:
        return self.directory / f"{self.owner}{SNAPSHOT_SUFFIX}"

    @property
    def journal_path(self) -> Path:
        return self.directory / f"{self.owner}{JOURNAL_SUFFIX}"

    @property
    def tmp_path(self) -> Path:
        return self.directory / f"{self.owner}{SNAPSHOT_TMP_SUFFIX}"

    @classmethod
    def load(cls, owner: str, directory: Path, snapshots: FileMemo | None = None) -> Manifest:
        """Read the snapshot and journal, refusing both unless private and well formed.

        A snapshot a killed compaction left half written (``<owner>.json.tmp``)
        is removed: the journal it was folding in is still there.  The caller
        holds the owner's lock, and the node lock keeps other processes out.
        ``snapshots`` keeps the folded snapshot while the file is unchanged
        (``mokka.noderoot.filememo``), so a converge reads and checks it only after
        it changed; the journal, almost always absent, is read every time.
        """
        manifest = cls(owner=owner, directory=directory)
        manifest._snapshots = snapshots
        if not check_private_dir(directory):
            return manifest
        with contextlib.suppress(FileNotFoundError):
            os.unlink(manifest.tmp_path)
        manifest._read_snapshot()
        journal = read_private(manifest.journal_path)
        if journal is not None:
            manifest._fold_journal(journal)
            manifest._journaled = True
        return manifest

    def _read_snapshot(self) -> None:
        """Fold the snapshot in, from ``_snapshots`` while the file is the one kept there."""
        path, signature = str(self.snapshot_path), None
        if self._snapshots is not None:
            signature = file_signature(path)  # before the read: see ``FileMemo``
            kept = self._snapshots.get(path, signature)
            if kept is not MISSING:
                entries, backups = kept  # type: ignore[misc]  # what ``_keep_snapshot`` stores
                self.entries, self.backups = dict(entries), dict(backups)
                return
        snapshot = read_private(self.snapshot_path)
        if snapshot is not None:
            self._fold_snapshot(snapshot)
            self._keep_snapshot(signature)

    def _keep_snapshot(self, signature: tuple[int, ...] | None) -> None:
        """Remember the snapshot as folded now, under ``signature`` (``None``: forget it)."""
        if self._snapshots is not None:
            self._snapshots.keep(str(self.snapshot_path), signature,
                                 (dict(self.entries), dict(self.backups)))

    def _fold_snapshot(self, raw: bytes) -> None:
        source = self.snapshot_path
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            # Written whole and renamed into place: damage is not a torn write.
            raise UntrustedBookkeepingError(
                f"{source}: not valid JSON ({exc}); nothing in this file is acted on"
            ) from None
        entries = data.get("entries", {}) if isinstance(data, dict) else None
        backups = data.get("backups", {}) if isinstance(data, dict) else None
        if not isinstance(entries, dict) or not isinstance(backups, dict):
            raise UntrustedBookkeepingError(
                f"{source}: expected an object with 'entries' and 'backups' objects; "
                "nothing in this file is acted on"
            )
        for path, kind in entries.items():
            _check_entry(source, f"entries[{path!r}]", path, kind, backups.get(path, ""))
        for path in backups:
            if path not in entries:
                raise UntrustedBookkeepingError(
                    f"{source}: backups[{path!r}]: a backup of a path the entries do not list; "
                    "nothing in this file is acted on"
                )
        self.entries = dict(entries)
        self.backups = dict(backups)

    def _fold_journal(self, raw: bytes) -> None:
        source = self.journal_path
        checked: list[tuple[str, str, str, str]] = []
        for lineno, line in enumerate(raw.decode(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line from a killed process (or a full disk)
            where = f"line {lineno}"
            if not isinstance(record, dict) or record.get("op") not in ("add", "remove"):
                raise UntrustedBookkeepingError(
                    f"{source}: {where}: expected a record with op 'add' or 'remove'; "
                    "nothing in this file is acted on"
                )
            op, path = record["op"], record.get("path")
            kind = record.get("kind", "") if op == "add" else "dir"
            _check_entry(source, where, path, kind, record.get("backup", ""))
            checked.append((op, path, kind, record.get("backup") or ""))
        # Only once every record passed: a refusal acts on none of them.
        for op, path, kind, backup in checked:
            self._remember(op, path, kind, backup)

    def note(
        self, op: str, path: str, kind: str = "", backup: str = "", *,
        held: bool = False, durable: bool = False,
    ) -> None:
        """Record ``op`` on ``path`` in the journal, then in memory.

        An ``add`` that cannot be written raises: the path must not be
        created unrecorded.  A ``remove`` that cannot be written (a full
        disk) is kept in memory only: the path is already gone, and a later
        discard of a missing path is a no-op.  Unless ``durable``: the
        removal of a restored path must be on disk before its backup goes
        (``mokka.noderoot.backups``), so that one raises too.

        ``held``: for a path nothing will be created for until the caller
        ``flush``es (a regular file of a batch: its temp file is made at
        the batch's commit).  The record is written with the next one, or
        by ``flush``: one ``write`` for a batch's files instead of one each.
        """
        # What ``json.dumps(record, separators=(",", ":"))`` writes, built
        # with its C string encoder: one line per path of every converge.
        line = f'{{"op":{_json_str(op)},"path":{_json_str(path)}'
        if kind:
            line += f',"kind":{_json_str(kind)}'
        if backup:
            line += f',"backup":{_json_str(backup)}'
        record = (line + "}\n").encode()
        if held:
            self._held.append(record)
            self._remember(op, path, kind, backup)
            return
        if op != "add":
            self.flush()  # held records must not go down with a removal's unwritten one
        elif self._held:
            # Held records first, in the order they were noted: one write.
            record = b"".join(self._held) + record
        try:
            self._append(record)
        except OSError as exc:
            if op == "add" or durable:
                raise
            logger.debug("%s: could not journal the removal of %s: %s", self.owner, path, exc)
        self._held.clear()
        self._remember(op, path, kind, backup)

    def flush(self) -> None:
        """Write the records noted ``held``; raises when they cannot be (nothing of
        theirs may be created then)."""
        if self._held:
            self._append(b"".join(self._held))
            self._held.clear()

    def _remember(self, op: str, path: str, kind: str, backup: str) -> None:
        """One journal record applied to the in-memory view (a note, or a replayed line)."""
        if op == "add":
            self.entries[path] = kind
            if backup:
                self.backups[path] = backup
        else:
            self.entries.pop(path, None)
            self.backups.pop(path, None)

    def _append(self, line: bytes) -> None:
        """One ``write`` per record: a reader (another owner) never sees half a complete one."""
        if self._journal is None:
            self._journaled = True
            make_private_dir(self.directory)
            fd = os.open(
                self.journal_path,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                PRIVATE_FILE_MODE,
            )
            try:
                st = os.fstat(fd)
                check_private(self.journal_path, st, directory=False)
            except BaseException:
                os.close(fd)
                raise
            self._journal = fd
            # A killed process may have left half a line: end it, or this
            # record would be glued to it and skipped with it by ``load``.
            self._torn = bool(st.st_size) and not _ends_with_newline(self.journal_path)
        if self._torn:
            line = b"\n" + line
        self._torn = True
        try:
            written = os.write(self._journal, line)
        except OSError as exc:
            # named, or the converge would blame the path it was about to place
            exc.filename = str(self.journal_path)
            raise
        self._torn = written != len(line)
        if self._torn:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.journal_path))

    def close(self) -> None:
        """Close the journal descriptor (idempotent).  Records still held are dropped:
        nothing was created for them (a batch that failed before its commit)."""
        self._held.clear()
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None

    def compact(self) -> None:
        """Fold the journal into the snapshot; remove all three files when nothing is owned.

        A failed write of the new snapshot (a full disk) leaves no temp file
        and loses nothing: the journal and old snapshot still say it all.
        """
        self.close()
        if self.entries and not self._journaled:
            # Nothing noted since the snapshot was written (a pass that
            # changed nothing): rewriting it would only cost a write.
            return
        if not self.entries:
            self._keep_snapshot(None)
            for path in (self.tmp_path, self.snapshot_path, self.journal_path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return
        make_private_dir(self.directory)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp_path)
        # One line: ``indent`` would take the pure-Python encoder, several
        # times slower on a manifest of thousands of paths.
        data = json.dumps({"entries": self.entries, "backups": self.backups})
        write_private(self.tmp_path, data.encode())
        os.replace(self.tmp_path, self.snapshot_path)
        # What was just written is what memory holds: the next load need not read it.
        self._keep_snapshot(file_signature(str(self.snapshot_path)))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.journal_path)


#: A JSON string literal, ASCII only, as ``json.dumps`` writes it.
_json_str = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


def _ends_with_newline(path: Path) -> bool:
    """Whether the last byte of a (non-empty) journal is a newline."""
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
