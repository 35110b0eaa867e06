"""The overrides file: strict parsing, merge layers, atomic locked writes, reset."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from mokka.errors import MokkaError, SpecError
from mokka.state.override_doc import Overrides, parse_overrides
from mokka.state.overrides import load_overrides, lock_path, reset_file, update_overrides

EXAMPLE = """\
version: 1
all: {thermal: {temperature_gpu_c: 70}}
devices:
  "0": {failure: {mode: ecc_uncorrectable, after_calls: 1, xid: {code: 79}}}
  GPU-ABCDEF01-0000-0000-0000-000000000000: {utilization: {gpu: 90}}
"""


def problems_of(doc: Any) -> tuple[str, ...]:
    with pytest.raises(SpecError) as info:
        Overrides.from_mapping(doc, source="overrides.yaml")
    return info.value.problems


def test_documented_example_parses() -> None:
    ovr = parse_overrides(EXAMPLE, source="overrides.yaml")
    assert ovr.all == {"thermal": {"temperature_gpu_c": 70}}
    assert set(ovr.devices) == {"0", "GPU-abcdef01-0000-0000-0000-000000000000"}
    layers = ovr.layers_for(0, "GPU-abcdef01-0000-0000-0000-000000000000")
    assert [label for label, _ in layers] == [
        "all", "devices.0", "devices.GPU-abcdef01-0000-0000-0000-000000000000"]
    assert [label for label, _ in ovr.layers_for(1, "GPU-ffffffff-0000-0000-0000-000000000000")
            ] == ["all"]


def test_integer_device_keys_are_indices() -> None:
    ovr = Overrides.from_mapping({"version": 1, "devices": {3: {"performance_state": "P8"}}},
                                 source="o.yaml")
    assert ovr.devices == {"3": {"performance_state": "P8"}}


def test_empty_document_is_empty_overrides() -> None:
    assert parse_overrides("", source="o.yaml").empty
    assert parse_overrides("version: 1\n", source="o.yaml").empty


@pytest.mark.parametrize("field", [
    "name", "architecture", "brand", "compute_capability", "uuid", "pci", "bar1_memory"])
def test_identity_fields_are_not_hot_reloadable(field: str) -> None:
    assert problems_of({"version": 1, "devices": {"2": {field: {"x": 1}}}}) == (
        f"overrides.yaml: devices.2.{field}: not hot-reloadable (consumers cache it when the "
        "GPU appears), change the profile instead",)


RULES = [
    ({"all": {}}, "overrides.yaml: version: missing, expected 1"),
    ({"version": 2}, "overrides.yaml: version: 2 is not supported, expected 1"),
    ({"version": 1, "gpus": {}},
     "overrides.yaml: gpus: unknown key, expected one of: all, devices, version"),
    ({"version": 1, "devices": {"first": {}}},
     "overrides.yaml: devices.first: 'first' is not a GPU index or a GPU UUID "
     "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"),
    ({"version": 1, "devices": {"0": {"thermal": {"temp": 1}}}},
     "overrides.yaml: devices.0.thermal.temp: unknown key, expected one of: "
     "max_memory_operating_c, max_operating_c, shutdown_threshold_c, slowdown_threshold_c, "
     "target_temperature_c, temperature_gpu_c, temperature_memory_c, tlimit_c"),
    ({"version": 1, "all": {"utilization": {"gpu": 101}}},
     "overrides.yaml: all.utilization.gpu: 101 is out of range, expected 0..100"),
    ({"version": 1, "all": {"performance_state": "P16"}},
     "overrides.yaml: all.performance_state: 'P16' is not a performance state, expected P0..P15"),
    ({"version": 1, "all": {"failure": {"mode": "on_fire"}}},
     "overrides.yaml: all.failure.mode: 'on_fire' is not one of: healthy, lost, fallen_off_bus, "
     "ecc_uncorrectable"),
    ({"version": 1, "all": {"failure": {"mode": "lost", "after_calls": -1}}},
     "overrides.yaml: all.failure.after_calls: -1 is out of range, "
     "expected 0..18446744073709551615"),
    ({"version": 1, "all": {"xids": [{"code": 79, "when": "now"}]}},
     "overrides.yaml: all.xids[0].when: unknown key, expected one of: code, id"),
    ({"version": 1, "all": {"nvlink_errors": {"18": 1}}},
     "overrides.yaml: all.nvlink_errors.18: '18' is not a link number 0..17"),
    ({"version": 1, "all": {"fabric": {"health": {"summary": "healthy", "speed": 1}}}},
     "overrides.yaml: all.fabric.health.speed: unknown key, expected one of: "
     "access_timeout_recovery, bandwidth, incorrect_configuration, route_recovery_in_progress, "
     "route_unhealthy, summary"),
    ({"version": 1, "all": {"clocks_throttle_reasons": {"gpu_idle": "yes"}}},
     "overrides.yaml: all.clocks_throttle_reasons.gpu_idle: 'yes' is not true or false"),
    # ``"²".isdigit()`` holds but ``int("²")`` raises: a key, not a crash
    ({"version": 1, "devices": {"\u00b2": {}}},
     "overrides.yaml: devices.\u00b2: '\u00b2' is not a GPU index or a GPU UUID "
     "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"),
    ({"version": 1, "devices": {"9" * 5000: {}}},
     # the key is quoted in the field path cut short too: a message never carries a payload
     f"overrides.yaml: devices.{'9' * 57}...: '{'9' * 56}... is not a GPU index or a GPU UUID "
     "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"),
    ({"version": 1, "all": {"nvlink_errors": {"\u00b2": 1}}},
     "overrides.yaml: all.nvlink_errors.\u00b2: '\u00b2' is not a link number 0..17"),
    ({"version": 1, "devices": {"GPU-abcdef01-0000-0000-0000-000000000000\n": {}}},
     "overrides.yaml: devices.GPU-abcdef01-0000-0000-0000-000000000000\n: "
     "'GPU-abcdef01-0000-0000-0000-000000000000\\n' is not a GPU index or a GPU UUID "
     "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"),
    # The PCI tree's rules, checked where the file is read (``mokka ctl set`` included):
    # a gen 9 used to pass here and fail the PCI stage, blaming the profile.
    ({"version": 1, "devices": {"0": {"pcie": {"max_link_gen": 9}}}},
     "overrides.yaml: devices.0.pcie.max_link_gen: found 9, expected an integer 1..6"),
    ({"version": 1, "all": {"pcie": {"current_link_width": 3}}},
     "overrides.yaml: all.pcie.current_link_width: found 3, expected one of 1, 2, 4, 8, 12, 16, "
     "32"),
    ({"version": 1, "all": {"persistence_mode": "Enabled\r"}},
     "overrides.yaml: all.persistence_mode: 'Enabled\\r' holds a control character (a line "
     "break, tab, escape...), expected text on one line"),
    # the library's words: a typo would be ignored there, not reported
    ({"version": 1, "all": {"fabric": {"health": {"summary": "ok"}}}},
     "overrides.yaml: all.fabric.health.summary: 'ok' is not one of: healthy, unhealthy, "
     "limited_capacity, n/a"),
    ({"version": 1, "all": {"fabric": {"health": {"route_unhealthy": 1}}}},
     "overrides.yaml: all.fabric.health.route_unhealthy: 1 is not one of: true, false, n/a"),
    ({"version": 1, "all": {"fabric": {"clique_id": 2**32}}},
     "overrides.yaml: all.fabric.clique_id: 4294967296 is out of range, expected 0..4294967295"),
    ({"version": 1, "all": {"memory": {"total_bytes": 2**64}}},
     "overrides.yaml: all.memory.total_bytes: 18446744073709551616 is out of range, expected "
     "0..18446744073709551615"),
    ({"version": 1, "all": {"failure": {"probability": float("nan")}}},
     "overrides.yaml: all.failure.probability: nan is not a number"),
]


@pytest.mark.parametrize(("doc", "message"), RULES, ids=[r[1][16:60] for r in RULES])
def test_validation_rule_message(doc: dict, message: str) -> None:
    assert problems_of(doc) == (message,)


def test_every_problem_is_reported_at_once() -> None:
    problems = problems_of({"version": 1, "all": {"name": "x", "thermal": {"bogus": 1}},
                            "devices": {"0": {"utilization": {"gpu": -1}}}})
    assert len(problems) == 3


def test_update_writes_atomically_with_mode_0644(tmp_path: Path) -> None:
    path = tmp_path / "overrides.yaml"
    old_umask = os.umask(0o077)
    try:
        update_overrides(path, lambda doc: doc.setdefault("all", {}).update(
            {"thermal": {"temperature_gpu_c": 81}}))
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["overrides.yaml", "overrides.yaml.lock"]
    loaded = load_overrides(path)
    assert loaded is not None
    assert loaded.all == {"thermal": {"temperature_gpu_c": 81}}
    inode = path.stat().st_ino
    update_overrides(path, lambda doc: doc["all"]["thermal"].update(temperature_gpu_c=82))
    # replaced by rename: a new inode, so readers see the old file or the new one
    assert path.stat().st_ino != inode


def test_a_link_planted_at_the_temp_name_is_removed_not_written_through(tmp_path: Path) -> None:
    """A named file (``mokka ctl --file``) is written by a temp file beside it under a fixed
    name (``layout.temp_name``): a link planted there must not carry the write elsewhere."""
    path = tmp_path / "config" / "overrides.yaml"
    path.parent.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("not Mokka's\n")
    (path.parent / ".overrides.yaml.mokka-tmp").symlink_to(victim)
    update_overrides(path, lambda doc: doc.update(all={"utilization": {"gpu": 10}}))
    assert victim.read_text() == "not Mokka's\n"
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["overrides.yaml", "overrides.yaml.lock"]
    loaded = load_overrides(path)
    assert loaded is not None
    assert loaded.all == {"utilization": {"gpu": 10}}


def test_rejected_update_leaves_the_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "overrides.yaml"
    update_overrides(path, lambda doc: doc.update(all={"utilization": {"gpu": 10}}))
    before = path.read_bytes()
    with pytest.raises(SpecError) as info:
        update_overrides(path, lambda doc: doc.update(all={"utilization": {"gpu": 900}}))
    assert info.value.problems == (
        f"{path}: all.utilization.gpu: 900 is out of range, expected 0..100",)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["overrides.yaml", "overrides.yaml.lock"]


def test_update_refuses_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(MokkaError, match="no such directory, expected the node's driver config"):
        update_overrides(tmp_path / "absent" / "overrides.yaml", lambda doc: None)
    assert list(tmp_path.iterdir()) == []


def test_reset_file_removes_runtime_content(tmp_path: Path) -> None:
    path = tmp_path / "overrides.yaml"
    update_overrides(path, lambda doc: doc.update(all={"performance_state": "P2"}))
    assert reset_file(path) is True
    assert list(tmp_path.iterdir()) == []
    assert reset_file(path) is False
    assert list(tmp_path.iterdir()) == []
    assert reset_file(tmp_path / "absent" / "overrides.yaml") is False
    # writers work again after a reset (a fresh lock file)
    update_overrides(path, lambda doc: doc.update(all={"performance_state": "P3"}))
    assert lock_path(path).exists()
    assert load_overrides(path).all == {"performance_state": "P3"}
