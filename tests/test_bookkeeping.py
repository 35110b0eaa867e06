"""Mokka's bookkeeping (manifests, journals, backups): private, checked, and never forged.

The daemon usually runs as root and acts on what its bookkeeping says: a
journal line makes teardown delete a path, a backup makes it create a file
with a recorded mode.  So the bookkeeping is created 0700/0600 whatever the
umask, and anything in it someone else could have written is refused, with
one error naming the file and why, before any of it is acted on.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from mokka.errors import HostPathError, UntrustedBookkeepingError
from mokka.layout import CONFIG_DIR
from mokka.noderoot import backups
from mokka.noderoot.host import STATE_DIR, Directory, File, Host, Symlink
from mokka.noderoot.manifest import Manifest
from mokka.state import overrides
from tests.support import snapshot

#: A uid that is neither root nor the test's: "someone else" (nobody).
OTHER_UID = 65534


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    state = root / STATE_DIR.lstrip("/")
    return {
        str(p.relative_to(state)): stat.S_IMODE(p.lstat().st_mode)
        for p in [state, *state.rglob("*")]
    }


def test_bookkeeping_is_private_whatever_the_umask(umask_000, host: Host, node_root: Path):
    (node_root / "etc").mkdir(mode=0o755)
    (node_root / "etc/hosts").write_text("127.0.0.1 localhost\n")
    host.converge("t", [File("/etc/hosts", "replaced\n"), Directory("/opt/x")])
    # A journal (the converge in flight) and a half-written snapshot exist only
    # mid-converge: make both the way a killed process leaves them.
    manifest = Manifest.load("t", host._manifest_dir())
    manifest.note("add", "/opt/y", "dir")
    manifest.close()
    modes = _modes(node_root)
    assert {k: v for k, v in modes.items() if v not in (0o700, 0o600)} == {}
    dirs = {k for k, v in modes.items() if v == 0o700}
    assert dirs == {".", "manifests", "backups", "backups/t"}
    assert {"manifests/t.json", "manifests/t.journal"} <= set(modes)
    marker = node_root / ".mokka-created-parents.json"
    assert stat.S_IMODE(marker.stat().st_mode) == 0o600
    # The node directories it made are the node's ordinary 0755, not the umask's 0777.
    assert stat.S_IMODE((node_root / "var").stat().st_mode) == 0o755
    assert stat.S_IMODE((node_root / "opt").stat().st_mode) == 0o755


def test_a_setuid_file_is_not_copied_setuid_into_the_backups(host: Host, node_root: Path):
    (node_root / "usr/bin").mkdir(parents=True)
    tool = node_root / "usr/bin/tool"
    tool.write_text("#!/bin/sh\n")
    os.chown(tool, OTHER_UID, OTHER_UID)
    os.chmod(tool, 0o4755)
    before = snapshot(node_root)
    host.converge("t", [File("/usr/bin/tool", "ours\n", mode=0o755)])
    backups = node_root / STATE_DIR.lstrip("/") / "backups/t"
    assert {stat.S_IMODE(p.stat().st_mode) for p in backups.iterdir()} == {0o600}
    host.discard("t")
    # Back as it was: setuid, and its original owner's (so setuid to that user, not to root).
    assert snapshot(node_root) == before
    assert (tool.stat().st_uid, stat.S_IMODE(tool.stat().st_mode)) == (OTHER_UID, 0o4755)


# ---- forged bookkeeping is refused, and nothing in it acted on ---------------------


def _plant_forgery(host: Host, node_root: Path) -> Path:
    """What an unprivileged user plants: a journal that deletes /etc/hosts and
    a backup that brings back a setuid shell, in a manifest directory of theirs."""
    (node_root / "etc").mkdir()
    (node_root / "etc/hosts").write_text("127.0.0.1 localhost\n")
    state = node_root / STATE_DIR.lstrip("/")
    manifests = state / "manifests"
    backups = state / "backups/evil"
    manifests.mkdir(parents=True, mode=0o700)
    backups.mkdir(parents=True, mode=0o700)
    name = "0" * 32
    (manifests / "evil.journal").write_text(
        json.dumps({"op": "add", "path": "/etc/hosts", "kind": "file"}) + "\n"
        + json.dumps({"op": "add", "path": "/bin/sh-root", "kind": "file", "backup": name}) + "\n"
    )
    (backups / name).write_text("#!/bin/sh\n")
    (backups / (name + ".mode")).write_text("0o4755")
    for path in (manifests / "evil.journal", backups / name, backups / (name + ".mode")):
        os.chmod(path, 0o600)
    return manifests / "evil.journal"


def _nothing_acted_on(node_root: Path) -> None:
    assert (node_root / "etc/hosts").read_text() == "127.0.0.1 localhost\n"
    assert not (node_root / "bin").exists()


def test_a_journal_owned_by_someone_else_is_refused(host: Host, node_root: Path):
    journal = _plant_forgery(host, node_root)
    os.chown(journal, OTHER_UID, OTHER_UID)
    with pytest.raises(UntrustedBookkeepingError) as caught:
        host.discard("evil")
    assert str(caught.value).startswith(f"{journal}: Mokka bookkeeping owned by uid {OTHER_UID}")
    assert "nothing in it is acted on" in str(caught.value)
    _nothing_acted_on(node_root)


def test_a_group_writable_journal_is_refused(host: Host, node_root: Path):
    journal = _plant_forgery(host, node_root)
    os.chmod(journal, 0o620)
    with pytest.raises(UntrustedBookkeepingError, match=r"has mode 0620, writable by group"):
        host.discard("evil")
    _nothing_acted_on(node_root)


def test_a_manifest_directory_someone_else_owns_is_refused(host: Host, node_root: Path):
    journal = _plant_forgery(host, node_root)
    os.chown(journal.parent, OTHER_UID, OTHER_UID)
    with pytest.raises(UntrustedBookkeepingError, match=r"manifests: Mokka bookkeeping owned"):
        host.discard_all()
    _nothing_acted_on(node_root)


def test_a_world_writable_state_directory_is_refused_before_anything_is_written(
    host: Host, node_root: Path
):
    """A state directory made 0777 (an older release under umask 000) is not
    trusted any more: staging refuses instead of writing into it."""
    state = node_root / STATE_DIR.lstrip("/")
    state.mkdir(parents=True)
    os.chmod(state, 0o777)
    before = snapshot(node_root)
    with pytest.raises(UntrustedBookkeepingError, match=r"mokka: Mokka bookkeeping has mode 0777"):
        host.converge("t", [File("/opt/a", "a")])
    assert snapshot(node_root) == before


def test_a_symlink_planted_as_the_journal_is_refused(host: Host, node_root: Path, tmp_path: Path):
    outside = tmp_path / "outside.journal"
    outside.write_text(json.dumps({"op": "add", "path": "/etc/hosts", "kind": "file"}) + "\n")
    journal = _plant_forgery(host, node_root)
    journal.unlink()
    journal.symlink_to(outside)
    with pytest.raises(UntrustedBookkeepingError, match=r"evil.journal: Mokka bookkeeping is not"):
        host.discard("evil")
    _nothing_acted_on(node_root)


def test_a_backup_someone_else_owns_is_not_restored(host: Host, node_root: Path):
    """Even in a manifest of ours: a backup file of theirs would pick the content."""
    (node_root / "etc").mkdir()
    (node_root / "etc/motd").write_text("welcome\n")
    host.converge("t", [File("/etc/motd", "ours\n")])
    backups = node_root / STATE_DIR.lstrip("/") / "backups/t"
    (saved,) = [p for p in backups.iterdir() if not p.name.endswith(".mode")]
    os.chown(saved, OTHER_UID, OTHER_UID)
    with pytest.raises(HostPathError, match=rf"/etc/motd \({saved}: Mokka bookkeeping owned"):
        host.discard("t")
    # Refused before anything was removed: our file stays, recorded, for a later try.
    assert (node_root / "etc/motd").read_text() == "ours\n"
    assert host.owned("t") == {"/etc/motd": "file"}


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ({"op": "add", "path": "/../etc/passwd", "kind": "file"}, "is not a node path"),
        ({"op": "add", "path": "etc/hosts", "kind": "file"}, "is not a node path"),
        ({"op": "add", "path": "/etc//hosts", "kind": "file"}, "is not a node path"),
        (
            {"op": "add", "path": f"{STATE_DIR}/manifests/other.json", "kind": "file"},
            "lies in Mokka's own bookkeeping",
        ),
        ({"op": "add", "path": "/etc/hosts", "kind": "hardlink"}, "kind 'hardlink'"),
        ({"op": "add", "path": "/etc/hosts", "kind": "file", "backup": "../x"}, "backup '../x'"),
        ({"op": "chmod", "path": "/etc/hosts"}, "expected a record with op 'add' or 'remove'"),
    ],
)
def test_a_record_the_daemon_could_not_have_written_refuses_the_whole_journal(
    host: Host, node_root: Path, record: dict, problem: str
):
    journal = _plant_forgery(host, node_root)
    with journal.open("a") as f:
        f.write(json.dumps(record) + "\n")
    with pytest.raises(UntrustedBookkeepingError) as caught:
        host.discard("evil")
    assert str(caught.value).startswith(f"{journal}: line 3: ")
    assert problem in str(caught.value)
    # The well-formed records before it were not acted on either.
    _nothing_acted_on(node_root)


def test_a_damaged_snapshot_is_refused_naming_the_entry(host: Host, node_root: Path):
    host.converge("t", [File("/opt/a", "a")])
    snapshot_path = host._manifest_dir() / "t.json"
    data = json.loads(snapshot_path.read_text())
    data["entries"]["/opt/../etc"] = "dir"
    snapshot_path.write_text(json.dumps(data))
    with pytest.raises(
        UntrustedBookkeepingError, match=r"t.json: entries\['/opt/../etc'\]: path .* not a node"
    ):
        host.discard("t")
    assert (node_root / "opt/a").read_text() == "a"


def test_another_owners_forged_journal_does_not_make_a_directory_shared(
    host: Host, node_root: Path
):
    """A planted journal claiming a user's directory must not make an owner
    take it for a shared one and remove it once empty."""
    (node_root / "srv").mkdir()
    journal = _plant_forgery(host, node_root)
    journal.write_text(json.dumps({"op": "add", "path": "/srv", "kind": "dir"}) + "\n")
    os.chown(journal, OTHER_UID, OTHER_UID)
    host.converge("t", [File("/srv/a", "a")])
    assert host.owned("t") == {"/srv/a": "file"}
    host.discard("t")
    assert (node_root / "srv").is_dir()


# ---- temp files -------------------------------------------------------------------


def test_a_half_written_snapshot_is_removed_by_the_owners_discard(host: Host, node_root: Path):
    before = snapshot(node_root)
    host.converge("t", [File("/opt/a", "a")])
    tmp = host._manifest_dir() / "t.json.tmp"
    tmp.write_text('{"entries": {"/opt/a"')  # a kill mid-compaction
    host.discard("t")
    assert snapshot(node_root) == before


def test_cleanup_finds_an_owner_that_left_only_a_temp_snapshot(host: Host, node_root: Path):
    before = snapshot(node_root)
    host.converge("keep", [File("/opt/a", "a")])
    tmp = host._manifest_dir() / "gone.json.tmp"
    tmp.write_text("{")
    os.chmod(tmp, 0o600)
    report = host.discard_all()
    assert report.removed == ("/opt/a", "/opt")
    assert snapshot(node_root) == before


def test_cleanup_names_bookkeeping_it_could_not_remove(host: Host, node_root: Path):
    """A stray file in the manifest directory nobody's discard claims: named, not ignored."""
    host.converge("t", [Symlink("/opt/link", "target")])
    stray = host._manifest_dir() / "notes.txt"
    stray.write_text("x")
    left = rf"left under the root: {STATE_DIR}/manifests/notes.txt"
    with pytest.raises(HostPathError, match=left):
        host.discard_all()
    assert not (node_root / "opt").exists()


