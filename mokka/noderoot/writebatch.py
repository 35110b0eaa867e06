"""One converge's writes: each entry under a temp name beside its path, renamed over it.

Readers see a path old or new, never half-written.  Links and device nodes
are complete the moment they exist and are renamed at once; regular files
wait in the batch until ``commit`` has made their data durable (see there
for the argument).  Kept apart from ``mokka.noderoot.convergence``, which decides
*what* to write and records it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import attrs

from mokka.layout import temp_name
from mokka.noderoot import fsops
from mokka.noderoot.artifacts import Artifact, CharDevice, CopyOf, File, Symlink

#: Batches of at most this many regular files are synced file by file (``commit``).
_FILE_SYNC_BATCH = 4


@attrs.define(eq=False)
class WriteBatch:
    """The temp files of one converge call and their way to disk."""

    #: The node root (``syncfs`` flushes its filesystem).
    root: Path
    #: The host's disk turn, held by the converge: let go while ``commit`` waits for the disk.
    disk_turn: threading.RLock
    #: The converge's degraded list: a device node written as a placeholder is noted there.
    degraded: list[str]
    #: Called before this batch creates anything: writes the journal records held
    #: for its regular files (``Manifest.flush``), so no entry exists unrecorded.
    before_create: Callable[[], None] = lambda: None
    #: Regular files to write at ``commit`` (real path -> artifact).
    queued: dict[str, Artifact] = attrs.field(factory=dict)
    #: Regular files written under their temp names (real path -> temp path).
    pending: dict[str, str] = attrs.field(factory=dict)

    def write(self, art: Artifact, real: str) -> None:
        """Write ``art`` beside ``real`` and rename it over: readers see old or new, never half.

        Links and device nodes are complete the moment they exist and are
        made and renamed at once (a later artifact may live beneath a link).
        Regular files wait for ``commit``: their journal records are
        written together there, then their temp files, then one filesystem
        sync for the whole batch, then the renames; see there.  Device nodes
        fall back to a placeholder file without CAP_MKNOD (recorded as
        degraded).
        """
        if isinstance(art, (File, CopyOf)):
            self.queued[real] = art
            return
        self.before_create()
        tmp = temp_name(real)
        try:
            self._make_tmp(art, tmp)
            os.replace(tmp, real)
        except BaseException:
            # A full disk, a kill: no temp file is left beside the path.
            with contextlib.suppress(OSError):
                fsops.unlink(tmp)
            raise

    def _make_tmp(self, art: Artifact, tmp: str) -> None:
        """The new entry, complete, under the temp name (one a killed process left goes)."""
        try:
            self._write_tmp(art, tmp)
        except FileExistsError:
            fsops.unlink(tmp)
            self._write_tmp(art, tmp)

    def _write_tmp(self, art: Artifact, tmp: str) -> None:
        if isinstance(art, Symlink):
            os.symlink(art.target, tmp)
            return
        if isinstance(art, CharDevice):
            try:
                os.mknod(tmp, stat.S_IFCHR | art.mode, os.makedev(art.major, art.minor))
                os.chmod(tmp, art.mode)
            except PermissionError:
                # Recognisable content: a crash that empties it makes the
                # next converge see a mismatch and write it again.
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                try:
                    fsops.write_all(fd, fsops.placeholder(art))
                finally:
                    os.close(fd)
                os.chmod(tmp, 0o644)
                self.degraded.append(fsops.placeholder_reason(art))
            return
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, art.mode
        )
        try:
            if isinstance(art, File):
                fsops.write_all(fd, art.content)
            else:
                with open(art.source, "rb") as source:
                    while chunk := source.read(1 << 20):
                        fsops.write_all(fd, chunk)
            os.fchmod(fd, art.mode)
        finally:
            os.close(fd)

    def _write_queued(self) -> None:
        """The queued regular files' temp files, once their records are written."""
        if self.queued:
            self.before_create()
        while self.queued:
            real, art = next(iter(self.queued.items()))
            tmp = temp_name(real)
            try:
                self._make_tmp(art, tmp)
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    fsops.unlink(tmp)
                if isinstance(exc, OSError) and exc.filename is None:
                    exc.filename = real  # a failed ``write`` (ENOSPC) names no file
                raise
            self.pending[real] = tmp
            del self.queued[real]

    def commit(self) -> None:
        """Make the batch's regular files durable, then rename each over its path.

        The durability argument (also in docs/operations.md, "Failure
        model"): a rename can reach the disk before the data of the file it
        names, so after a power loss a renamed-but-unsynced file can be
        empty under its final name, and the next converge would have to
        notice.  Syncing *each* file before its rename closes that at the
        price of one disk flush per file (hundreds per pass).  Syncing the
        filesystem *once* after every temp file of the batch is written,
        and renaming only then, gives every file the same guarantee: no
        rename is issued before the data it exposes is on disk.  A crash
        before the sync leaves only temp files (recorded paths' neighbours,
        removed by the next converge or discard); one after it leaves each
        path old or new, never empty.  The manifest journal still records
        each path before its temp file exists (``before_create`` writes the
        records the converge held for the batch's files, in one ``write``,
        before the first temp file), so a kill at any point leaves a record,
        never an orphan.

        A small batch (``mokka ctl``'s overrides file, a workload change)
        syncs its files one by one instead: ``syncfs`` flushes every dirty
        page of the filesystem, other processes' included, and on a busy
        node that can take far longer than the few files of the batch.
        """
        self._write_queued()
        if not self.pending:
            return
        self.disk_turn.release()
        try:
            if len(self.pending) <= _FILE_SYNC_BATCH:
                for tmp in self.pending.values():
                    fsops.sync_file(tmp)
            else:
                fsops.sync_filesystem(self.root)
        finally:
            self.disk_turn.acquire()
        while self.pending:
            real, tmp = next(iter(self.pending.items()))
            os.replace(tmp, real)
            del self.pending[real]

    def abandon(self) -> None:
        """Remove the temp files of a batch that failed before ``commit`` renamed them."""
        for tmp in self.pending.values():
            with contextlib.suppress(OSError):
                fsops.unlink(tmp)
        self.pending.clear()
        self.queued.clear()

