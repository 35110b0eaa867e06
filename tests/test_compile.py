"""Compilation: determinism, content hash, fabric identity, overrides layers, Xid ids."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mokka.errors import SpecError
from mokka.state.compile import compile_profile
from tests.support import DATA

PROFILES = DATA / "profiles"
CLUSTER = "00000000-0000-0000-0000-0000000000ab"


def write(path: Path, doc: object) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_same_inputs_give_equal_states_and_hashes() -> None:
    a = compile_profile("h100", node_name="node-1")
    b = compile_profile("h100", node_name="node-1")
    assert a == b
    assert a.content_hash == b.content_hash
    assert len(a.content_hash) == 64
    other = compile_profile("h100", node_name="node-2")
    assert other.content_hash != a.content_hash
    assert {g.uuid for g in other.gpus}.isdisjoint({g.uuid for g in a.gpus})


def test_generation_is_not_part_of_the_hash() -> None:
    a = compile_profile("t4", node_name="n", generation=1)
    b = compile_profile("t4", node_name="n", generation=7)
    assert (a.generation, b.generation) == (1, 7)
    assert a.content_hash == b.content_hash


def test_comments_and_key_order_do_not_change_the_hash(tmp_path: Path) -> None:
    text = (PROFILES / "pcie-only.yaml").read_text()
    first = write(tmp_path / "o1.yaml", {"version": 1, "all": {"thermal": {
        "temperature_gpu_c": 50, "shutdown_threshold_c": 90}}})
    second = tmp_path / "o2.yaml"
    second.write_text("# pinned\nall:\n  thermal: {shutdown_threshold_c: 90, "
                      "temperature_gpu_c: 50}\nversion: 1\n")
    (tmp_path / "p1.yaml").write_text(text)
    (tmp_path / "p2.yaml").write_text("# a comment\n" + text)
    s1 = compile_profile(tmp_path / "p1.yaml", node_name="n", overrides=first)
    s2 = compile_profile(tmp_path / "p1.yaml", node_name="n", overrides=second)
    assert s1.content_hash == s2.content_hash
    # the profile's name (its path) is an input: same content under another path hashes apart
    s3 = compile_profile(tmp_path / "p2.yaml", node_name="n", overrides=first)
    assert s3.content_hash != s1.content_hash


def test_feature_gates_are_inputs() -> None:
    a = compile_profile("t4", node_name="n", feature_gates={"IMEXDownload": False})
    b = compile_profile("t4", node_name="n", feature_gates={"IMEXDownload": True})
    assert b.feature_gates == {"IMEXDownload": True}
    assert a.content_hash != b.content_hash


def test_clique_gives_fabric_identity() -> None:
    topo = PROFILES / "topology-plain.yaml"
    state = compile_profile("h100", node_name="worker-2", topology=topo)
    assert {g.fabric for g in state.gpus} == {
        state.gpus[0].fabric}
    fabric = state.gpus[0].fabric
    assert (fabric.cluster_uuid, fabric.clique_id, fabric.state) == (CLUSTER, 1, "completed")
    assert state.gpus[3].fields["fabric"]["state"] == "completed"
    assert state.topology is not None
    assert state.topology.text == topo.read_text()


def test_node_not_in_topology_keeps_profile_defaults() -> None:
    state = compile_profile("h100", node_name="elsewhere",
                            topology=PROFILES / "topology-plain.yaml")
    assert state.gpus[0].fabric.state == "auto"
    assert state.gpus[0].fabric.cluster_uuid == "00000000-0000-0000-0000-000000000000"


def test_profiles_without_fabric_block_are_not_affected() -> None:
    state = compile_profile("a100", node_name="worker-0",
                            topology=PROFILES / "topology-plain.yaml")
    assert state.gpus[0].fabric is None
    assert "fabric" not in state.gpus[0].fields


def test_fabric_health_override_does_not_invent_a_fabric(tmp_path: Path) -> None:
    overrides = write(tmp_path / "o.yaml", {"version": 1, "all": {"fabric": {"health": {
        "summary": "unhealthy"}}}})
    a100 = compile_profile("a100", node_name="n", overrides=overrides)
    assert a100.gpus[0].fabric is None
    assert not a100.has_nvswitch
    h100 = compile_profile("h100", node_name="n", overrides=overrides)
    assert h100.gpus[0].fabric.state == "auto"
    # merged over the profile's health (the H100 capture's: every field N/A)
    assert h100.gpus[0].fields["fabric"]["health"] == {
        "summary": "unhealthy", "bandwidth": "n/a", "route_recovery_in_progress": "n/a",
        "route_unhealthy": "n/a", "access_timeout_recovery": "n/a",
        "incorrect_configuration": "n/a"}


def test_grace_board_in_a_clique_is_fabric_attached() -> None:
    state = compile_profile("gb200", node_name="worker-1",
                            topology=PROFILES / "topology-wrapped.yaml")
    assert state.fabric_attached
    assert {(g.fabric.cluster_uuid, g.fabric.clique_id) for g in state.gpus} == {(CLUSTER, 1)}


def test_overrides_merge_profile_then_all_then_index_then_uuid(tmp_path: Path) -> None:
    uuid0 = compile_profile("h100", node_name="n").gpus[0].uuid
    overrides = write(tmp_path / "overrides.yaml", {
        "version": 1,
        "all": {"thermal": {"temperature_gpu_c": 70}, "utilization": {"gpu": 5}},
        "devices": {
            "0": {"thermal": {"temperature_gpu_c": 71}, "utilization": {"gpu": 6}},
            uuid0.upper().replace("GPU-", "GPU-", 1): {"thermal": {"temperature_gpu_c": 72}},
            "1": {"failure": {"mode": "fallen_off_bus", "after_calls": 3}},
        },
    })
    state = compile_profile("h100", node_name="n", overrides=overrides)
    g0, g1, g2 = state.gpus[:3]
    assert g0.fields["thermal"]["temperature_gpu_c"] == 72
    assert g0.fields["utilization"]["gpu"] == 6
    assert g1.fields["thermal"]["temperature_gpu_c"] == 70
    # untouched fields of the block stay from the profile (deep merge)
    assert g1.fields["thermal"]["shutdown_threshold_c"] == 92
    assert (g1.failure.mode, g1.failure.after_calls) == ("fallen_off_bus", 3)
    assert g2.failure.mode == "healthy"


def test_xid_ids_are_stable_and_distinct(tmp_path: Path) -> None:
    doc = {"version": 1,
           "all": {"xids": [{"code": 48}]},
           "devices": {"0": {"failure": {"mode": "ecc_uncorrectable", "xid": {"code": 79}},
                             "xids": [{"code": 13, "id": "a1"}, {"code": 13, "id": "b2"}]}}}
    overrides = write(tmp_path / "overrides.yaml", doc)
    first = compile_profile("h100", node_name="n", overrides=overrides)
    again = compile_profile("h100", node_name="n", overrides=overrides)
    assert first.xids == again.xids
    mine = [(x.gpu_index, x.code) for x in first.xids]
    assert mine.count((0, 13)) == 2
    assert (0, 79) in mine
    assert sorted(x.gpu_index for x in first.xids if x.code == 48) == list(range(8))
    ids = [x.id for x in first.xids]
    assert len(set(ids)) == len(ids)
    # an id written by ctl names the injection wherever it sits in the file
    kept = next(x.id for x in first.xids if x.gpu_index == 0 and x.code == 13)
    doc["devices"]["0"]["xids"] = [{"code": 13, "id": "b2"}]
    later = compile_profile("h100", node_name="n", overrides=write(overrides, doc))
    assert [x.id for x in later.xids if x.code == 13] == [
        next(x.id for x in first.xids if x.code == 13 and x.id != kept)]


def test_profile_xids_are_compiled(tmp_path: Path) -> None:
    text = (PROFILES / "minimal.yaml").read_text().replace(
        '  - {index: 1, pci: {bus_id: "0000:02:00.0"}}',
        '  - {index: 1, pci: {bus_id: "0000:02:00.0"}, xids: [{code: 94}]}')
    (tmp_path / "p.yaml").write_text(text)
    state = compile_profile(tmp_path / "p.yaml", node_name="n")
    assert [(x.gpu_index, x.code) for x in state.xids] == [(1, 94)]
    assert state.xids[0].id.startswith("xid-")
    assert "xids" not in state.gpu(1).fields


def test_missing_optional_inputs_are_absent(tmp_path: Path) -> None:
    state = compile_profile("t4", node_name="n", topology=tmp_path / "no-topology.yaml",
                            overrides=tmp_path / "no-overrides.yaml")
    assert state.topology is None
    assert state == compile_profile("t4", node_name="n")


def test_problems_of_all_inputs_are_reported_together(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text((PROFILES / "minimal.yaml").read_text().replace('"580.105.08"', '"580"'))
    overrides = write(tmp_path / "o.yaml", {"version": 1, "all": {"brand": "x"}})
    with pytest.raises(SpecError) as info:
        compile_profile(profile, node_name="n", overrides=overrides)
    assert info.value.problems == (
        f"{profile}: system.driver_version: '580' is not a driver version of 2-3 dot-separated "
        "numbers like 580.105.08",
        f"{overrides}: all.brand: not hot-reloadable (consumers cache it when the GPU appears), "
        "change the profile instead",
    )


def test_empty_node_name_is_refused() -> None:
    with pytest.raises(SpecError, match="node name: empty"):
        compile_profile("t4", node_name=" ")


def test_keys_of_any_yaml_type_hash_without_crashing(tmp_path: Path) -> None:
    """Pass-through device fields and open overrides subtrees may have int, null or
    date keys beside string ones; the hash must order them, and tell ``1`` from ``"1"``."""
    text = (PROFILES / "minimal.yaml").read_text()
    assert "device_defaults:\n" in text
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(text.replace(
        "device_defaults:\n",
        "device_defaults:\n  vendor_table: {0: zero, speed: 1, ~: none, 2024-01-31: day}\n", 1))
    as_text = tmp_path / "as-text.yaml"
    as_text.write_text(text.replace(
        "device_defaults:\n",
        "device_defaults:\n  vendor_table: {'0': zero, speed: 1, ~: none, 2024-01-31: day}\n", 1))
    a = compile_profile(mixed, node_name="n")
    assert a.content_hash == compile_profile(mixed, node_name="n").content_hash
    assert a.content_hash != compile_profile(as_text, node_name="n").content_hash
    overrides = write(tmp_path / "overrides.yaml", {
        "version": 1, "all": {"fan": {0: 40, "speed_pct": 50}, "processes": [{"at": {1: "x"}}]}})
    b = compile_profile("h100", node_name="n", overrides=overrides)
    again = compile_profile("h100", node_name="n", overrides=overrides)
    assert b.content_hash == again.content_hash
    assert b.content_hash != compile_profile("h100", node_name="n").content_hash


def test_an_unchanged_profile_is_parsed_once_while_the_overrides_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a ``mokka ctl`` loop makes the daemon do: every change compiles all the
    inputs again, and the profile's text, the same each time, is parsed once."""
    from mokka.state import profile

    parsed: list[str] = []
    real_load_yaml = profile.load_yaml

    def counting(text: str, source: str) -> object:
        parsed.append(source)
        return real_load_yaml(text, source)

    monkeypatch.setattr(profile, "load_yaml", counting)
    profile._parsed.cache_clear()
    profile_file = tmp_path / "p.yaml"
    profile_file.write_text((PROFILES / "pcie-only.yaml").read_text())
    overrides = tmp_path / "o.yaml"
    temps = []
    for celsius in (50, 61, 72):
        write(overrides, {"version": 1, "all": {"thermal": {"temperature_gpu_c": celsius}}})
        state = compile_profile(profile_file, node_name="n", overrides=overrides)
        temps.append(state.gpus[0].fields["thermal"]["temperature_gpu_c"])
    assert temps == [50, 61, 72]
    assert parsed == [str(profile_file)]
    # a changed text is parsed again, and what it says is what compiles
    profile_file.write_text(profile_file.read_text().replace('"550.163.01"', '"550.999.01"'))
    state = compile_profile(profile_file, node_name="n", overrides=overrides)
    assert state.system.driver_version == "550.999.01"
    # a text that fails is not kept: each read reports it again
    profile_file.write_text(profile_file.read_text().replace("driver_version:", "driver_verison:"))
    for _ in range(2):
        with pytest.raises(SpecError, match="driver_verison"):
            compile_profile(profile_file, node_name="n", overrides=overrides)
    assert parsed == [str(profile_file)] * 4


