"""``mokka ctl`` once its files are recorded: the file is rewritten without the host.

The first writing call under a node root records the overrides file and
its lock through ``Host`` (two owners' manifests); every later call, until
the daemon resets the file, finds those records (``ctl_records.
already_recorded``) and only rewrites the text (``overrides.replace_text``).
These tests pin when that way is taken and when it is not, that it never
follows a link, and that cleanup still leaves the node as it was.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from mokka.ctl import command as ctl
from mokka.ctl import records as ctl_records
from mokka.daemon.command import _reset_overrides
from mokka.layout import CONFIG_DIR, MOKKA_MANIFESTS, OVERRIDES, temp_name
from mokka.noderoot.host import File, Host
from mokka.state.overrides import MANIFEST_OWNERS, load_overrides, replace_text
from tests.support import snapshot

FILE = OVERRIDES.lstrip("/")
MANIFESTS = MOKKA_MANIFESTS.lstrip("/")


@pytest.fixture
def staged(node_root: Path) -> Host:
    """A root as a simulator leaves it: the config directory, recorded by its owner."""
    host = Host(node_root)
    host.converge("gpudriver-config", [File(CONFIG_DIR + "/config.yaml", b"format: 1\n")])
    return host


@pytest.fixture
def converges(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The owners ``Host.converge`` is called for from now on, in order."""
    seen: list[str] = []
    real = Host.converge

    def counted(self: Host, owner: str, *args, **kwargs):
        seen.append(owner)
        return real(self, owner, *args, **kwargs)

    monkeypatch.setattr(Host, "converge", counted)
    return seen


def temp_of(root: Path) -> Path:
    return Path(temp_name(str(root / FILE)))


def celsius(root: Path, gpu: str = "0") -> int:
    found = load_overrides(root / FILE)
    assert found is not None
    return found.to_mapping()["devices"][gpu]["thermal"]["temperature_gpu_c"]


def test_the_first_call_records_and_later_calls_only_rewrite(staged: Host, converges) -> None:
    root = staged.root
    before = snapshot(root)
    assert not ctl_records.already_recorded(root)
    assert ctl.main(["temp", "--root", str(root), "--gpu", "0", "--celsius", "61"]) == 0
    assert converges == [MANIFEST_OWNERS[1], MANIFEST_OWNERS[0]]
    assert ctl_records.already_recorded(root)
    for value in (62, 63):
        assert ctl.main(["temp", "--root", str(root), "--gpu", "0", "--celsius", str(value)]) == 0
    assert converges == [MANIFEST_OWNERS[1], MANIFEST_OWNERS[0]]  # no converge since
    assert celsius(root) == 63
    assert stat.S_IMODE(os.stat(root / FILE).st_mode) == 0o644
    assert not temp_of(root).exists()
    # the daemon's reset (at start and stop) takes the file, its lock and the records
    _reset_overrides(root / FILE, staged)
    assert snapshot(root) == before
    assert not ctl_records.already_recorded(root)
    staged.discard("gpudriver-config")
    assert os.listdir(root) == []


def test_cleanup_after_rewrites_removes_the_file_and_a_killed_calls_temp_file(
    staged: Host,
) -> None:
    root = staged.root
    before = snapshot(root)
    for value in (50, 51):
        assert ctl.main(["temp", "--root", str(root), "--gpu", "1", "--celsius", str(value)]) == 0
    temp_of(root).write_text("half a file")  # what a call killed before its rename leaves
    host = Host(root)
    for owner in MANIFEST_OWNERS:
        host.discard(owner)
    assert snapshot(root) == before
    staged.discard("gpudriver-config")
    assert os.listdir(root) == []


