"""A batch's regular files are journaled together at its commit, and still nothing a
converge makes ever exists unrecorded (``Manifest.note(held=True)``, ``WriteBatch``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import mokka.noderoot.manifest
from mokka.errors import HostFaultError
from mokka.layout import JOURNAL_SUFFIX, MOKKA_MANIFESTS, MOKKA_STATE_DIR
from mokka.noderoot.host import CharDevice, CopyOf, Directory, File, Host, Symlink
from tests.support import snapshot

OWNER = "held-test"


def artifacts(source: Path, count: int = 40) -> list:
    return [
        Directory("/opt/held"),
        *(File(f"/opt/held/deep/f{i}", f"{i}\n") for i in range(count)),
        CopyOf("/opt/held/copy", source, mode=0o755),
        Symlink("/opt/held/link", "deep/f0"),
        CharDevice("/dev/held0", major=195, minor=0),
        File("/etc/held.conf", "replaced\n"),  # over the node's own file: backed up
    ]


def journaled(root: Path) -> set[str]:
    """The node paths the owner's journal on disk records as added right now."""
    journal = root / MOKKA_MANIFESTS.lstrip("/") / f"{OWNER}{JOURNAL_SUFFIX}"
    try:
        lines = journal.read_text().splitlines()
    except FileNotFoundError:
        return set()
    return {json.loads(line)["path"] for line in lines if line.strip()}


def node_path(root: Path, made: str) -> str | None:
    """The node path an entry being made stands for (a temp file, its final path);
    ``None`` for Mokka's own bookkeeping."""
    path = "/" + os.path.relpath(made, root)
    if (path.startswith(MOKKA_STATE_DIR + "/") or path.startswith("/..")
            or (MOKKA_STATE_DIR + "/").startswith(path + "/")  # the state dir's parents
            or path.startswith("/.mokka-created-parents")):  # and their own record
        return None
    directory, _, name = path.rpartition("/")
    if name.startswith(".") and name.endswith(".mokka-tmp"):
        name = name[1:-len(".mokka-tmp")]
    return f"{directory}/{name}"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "source.bin"
    path.write_bytes(b"\x7fELF a copied file\n")
    return path


def test_every_entry_is_recorded_on_disk_before_it_is_made(
    host: Host, node_root: Path, source: Path, monkeypatch: pytest.MonkeyPatch
):
    """At every ``mkdir``, ``open(O_CREAT)``, ``symlink`` and ``mknod`` beneath the root
    (a kill could come right after any of them), the journal already names the path."""
    (node_root / "etc").mkdir()
    (node_root / "etc/held.conf").write_text("the node's own\n")
    before = snapshot(node_root)
    made: list[str] = []
    unrecorded: list[str] = []

    def check(path) -> None:
        if not isinstance(path, (str, os.PathLike)):
            return
        path = os.fsdecode(path)
        if not path.startswith(str(node_root) + os.sep):
            return
        wanted = node_path(node_root, path)
        if wanted is None:
            return
        made.append(wanted)
        if wanted not in journaled(node_root):
            unrecorded.append(wanted)

    real = {name: getattr(os, name) for name in ("mkdir", "open", "symlink", "mknod")}

    def spy_open(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            check(path)
        return real["open"](path, flags, *args, **kwargs)

    def spy_mkdir(path, *args, **kwargs):
        check(path)
        return real["mkdir"](path, *args, **kwargs)

    def spy_symlink(target, path, *args, **kwargs):
        check(path)
        return real["symlink"](target, path, *args, **kwargs)

    def spy_mknod(path, *args, **kwargs):
        check(path)
        return real["mknod"](path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "mkdir", spy_mkdir)
    monkeypatch.setattr(os, "symlink", spy_symlink)
    monkeypatch.setattr(os, "mknod", spy_mknod)
    host.converge(OWNER, artifacts(source))
    monkeypatch.undo()
    assert unrecorded == []
    # Everything was seen being made: the check above did look.
    assert {"/opt/held", "/opt/held/deep/f39", "/opt/held/copy", "/opt/held/link",
            "/dev/held0", "/etc/held.conf"} <= set(made)
    host.discard(OWNER)
    assert snapshot(node_root) == before


def test_a_batch_journals_its_regular_files_in_one_write(
    host: Host, node_root: Path, source: Path, monkeypatch: pytest.MonkeyPatch
):
    host.converge(OWNER, [Directory("/opt/held/deep")])  # the directories already there
    writes: list[int] = []
    real_append = mokka.noderoot.manifest.Manifest._append

    def append(self, line: bytes) -> None:
        writes.append(line.count(b"\n"))
        return real_append(self, line)

    monkeypatch.setattr(mokka.noderoot.manifest.Manifest, "_append", append)
    files = [File(f"/opt/held/deep/f{i}", f"{i}\n") for i in range(40)]
    host.converge(OWNER, [Directory("/opt/held/deep"), *files])
    assert writes == [40]  # one write of 40 records, not 40 writes
    monkeypatch.undo()
    assert set(host.owned(OWNER)) >= {f.path for f in files}
    host.discard(OWNER)
    assert snapshot(node_root) == {}


def test_records_held_for_a_batch_that_fails_before_its_commit_are_not_written(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """Nothing was made for them; a discard then leaves the root as it was."""
    host.converge(OWNER, [File("/opt/held/kept", "kept\n")])

    def refuse(*args, **kwargs):
        raise OSError(28, os.strerror(28), "/nowhere")

    monkeypatch.setattr(mokka.noderoot.manifest.Manifest, "flush", refuse)
    with pytest.raises(HostFaultError, match="No space left on device"):
        host.converge(OWNER, [File("/opt/held/kept", "kept\n"), File("/opt/held/new", "n\n")])
    monkeypatch.undo()
    assert not (node_root / "opt/held/new").exists()
    assert not list((node_root / "opt/held").glob(".*"))  # no temp file either
    assert "/opt/held/new" not in host.owned(OWNER)
    assert (node_root / "opt/held/kept").read_text() == "kept\n"
    host.discard(OWNER)
    assert snapshot(node_root) == {}
