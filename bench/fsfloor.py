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