def test_a_killed_calls_temp_file_is_replaced_not_followed(staged: Host, tmp_path: Path) -> None:
    root = staged.root
    before = snapshot(root)
    assert ctl.main(["temp", "--root", str(root), "--gpu", "0", "--celsius", "40"]) == 0
    outside = tmp_path / "outside"
    outside.write_text("not Mokka's\n")
    temp_of(root).symlink_to(outside)
    assert ctl.main(["temp", "--root", str(root), "--gpu", "0", "--celsius", "41"]) == 0
    assert outside.read_text() == "not Mokka's\n"
    assert celsius(root) == 41
    assert not os.path.lexists(temp_of(root))
    _reset_overrides(root / FILE, staged)
    assert snapshot(root) == before


def test_a_link_on_the_way_to_the_file_is_refused(staged: Host, tmp_path: Path) -> None:
    root = staged.root
    path = root / FILE
    assert ctl.main(["temp", "--root", str(root), "--gpu", "0", "--celsius", "40"]) == 0
    assert ctl_records.already_recorded(root)
    # the config directory swapped for a link to one outside the root
    elsewhere = tmp_path / "elsewhere"
    config = root / CONFIG_DIR.lstrip("/")
    config.rename(elsewhere)
    config.symlink_to(elsewhere)
    with pytest.raises(OSError, match="is a symbolic link") as caught:
        replace_text(path, "{}\n", root=root)
    assert caught.value.filename == str(path)
    assert not os.path.lexists(elsewhere / temp_of(root).name)


def _journal(root: Path) -> None:
    (root / MANIFESTS / f"{MANIFEST_OWNERS[0]}.journal").write_bytes(b"")
    os.chmod(root / MANIFESTS / f"{MANIFEST_OWNERS[0]}.journal", 0o600)


def _extra_entry(root: Path) -> None:
    snap = root / MANIFESTS / f"{MANIFEST_OWNERS[1]}.json"
    data = json.loads(snap.read_text())
    data["entries"]["/etc/other"] = "file"
    snap.write_text(json.dumps(data))


def _not_json(root: Path) -> None:
    (root / MANIFESTS / f"{MANIFEST_OWNERS[0]}.json").write_bytes(b"\xff not json")


def _writable_by_others(root: Path) -> None:
    os.chmod(root / MANIFESTS / f"{MANIFEST_OWNERS[0]}.json", 0o666)


def _manifests_open_to_all(root: Path) -> None:
    os.chmod(root / MANIFESTS, 0o777)


def _snapshot_gone(root: Path) -> None:
    os.unlink(root / MANIFESTS / f"{MANIFEST_OWNERS[1]}.json")


@pytest.mark.parametrize("damage", [_journal, _extra_entry, _not_json, _writable_by_others,
                                    _manifests_open_to_all, _snapshot_gone])
def test_anything_but_the_plain_records_takes_the_hosts_way(
    staged: Host, converges, damage
) -> None:
    root = staged.root
    assert ctl.main(["temp", "--root", str(root), "--gpu", "0", "--celsius", "45"]) == 0
    assert ctl_records.already_recorded(root)
    damage(root)
    assert not ctl_records.already_recorded(root)
    converges.clear()
    code = ctl.main(["temp", "--root", str(root), "--gpu", "0", "--celsius", "46"])
    # the host's way ran: it repairs what it can and refuses what it must not trust
    # (an untrusted manifests directory stops the first converge, the lock's)
    assert converges == [MANIFEST_OWNERS[1]] if damage is _manifests_open_to_all else [
        MANIFEST_OWNERS[1], MANIFEST_OWNERS[0]]
    if damage in (_not_json, _writable_by_others, _manifests_open_to_all):
        assert code == 1
        assert celsius(root) == 45  # nothing written on the word of untrusted records
    else:
        assert code == 0
        assert celsius(root) == 46


def test_manifests_reached_through_a_link_take_the_hosts_way(staged: Host, tmp_path) -> None:
    root = staged.root
    assert ctl.main(["temp", "--root", str(root), "--gpu", "0", "--celsius", "45"]) == 0
    state = root / MANIFESTS
    moved = root / "var" / "lib" / "moved-manifests"
    state.rename(moved)
    state.symlink_to(moved)
    assert not ctl_records.already_recorded(root)
