"""Helpers shared by the tests (not fixtures: plain functions, imported explicitly)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


def snapshot(root: Path) -> dict[str, tuple]:
    """Everything under ``root``: path → (type, mode, content or link target or device).

    Two equal snapshots mean the tree is the same byte for byte (mtimes aside).
    """
    result: dict[str, tuple] = {}
    root = Path(root)
    if not root.exists():
        return result
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            st = os.lstat(path)
            rel = str(path.relative_to(root))
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                result[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                result[rel] = ("dir", mode)
            elif stat.S_ISREG(st.st_mode):
                result[rel] = ("file", mode, path.read_bytes())
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                result[rel] = ("dev", mode, os.major(st.st_rdev), os.minor(st.st_rdev))
            else:
                result[rel] = ("other", mode)
    return result


def require_tool(name: str) -> str:
    """Path of a real client on PATH, or fail the test saying how to get it.

    Never skips: a missing real client is a broken test environment, and CI
    must say so rather than pass quietly.  ``./scripts/test`` installs them.
    """
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"real client {name!r} is not installed; run ./scripts/install-system-deps "
            "(or ./scripts/test, which does) to install the Debian packages the tests need"
        )
    return path


_SMI_CACHE = ROOT / ".tools" / "nvidia-smi"
_SMI_PATHS = ("usr/bin/nvidia-smi", "usr/lib/nvidia/current/nvidia-smi")


def real_nvidia_smi() -> Path:
    """The real Debian non-free nvidia-smi 535 binary, unpacked (never installed).

    ``scripts/install-system-deps`` downloads the .deb into /var/cache/mokka
    (or ``MOKKA_SMI_DEB_DIR``); it is unpacked with ``dpkg -x`` into
    ``.tools/`` once.  The package's libnvidia-ml dependency is never
    installed: the mock library is the one it must load.
    """
    # Debian ships the ELF under usr/lib/nvidia/current (usr/bin/nvidia-smi is
    # an alternatives link set up by maintainer scripts, which dpkg -x skips).
    candidates = [_SMI_CACHE / rel for rel in _SMI_PATHS]
    for binary in candidates:
        if binary.is_file():
            return binary
    deb_dir = Path(os.environ.get("MOKKA_SMI_DEB_DIR", "/var/cache/mokka"))
    debs = sorted(deb_dir.glob("nvidia-smi_*.deb"))
    if not debs:
        pytest.fail(
            f"no nvidia-smi .deb in {deb_dir}; run ./scripts/install-system-deps "
            "(it enables Debian non-free and downloads it)"
        )
    _SMI_CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg", "-x", str(debs[-1]), str(_SMI_CACHE)], check=True)
    for binary in candidates:
        if binary.is_file():
            return binary
    pytest.fail(f"{debs[-1]} unpacked into {_SMI_CACHE} but holds no nvidia-smi at {_SMI_PATHS}")


async def wait_for_count(counter, expected: int) -> None:
    """Wait until ``counter`` (a ``trio_util.AsyncValue[int]``) reaches at
    least ``expected``, let every task settle, then demand exactly
    ``expected``.

    Waiting for the exact value would hang a test when the code under test
    overshoots (a record announced twice): this way an overshoot fails at
    once, with the count in the message.
    """
    await counter.wait_value(lambda value: value >= expected)
    await trio.testing.wait_all_tasks_blocked()
    assert counter.value == expected, f"expected exactly {expected}, counted {counter.value}"


def count_reads(monkeypatch: pytest.MonkeyPatch, module: object) -> list[str]:
    """The names of the bookkeeping files ``module`` reads through its ``read_private``
    from now on, in order."""
    seen: list[str] = []
    real = module.read_private  # type: ignore[attr-defined]

    def read_private(path: Path) -> bytes | None:
        seen.append(path.name)
        return real(path)

    monkeypatch.setattr(module, "read_private", read_private)
    return seen


class GiveWayAfter(threading.Event):
    """A converge's ``Host.GIVE_WAY`` event: a newer input arrives after ``checks`` paths
    (or when set, as the reconciler's own ``stop``)."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.checks = checks

    def is_set(self) -> bool:
        self.checks -= 1
        return self.checks < 0 or super().is_set()


def journal(directory: Path, owner: str, *records: dict) -> None:
    """Append records to ``owner``'s journal as the manifest writes them (private file):
    what another owner's converge, or a process killed mid-converge, leaves."""
    path = directory / f"{owner}.journal"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"".join(json.dumps(r).encode() + b"\n" for r in records))
    finally:
        os.close(fd)


def typed(value: Any) -> Any:
    """``value`` with each scalar's type beside it, for comparing two readings of a text:
    ``1``, ``1.0`` and ``True`` are equal to Python and differ here."""
    if isinstance(value, dict):
        return [(typed(k), typed(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", *(typed(v) for v in value)]
    return (type(value).__name__, value)
