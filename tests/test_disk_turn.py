"""One converge works the filesystem at a time (``Host.disk_turn``), and lets go while it syncs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import mokka.noderoot.convergence
import mokka.noderoot.fsops
from mokka.noderoot.host import File, Host
from tests.support import snapshot

PROBE_TIMEOUT = 30.0


def taken_by_another_thread(host: Host) -> bool:
    """Whether another thread could take the disk turn right now (it gives it back at once)."""
    taken: list[bool] = []

    def probe() -> None:
        got = host.disk_turn.acquire(blocking=False)
        if got:
            host.disk_turn.release()
        taken.append(got)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join(PROBE_TIMEOUT)
    assert taken, "the probe thread never answered"
    return taken[0]


@pytest.mark.parametrize(
    ("count", "sync"),
    [(12, "sync_filesystem"), (2, "sync_file")],
    ids=["batch-syncs-the-filesystem", "small-batch-syncs-each-file"],
)
def test_a_converge_holds_the_turn_except_while_it_waits_for_the_disk(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch, count: int, sync: str
):
    before = snapshot(node_root)
    seen: dict[str, bool] = {}
    real_place = mokka.noderoot.convergence.Convergence.place
    real_sync = getattr(mokka.noderoot.fsops, sync)

    def place(self, art, norm):
        seen.setdefault("free while placing", taken_by_another_thread(host))
        return real_place(self, art, norm)

    def synced(path):
        seen.setdefault("free while syncing", taken_by_another_thread(host))
        return real_sync(path)

    monkeypatch.setattr(mokka.noderoot.convergence.Convergence, "place", place)
    monkeypatch.setattr(mokka.noderoot.fsops, sync, synced)
    host.converge("a", [File(f"/turn/f{i}", f"{i}\n") for i in range(count)])
    assert seen == {"free while placing": False, "free while syncing": True}
    # And it has the turn back for the renames: every file is in place.
    assert sorted(p.name for p in (node_root / "turn").iterdir()) == sorted(
        f"f{i}" for i in range(count)
    )
    assert taken_by_another_thread(host)  # and free again once the converge is done
    host.discard("a")
    assert snapshot(node_root) == before


def test_converges_of_two_owners_from_two_threads_never_place_at_once(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    before = snapshot(node_root)
    active = [0]
    most = [0]
    guard = threading.Lock()
    real_put = mokka.noderoot.convergence.Convergence.put

    def put(self, art, norm):
        with guard:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            return real_put(self, art, norm)
        finally:
            with guard:
                active[0] -= 1

    monkeypatch.setattr(mokka.noderoot.convergence.Convergence, "put", put)
    start = threading.Barrier(2, timeout=PROBE_TIMEOUT)
    errors: list[BaseException] = []

    def converge(owner: str) -> None:
        try:
            start.wait()
            host.converge(owner, [File(f"/shared/{owner}/f{i}", f"{i}\n") for i in range(200)])
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=converge, args=(o,)) for o in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PROBE_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a converge never finished"
    assert errors == []
    assert most[0] == 1
    for owner in ("a", "b"):
        assert len(list((node_root / "shared" / owner).iterdir())) == 200
    host.discard("a")
    host.discard("b")
    assert snapshot(node_root) == before


def test_temp_files_a_killed_process_left_are_replaced_and_removed(
    host: Host, node_root: Path
):
    """A kill between a temp file's creation and its rename leaves ``.<name>.mokka-tmp``
    beside the path: the next converge writes over it (a file's, a link's), and a
    discard removes the one beside a path it removes."""
    from mokka.noderoot.host import Symlink

    before = snapshot(node_root)
    host.converge("a", [File("/k/f", "old\n"), File("/k/g", "g\n")])
    (node_root / "k/.f.mokka-tmp").write_bytes(b"half a wri")
    (node_root / "k/.l.mokka-tmp").symlink_to("/nowhere")
    host.converge("a", [File("/k/f", "new\n"), Symlink("/k/l", "f"), File("/k/g", "g\n")])
    assert (node_root / "k/f").read_text() == "new\n"
    assert os.readlink(node_root / "k/l") == "f"
    assert sorted(p.name for p in (node_root / "k").iterdir()) == ["f", "g", "l"]
    (node_root / "k/.g.mokka-tmp").write_bytes(b"left by a kill")
    host.discard("a")
    assert snapshot(node_root) == before