def test_a_state_directory_of_an_earlier_release_is_removed_with_its_parents(node_root: Path):
    """Earlier releases kept the record of the parents they made inside the
    state directory (and made it 0755): the last discard still removes all."""
    state = node_root / STATE_DIR.lstrip("/")
    (state / "manifests").mkdir(parents=True)
    os.chmod(state, 0o755)
    (state / "created-parents.json").write_text(json.dumps(["/var", "/var/lib"]))
    os.chmod(state / "created-parents.json", 0o644)
    host = Host(node_root)
    host.converge("t", [File("/opt/a", "a")])
    host.discard("t")
    assert os.listdir(node_root) == []


@pytest.mark.parametrize("content", [b'["/var", "/var/lib"', b'["/var\xff", "/var/lib"]'],
                         ids=["cut short", "not UTF-8"])
def test_a_damaged_record_of_the_state_directorys_parents_is_refused_naming_it(
    host: Host, node_root: Path, content: bytes
):
    """Nothing in it is acted on (no directory removed on its word), and the error names it."""
    host.converge("t", [File("/opt/x", "x\n")])
    marker = node_root / ".mokka-created-parents.json"
    good = marker.read_bytes()
    marker.write_bytes(content)  # still 0600 and ours: only the content is wrong
    with pytest.raises(UntrustedBookkeepingError, match=r"created-parents\.json: expected a list"):
        host.discard("t")
    assert (node_root / "var/lib").is_dir()
    marker.write_bytes(good)
    host.discard("t")
    assert snapshot(node_root) == {}


