"""Other owners' bookkeeping, parsed once while unchanged (``mokka.noderoot.shared_dirs``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import mokka.noderoot.shared_dirs
from mokka.noderoot.host import File, Host
from mokka.noderoot.shared_dirs import OwnerListings
from tests.support import count_reads, journal, snapshot


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The bookkeeping files ``OwnerListings`` reads, by name."""
    return count_reads(monkeypatch, mokka.noderoot.shared_dirs)


def test_a_directory_another_owner_made_is_read_once_while_its_bookkeeping_is_unchanged(
    host: Host, node_root: Path, reads: list[str]
):
    before = snapshot(node_root)
    host.converge("a", [File("/d/a", "a\n")])
    directory = host.state.manifest_dir()
    listings = OwnerListings()
    assert listings.lists(directory, "a", "/d")
    assert listings.lists(directory, "a", "/d")
    assert not listings.lists(directory, "a", "/d/a")  # a file of a's, not a directory
    assert not listings.lists(directory, "a", "/elsewhere")
    assert reads == ["a.json"]  # the converge folded its journal into the snapshot
    host.converge("a", [File("/d/a", "a\n"), File("/e/b", "b\n")])
    assert listings.lists(directory, "a", "/e")  # a new snapshot: read again
    assert reads == ["a.json", "a.json"]
    host.discard("a")
    assert not listings.lists(directory, "a", "/d")  # no bookkeeping left at all
    assert snapshot(node_root) == before


def test_journal_records_are_followed_as_they_are_appended(host: Host, node_root: Path,
                                                            reads: list[str]):
    before = snapshot(node_root)
    host.converge("mine", [File("/x/f", "f\n")])  # makes the private manifest directory
    directory = host.state.manifest_dir()
    listings = OwnerListings()
    assert not listings.lists(directory, "other", "/j")
    journal(directory, "other", {"op": "add", "path": "/j", "kind": "dir"})
    assert listings.lists(directory, "other", "/j")
    journal(directory, "other", {"op": "remove", "path": "/j"})
    assert not listings.lists(directory, "other", "/j")
    journal(directory, "other", {"op": "add", "path": "/j", "kind": "file"})
    assert not listings.lists(directory, "other", "/j")  # the last record is a file's
    journal(directory, "other", {"op": "add", "path": "/j", "kind": "dir"})
    assert listings.lists(directory, "other", "/j")
    assert listings.lists(directory, "other", "/j")
    # One read per change of the journal; the snapshot is asked for only while
    # the journal says nothing of the path (and there is none to read).
    assert reads == ["other.journal"] * 4
    os.unlink(directory / "other.journal")
    host.discard("mine")
    assert snapshot(node_root) == before


def test_bookkeeping_that_loses_its_trust_after_it_was_read_lists_nothing(
    host: Host, node_root: Path
):
    before = snapshot(node_root)
    host.converge("a", [File("/d/a", "a\n")])
    directory = host.state.manifest_dir()
    listings = OwnerListings()
    assert listings.lists(directory, "a", "/d")
    os.chmod(directory / "a.json", 0o666)  # anyone could have written it from now on
    assert not listings.lists(directory, "a", "/d")
    os.chmod(directory / "a.json", 0o600)
    assert listings.lists(directory, "a", "/d")
    host.discard("a")
    assert snapshot(node_root) == before


@pytest.mark.parametrize(
    "content", [b'{"entries": {"/j": "dir"', b'{"entries": {"/j\xff": "dir"}}'],
    ids=["cut short", "not UTF-8"],
)
def test_a_snapshot_that_is_not_json_lists_nothing(
    host: Host, node_root: Path, content: bytes
):
    before = snapshot(node_root)
    host.converge("mine", [File("/x/f", "f\n")])
    directory = host.state.manifest_dir()
    fd = os.open(directory / "other.json", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)
    assert not OwnerListings().lists(directory, "other", "/j")
    os.unlink(directory / "other.json")
    host.discard("mine")
    assert snapshot(node_root) == before


def test_every_owners_directories_at_once_are_what_each_key_asked_gives(
    host: Host, node_root: Path
):
    """``listed`` (a removal's one reading) answers as ``lists`` does, key by key:
    journal records over the snapshot, a file's record not a directory's, the
    asking owner left out."""
    before = snapshot(node_root)
    host.converge("a", [File("/d/a", "a\n"), File("/e/a", "a\n")])  # snapshot: /d, /e
    host.converge("me", [File("/m/f", "f\n")])
    directory = host.state.manifest_dir()
    journal(directory, "a", {"op": "remove", "path": "/e"},
            {"op": "add", "path": "/j", "kind": "dir"},
            {"op": "add", "path": "/k", "kind": "dir"}, {"op": "add", "path": "/k", "kind": "file"})
    journal(directory, "b", {"op": "add", "path": "/b", "kind": "dir"},
            {"op": "add", "path": "/gone", "kind": "dir"}, {"op": "remove", "path": "/gone"})
    listings = OwnerListings()
    keys = ["/d", "/e", "/j", "/k", "/b", "/gone", "/m", "/d/a"]
    expected = {k for k in keys if any(listings.lists(directory, o, k) for o in ("a", "b"))}
    assert expected == {"/d", "/j", "/b"}
    assert listings.listed(directory, "me") == expected
    assert "/m" in listings.listed(directory, "a")  # another owner's, asked by a
    host.discard("a")
    (node_root / "e").rmdir()  # what the hand-written removal of /e stands for
    (directory / "b.journal").unlink()
    host.discard("me")
    assert snapshot(node_root) == before
