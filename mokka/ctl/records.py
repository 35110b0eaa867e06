"""Whether ``mokka ctl``'s files are already recorded: then a call needs no host.

A writing call records the overrides file and its lock in the manifests of
``overrides.MANIFEST_OWNERS`` before creating them (``mokka.ctl.command.change``),
through ``Host``, so that ``mokka cleanup`` removes them after a killed
daemon.  Those records stay until the daemon resets the file (at its start
and stop, under the same turn, ``overrides.records_locked``), and while
they stay a later call changes only the file's text: what cleanup must
remove is already written down.  Such a call need not load the host's
bookkeeping (about a third of a call's imports, and attrs with it):
``already_recorded`` reads the two snapshots as the host would trust them,
and the call replaces the file as a converge would, by a temp file beside
it (``overrides.replace_text``: ``layout.temp_name``, the name a removal
also clears) renamed over it.

Anything short of the plain case (no snapshot, a journal a killed call
left, a record of anything more, a bookkeeping file that is not private,
a link on the way) answers "not recorded", and the call takes the host's
way, which reports or repairs it.  Both run under the caller's
``records_locked``: a reset cannot come between the check and the write.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mokka import layout
from mokka.errors import UntrustedBookkeepingError
from mokka.noderoot import check_private, read_private
from mokka.state.overrides import MANIFEST_OWNERS, lock_path
from mokka.state.reader import open_parent

#: Each owner's one file, created by Mokka (the snapshot must say so): a
#: converge of the owner also records the directories above the file that
#: it shares with their maker, and nothing else.
RECORDED = dict(zip(
    MANIFEST_OWNERS, (layout.OVERRIDES, lock_path(Path(layout.OVERRIDES)).as_posix()),
    strict=True,
))
#: Files beside a snapshot that mean a converge did not finish (``Manifest``).
_UNFINISHED = (layout.JOURNAL_SUFFIX, layout.SNAPSHOT_TMP_SUFFIX)


def already_recorded(root: Path) -> bool:
    """Whether both owners' snapshots record their one file and nothing else, trusted."""
    manifests = root / layout.MOKKA_MANIFESTS.lstrip("/")
    try:
        # the directory the snapshots sit in, reached from the root without a link
        dir_fd, _ = open_parent(manifests / f"{MANIFEST_OWNERS[0]}{layout.SNAPSHOT_SUFFIX}", root)
    except OSError:
        return False  # no manifests yet, or a link on the way: the host's way decides
    assert dir_fd is not None
    try:
        check_private(manifests, os.fstat(dir_fd), directory=True)
        return all(_records(manifests, dir_fd, owner, path) for owner, path in RECORDED.items())
    except (OSError, UntrustedBookkeepingError):
        return False
    finally:
        os.close(dir_fd)


def _records(manifests: Path, dir_fd: int, owner: str, node_path: str) -> bool:
    """Whether ``owner``'s snapshot, and nothing unfinished, records ``node_path`` as the host
    would leave it: the file, maybe directories above it, and no backup."""
    for suffix in _UNFINISHED:
        try:
            os.stat(owner + suffix, dir_fd=dir_fd, follow_symlinks=False)
            return False
        except FileNotFoundError:
            pass
    raw = read_private(manifests / f"{owner}{layout.SNAPSHOT_SUFFIX}", dir_fd=dir_fd)
    try:
        data = json.loads(raw) if raw is not None else None
    except ValueError:  # not JSON, or not UTF-8: the host's way refuses it, naming the file
        return False
    if not isinstance(data, dict) or data.get("backups") != {} or set(data) != {
            "entries", "backups"}:
        return False
    entries = data["entries"]
    above = {node_path.rsplit("/", n)[0] for n in range(1, node_path.count("/"))}
    return isinstance(entries, dict) and entries.get(node_path) == "file" and all(
        path == node_path or (kind == "dir" and path in above) for path, kind in entries.items())