def _topology_of(path: Path, nodes: list[str]) -> Path:
    path.write_text(yaml.safe_dump({"version": 1, "domains": [{
        "name": "d", "uuid": "00000000-0000-0000-0000-000000000001",
        "cliques": [{"id": 0, "nodes": nodes}]}]}))
    return path


def test_an_infiniband_fabric_no_spine_can_hold_is_a_bad_input(tmp_path: Path) -> None:
    """255 nodes with HCAs: refused where the inputs are compiled (the last good
    state stays), not by every Stage wave of the ib simulator."""
    nodes = [f"n{i}" for i in range(255)]
    topology = _topology_of(tmp_path / "topology.yaml", nodes)
    with pytest.raises(SpecError) as info:
        compile_profile("gb200", node_name="n0", topology=topology)
    assert info.value.problems == (
        f"{topology}: domains: 255 nodes in this node's InfiniBand fabric, expected at most "
        "254 (one spine switch port per node)",)
    # the largest fabric compiles; without HCAs, or for a node outside it, size is no matter
    compile_profile("gb200", node_name="n0",
                    topology=_topology_of(tmp_path / "254.yaml", nodes[:254]))
    compile_profile("a100", node_name="n0", topology=topology)
    compile_profile("gb200", node_name="elsewhere", topology=topology)
