"""The filesystem floor: what writing a tree costs with nothing but syscalls.

A benchmark that stages a tree compares its time with ``write_floor(tree)``,
measured in the same run on the same disk: plain ``open``/``write``/
``rename`` per file (no fsync, no comparison, no manifest), ``symlink`` per
link, ``mknod`` per device.  The ratio says what the node root's safety
(resolution beneath the root, idempotence checks, the manifest journal,
fsync-before-rename) costs on top of the bare writes.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from pathlib import Path


def read_tree(root: Path) -> list[tuple[str, str, object, int]]:
    """(relative path, kind, payload, mode) of everything under ``root``, parents first."""
    entries: list[tuple[str, str, object, int]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            st = os.lstat(path)
            rel = str(path.relative_to(root))
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                entries.append((rel, "link", os.readlink(path), 0))
            elif stat.S_ISDIR(st.st_mode):
                entries.append((rel, "dir", None, mode))
            elif stat.S_ISREG(st.st_mode):
                entries.append((rel, "file", path.read_bytes(), mode))
            elif stat.S_ISCHR(st.st_mode):
                entries.append((rel, "dev", st.st_rdev, mode))
    return entries


def write_floor(entries: list[tuple[str, str, object, int]]) -> float:
    """Seconds to write ``entries`` into a fresh directory with bare syscalls."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        start = time.perf_counter()
        for rel, kind, payload, mode in entries:
            target = base / rel
            if kind == "dir":
                os.mkdir(target, mode)
            elif kind == "link":
                os.symlink(payload, target)
            elif kind == "dev":
                os.mknod(target, stat.S_IFCHR | mode, payload)
            else:
                part = target.with_name(target.name + ".tmp")
                fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
                os.write(fd, payload)
                os.close(fd)
                os.rename(part, target)
        return time.perf_counter() - start


Entry = tuple[str, str, object, int]


def tree_change(before: list[Entry], after: list[Entry]) -> tuple[list[Entry], list[str]]:
    """What turns the tree ``before`` into ``after``: entries to write (new or
    different, parents first) and paths to remove (children first)."""
    old = {rel: rest for rel, *rest in before}
    new = {rel for rel, *_ in after}
    writes = [entry for entry in after if old.get(entry[0]) != list(entry[1:])]
    removes = [rel for rel, *_ in reversed(before) if rel not in new]
    return writes, removes


def write_tree(base: Path, entries: list[Entry]) -> None:
    """Write ``entries`` beneath ``base`` (untimed set-up of a change floor)."""
    apply_change(base, entries, [])


def apply_change(base: Path, writes: list[Entry], removes: list[str]) -> float:
    """Seconds to apply a ``tree_change`` beneath ``base`` with bare syscalls.

    Removals first (``unlink``, ``rmdir``), then each write the way a
    converge places it: a directory made (or its mode set), anything else
    created under a temp name and renamed over its path.  No fsync, no
    comparison, no bookkeeping: what the filesystem itself costs for the
    change, on the same disk and in the same state as the daemon's root.
    """
    start = time.perf_counter()
    for rel in removes:
        target = base / rel
        if stat.S_ISDIR(os.lstat(target).st_mode):
            os.rmdir(target)
        else:
            os.unlink(target)
    for rel, kind, payload, mode in writes:
        target = base / rel
        if kind == "dir":
            try:
                os.mkdir(target, mode)
            except FileExistsError:
                os.chmod(target, mode)
            continue
        part = target.with_name(target.name + ".tmp")
        if kind == "link":
            os.symlink(payload, part)
        elif kind == "dev":
            os.mknod(part, stat.S_IFCHR | mode, payload)
        else:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            os.write(fd, payload)
            os.close(fd)
        os.rename(part, target)
    return time.perf_counter() - start


def create_cost(directory: Path, count: int = 300) -> float:
    """Seconds per file create (``open(O_CREAT)`` + ``close``) in a fresh directory under
    ``directory``, now: how busy or aged the disk is where a benchmark puts its roots.

    On an ext4 without a journal the inode allocator skips inodes freed in
    the last minutes (``recently_deleted``), so a disk that just had many
    files removed creates new ones many times slower (docs/benchmarks.md).
    """
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        start = time.perf_counter()
        for i in range(count):
            os.close(os.open(f"{tmp}/{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        return (time.perf_counter() - start) / count
