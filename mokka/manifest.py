"""The manifest: what one owner created under the node root.

Kept apart from ``mokka.host`` (which decides *what* to create) because its
one job is durability: the record of a path is written before the path
exists, so a fresh process can discard what a killed one left behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs


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

    @property
    def snapshot_path(self) -> Path:
        return self.directory / f"{self.owner}.json"

    @property
    def journal_path(self) -> Path:
        return self.directory / f"{self.owner}.journal"

    @classmethod
    def load(cls, owner: str, directory: Path) -> Manifest:
        manifest = cls(owner=owner, directory=directory)
        if manifest.snapshot_path.exists():
            data = json.loads(manifest.snapshot_path.read_text())
            manifest.entries = dict(data.get("entries", {}))
            manifest.backups = dict(data.get("backups", {}))
        if manifest.journal_path.exists():
            for line in manifest.journal_path.read_text().splitlines():
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line from a killed process
                op, path = record["op"], record["path"]
                if op == "add":
                    manifest.entries[path] = record["kind"]
                    if record.get("backup"):
                        manifest.backups[path] = record["backup"]
                elif op == "remove":
                    manifest.entries.pop(path, None)
                    manifest.backups.pop(path, None)
        return manifest

    def note(self, op: str, path: str, kind: str = "", backup: str = "") -> None:
        record = {"op": op, "path": path}
        if kind:
            record["kind"] = kind
        if backup:
            record["backup"] = backup
        if self._journal is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._journal = os.open(
                self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
            if os.fstat(self._journal).st_size and not _ends_with_newline(self.journal_path):
                # A killed process left half a line: end it, or this record
                # would be glued to it and skipped with it by ``load``.
                os.write(self._journal, b"\n")
        # One write per record: a reader (another owner's converge) never
        # sees half a line from a complete write.
        os.write(self._journal, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        if op == "add":
            self.entries[path] = kind
            if backup:
                self.backups[path] = backup
        else:
            self.entries.pop(path, None)
            self.backups.pop(path, None)

    def close(self) -> None:
        """Close the journal descriptor (idempotent)."""
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None

    def compact(self) -> None:
        """Fold the journal into the snapshot; remove both when nothing is owned."""
        self.close()
        if not self.entries:
            self.snapshot_path.unlink(missing_ok=True)
            self.journal_path.unlink(missing_ok=True)
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.snapshot_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"entries": self.entries, "backups": self.backups}, indent=1))
        os.replace(tmp, self.snapshot_path)
        self.journal_path.unlink(missing_ok=True)


def _ends_with_newline(path: Path) -> bool:
    """Whether the last byte of a (non-empty) journal is a newline."""
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
