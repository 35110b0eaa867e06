"""An owner's manifest snapshot, folded once while unchanged (``mokka.noderoot.filememo``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import mokka.noderoot.manifest
from mokka.errors import UntrustedBookkeepingError
from mokka.noderoot.filememo import MISSING, FileMemo, file_signature
from mokka.noderoot.host import File, Host
from tests.support import count_reads, journal, snapshot


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The bookkeeping files ``Manifest.load`` reads, by name."""
    return count_reads(monkeypatch, mokka.noderoot.manifest)


def test_a_kept_value_answers_only_for_the_signature_it_was_kept_under(tmp_path: Path):
    path = tmp_path / "f"
    path.write_text("one")
    memo = FileMemo()
    before = file_signature(str(path))
    memo.keep(str(path), before, "parsed one")
    assert memo.get(str(path), file_signature(str(path))) == "parsed one"
    path.write_text("two")
    assert memo.get(str(path), file_signature(str(path))) is MISSING
    os.unlink(path)
    assert file_signature(str(path)) is None
    assert memo.get(str(path), None) is MISSING
    memo.keep(str(path), None, "ignored")
    assert memo.get(str(path), before) is MISSING  # keeping under None forgets


def test_a_converge_reads_its_snapshot_only_after_the_file_changed(
    host: Host, node_root: Path, reads: list[str]
):
    before = snapshot(node_root)
    host.converge("a", [File("/d/a", "a\n")])
    reads.clear()
    # The snapshot the first converge wrote is the one it keeps: not read again.
    host.converge("a", [File("/d/a", "a\n"), File("/d/b", "b\n")])
    host.converge("a", [File("/d/b", "b\n")])
    assert "a.json" not in reads
    assert host.owned("a") == {"/d": "dir", "/d/b": "file"}
    # Changed behind the daemon's back (a rename over it): read, and what it says acted on.
    path = host.state.manifest_dir() / "a.json"
    data = json.loads(path.read_text())
    data["entries"]["/d/c"] = "file"
    (node_root / "d" / "c").write_text("c\n")
    tmp = path.with_name("other.tmp")
    tmp.write_text(json.dumps(data))
    tmp.chmod(0o600)
    os.replace(tmp, path)
    host.converge("a", [File("/d/b", "b\n")])
    assert reads.count("a.json") == 1
    assert not (node_root / "d" / "c").exists()  # recorded as ours, no longer wanted
    host.discard("a")
    assert snapshot(node_root) == before


def test_a_kept_snapshot_made_untrustworthy_is_refused(host: Host, node_root: Path):
    before = snapshot(node_root)
    host.converge("a", [File("/d/a", "a\n")])
    path = host.state.manifest_dir() / "a.json"
    path.chmod(0o666)  # the content is the same; the trust in it is not
    with pytest.raises(UntrustedBookkeepingError, match=r"a\.json"):
        host.converge("a", [File("/d/a", "a\n"), File("/d/b", "b\n")])
    path.chmod(0o600)
    host.discard("a")
    assert snapshot(node_root) == before


def test_a_converge_killed_after_its_journal_is_folded_in_on_top_of_the_kept_snapshot(
    host: Host, node_root: Path
):
    before = snapshot(node_root)
    host.converge("a", [File("/d/a", "a\n")])
    # What a process killed mid-converge leaves: journal lines beside the snapshot.
    journal(host.state.manifest_dir(), "a", {"op": "add", "path": "/d/x", "kind": "file"})
    (node_root / "d" / "x").write_text("x\n")
    assert host.owned("a") == {"/d": "dir", "/d/a": "file", "/d/x": "file"}
    host.converge("a", [File("/d/a", "a\n")])
    assert not (node_root / "d" / "x").exists()
    host.discard("a")
    assert snapshot(node_root) == before