# ---- a restore cut short by a kill ---------------------------------------------------

CDI_SPEC = "/var/run/cdi/nvidia.yaml"


def _users_spec_replaced(host: Host, node_root: Path) -> tuple[dict, Path]:
    """The user's own CDI spec, replaced by a converge (so backed up); the root before."""
    spec = node_root / CDI_SPEC.lstrip("/")
    spec.parent.mkdir(parents=True)
    spec.write_text("the user's own spec\n")
    before = snapshot(node_root)
    host.converge("cri-cdi", [File(CDI_SPEC, "mokka's spec\n")])
    return before, spec


def _restored_by_hand(host: Host, node_root: Path, spec: Path) -> None:
    """What a kill after an earlier release's restore left: the backup moved back over
    the path (its ``.mode`` record stays), the manifest still naming it."""
    backups = node_root / STATE_DIR.lstrip("/") / "backups/cri-cdi"
    (saved,) = [p for p in backups.iterdir() if not p.name.endswith(".mode")]
    os.replace(saved, spec)
    spec.chmod(0o644)  # as that restore had made it
    assert CDI_SPEC in host.owned("cri-cdi")


def test_a_restore_a_kill_cut_short_is_finished_by_cleanup(host: Host, node_root: Path):
    before, spec = _users_spec_replaced(host, node_root)
    _restored_by_hand(host, node_root, spec)
    Host(node_root).discard_all()
    assert snapshot(node_root) == before


def test_a_converge_after_that_kill_backs_the_users_file_up_again(host: Host, node_root: Path):
    """The next daemon start must not write over the user's file with no copy of it."""
    before, spec = _users_spec_replaced(host, node_root)
    _restored_by_hand(host, node_root, spec)
    again = Host(node_root)
    again.converge("cri-cdi", [File(CDI_SPEC, "mokka's spec, again\n")])
    assert spec.read_text() == "mokka's spec, again\n"
    again.discard_all()
    assert spec.read_text() == "the user's own spec\n"
    assert snapshot(node_root) == before


def test_a_backup_goes_only_once_the_manifest_forgot_its_path(
    host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """A kill between the restore and the backup's removal (here: the removal fails)
    leaves nothing cleanup cannot finish, and the user's file in place."""
    before, spec = _users_spec_replaced(host, node_root)

    def killed(saved):
        raise SystemExit("killed")

    monkeypatch.setattr(backups, "drop", killed)
    with pytest.raises(SystemExit):
        host.discard("cri-cdi")
    monkeypatch.undo()
    assert spec.read_text() == "the user's own spec\n"
    assert CDI_SPEC not in Host(node_root).owned("cri-cdi")
    Host(node_root).discard_all()
    assert snapshot(node_root) == before


def test_a_backup_no_manifest_names_is_swept_by_cleanup(host: Host, node_root: Path):
    """A kill between a backup and its journal record: the file was never replaced."""
    before, spec = _users_spec_replaced(host, node_root)
    store = node_root / STATE_DIR.lstrip("/") / "backups"
    backups.save("/etc/never-replaced", spec, os.lstat(spec), store, "cri-cdi")
    host.discard_all()
    assert snapshot(node_root) == before


def test_a_link_planted_as_the_backups_directory_is_refused_never_followed(
    node_root: Path, tmp_path: Path
):
    outside = tmp_path / "outside"
    outside.mkdir()
    state = node_root / STATE_DIR.lstrip("/")
    state.mkdir(parents=True, mode=0o700)
    (state / "backups").symlink_to(outside)
    (node_root / "etc").mkdir()
    (node_root / "etc/motd").write_text("welcome\n")
    host = Host(node_root)
    with pytest.raises(UntrustedBookkeepingError, match=r"backups: Mokka bookkeeping is not a dir"):
        host.converge("t", [File("/etc/motd", "ours\n")])
    assert (node_root / "etc/motd").read_text() == "welcome\n"
    with pytest.raises(HostPathError, match=rf"^left under the root: {STATE_DIR}/backups$"):
        host.discard_all()
    assert os.listdir(outside) == []
    assert (state / "backups").is_symlink()


# ---- the runtime overrides' reset ------------------------------------------------------


def _config_dir(node_root: Path) -> Path:
    config = node_root / CONFIG_DIR.lstrip("/")
    config.mkdir(parents=True)
    return config


def test_a_reset_killed_half_way_leaves_no_lock_file_it_never_recorded(
    node_root: Path, monkeypatch: pytest.MonkeyPatch
):
    config = _config_dir(node_root)
    (config / "overrides.yaml").write_text("version: 1\n")

    def killed(path, root):
        raise SystemExit("killed")

    monkeypatch.setattr(overrides, "_unlink_beneath", killed)
    with pytest.raises(SystemExit):
        overrides.reset_file(config / "overrides.yaml", root=node_root)
    assert sorted(os.listdir(config)) == ["overrides.yaml"]


def test_a_link_planted_at_the_overrides_lock_is_the_users_and_stays(node_root: Path):
    config = _config_dir(node_root)
    lock = config / "overrides.yaml.lock"
    lock.symlink_to("/elsewhere/lock")
    (config / "overrides.yaml").write_text("version: 1\n")
    assert overrides.reset_file(config / "overrides.yaml", root=node_root) is True
    assert os.listdir(config) == ["overrides.yaml.lock"]
    assert os.readlink(lock) == "/elsewhere/lock"


@pytest.mark.timeout(20)
def test_a_lock_replaced_each_time_it_is_locked_fails_instead_of_spinning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """What a writer sees while someone keeps swapping the lock file: an error naming it."""
    path = tmp_path / "overrides.yaml"
    swapped = iter(range(1, 1 << 30))

    def another_inode(lpath, root):
        st = os.lstat(lpath)
        return os.stat_result((st.st_mode, st.st_ino + next(swapped), *tuple(st)[2:]))

    monkeypatch.setattr(overrides, "_lstat_beneath", another_inode)
    replaced = r"^\[Errno 11\] replaced each time it was locked .*overrides.yaml.lock"
    with pytest.raises(OSError, match=replaced), overrides.locked(path):
        pass
