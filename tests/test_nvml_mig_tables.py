"""The boards' MIG profile tables: complete for every MIG-capable built-in
profile, consistent with the guide's geometry, and rendered into the engine
config only for a MIG-capable board; and the layouts the daemon takes or
refuses against them (``mig_layout``), with NVML's codes."""

from __future__ import annotations

from itertools import pairwise

import pytest
import yaml

from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state import mig_layout, mig_profiles
from mokka.state.compile import compile_profile

PROFILES = ("a100", "h100", "b200", "gb200", "gb300", "t4", "l40s")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("profile", PROFILES)
def test_a_mig_capable_board_has_its_table_in_the_engine_config(profile: str) -> None:
    state = compile_profile(profile, node_name="worker-1")
    config = yaml.safe_load(render_engine_config(state))
    for position, gpu in enumerate(state.gpus):
        capable = isinstance(gpu.fields.get("mig"), dict)
        table = mig_profiles.board(gpu.name)
        # every built-in board with a `mig` block is in the tables, and only those
        assert (table is not None) == capable, gpu.name
        prefix = f"device.{position}.mig."
        mig = {k.removeprefix(prefix): v for k, v in config.items() if k.startswith(prefix)}
        if table is None:
            assert mig == {}
        else:
            assert [mig[f"gi.{k}.name"] for k in range(mig["gi_count"])] == [
                p.name for p in table.profiles]
            assert [mig[f"gi.{k}.starts"] for k in range(mig["gi_count"])] == [
                ",".join(map(str, p.starts)) for p in table.profiles]
            assert mig["reset_for_mode"] == (
                "enabled" if gpu.architecture.lower() == "ampere" else "disabled")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("name", sorted(mig_profiles.BOARDS))
def test_each_table_has_the_guides_geometry(name: str) -> None:
    table = mig_profiles.BOARDS[name]
    by_id = {p.smi_id: p for p in table.profiles}
    # nvidia-smi's ids and NVML's, in nvidia-smi's order
    assert [(p.smi_id, p.nvml_id) for p in table.profiles] == [
        (19, 0), (20, 7), (15, 9), (14, 1), (9, 2), (5, 3), (0, 4)]
    for p in table.profiles:
        # placements fit the memory slices, never overlap within a profile
        assert all(s + p.size <= mig_profiles.MEMORY_SLICES for s in p.starts)
        assert all(b - a >= p.size for a, b in pairwise(p.starts))
    # as many instances as non-overlapping placements, but one "+me"
    assert [p.instances for p in table.profiles] == [7, 1, 4, 3, 2, 1, 1]
    # memory: twice the 1g for a 2-slice placement, all of it for 7g
    one, double, whole = by_id[19].memory_mib, by_id[15].memory_mib, by_id[0].memory_mib
    assert double == pytest.approx(2 * one, rel=0.05)
    assert whole == pytest.approx(8 * one, rel=0.05)
    # the compute-instance profiles of `nvidia-smi mig -lcip`
    assert by_id[0].compute_instances == (1, 2, 3, 4, 7)
    assert by_id[5].compute_instances == (1, 2, 4)
    assert by_id[9].compute_instances == (1, 2, 3)
    assert by_id[14].compute_instances == (1, 2)
    assert by_id[19].compute_instances == (1,)


H100 = "NVIDIA H100 80GB HBM3"


def _refusal(mig: dict, key: str, value: str) -> int:
    with pytest.raises(mig_layout.LayoutRefusal) as refused:
        mig_layout.plan(H100, mig, key, value)
    return refused.value.code


@pytest.mark.timeout(10)
def test_a_layout_the_board_cannot_hold_is_refused_with_nvmls_codes() -> None:
    on: dict = {"mode_current": "enabled"}
    layout = mig_layout.plan(H100, on, "mig_gi_create", "9,4")  # 3g.40gb at 4
    assert layout == [{"id": 2, "profile": 9, "start": 4, "compute": []}]
    with_3g = {**on, "instances": layout}
    assert _refusal(with_3g, "mig_gi_create", "9,4") == mig_layout.INSUFFICIENT_RESOURCES
    assert _refusal(with_3g, "mig_gi_create", "19,5") == mig_layout.INSUFFICIENT_RESOURCES
    assert _refusal(with_3g, "mig_gi_create", "0,0") == mig_layout.INSUFFICIENT_RESOURCES
    assert _refusal(with_3g, "mig_gi_create", "19,7") == mig_layout.INSUFFICIENT_RESOURCES
    assert _refusal(with_3g, "mig_gi_create", "77,0") == mig_layout.INVALID_ARGUMENT
    assert _refusal(with_3g, "mig_gi_create", "9") == mig_layout.INVALID_ARGUMENT
    assert _refusal(with_3g, "mig_gi_create", "9,x") == mig_layout.INVALID_ARGUMENT
    assert _refusal(with_3g, "mig_gi_destroy", "7") == mig_layout.NOT_FOUND
    # a 4g and a 3g fill the board's seven compute slices
    full = {**on, "instances": mig_layout.plan(H100, with_3g, "mig_gi_create", "5,0")}
    assert _refusal(full, "mig_gi_create", "19,0") == mig_layout.INSUFFICIENT_RESOURCES
    # one "+me" per board
    me = {**on, "instances": mig_layout.plan(H100, on, "mig_gi_create", "20,0")}
    assert _refusal(me, "mig_gi_create", "20,1") == mig_layout.INSUFFICIENT_RESOURCES
    # compute instances: within the GPU instance, aligned, not overlapping
    with_ci = {**on, "instances": mig_layout.plan(H100, with_3g, "mig_ci_create", "2,2,0")}
    assert _refusal(with_ci, "mig_ci_create", "2,1,1") == mig_layout.INSUFFICIENT_RESOURCES
    assert _refusal(with_ci, "mig_ci_create", "2,3,0") == mig_layout.INSUFFICIENT_RESOURCES
    assert _refusal(with_ci, "mig_ci_create", "2,4,0") == mig_layout.INVALID_ARGUMENT
    assert _refusal(with_ci, "mig_gi_destroy", "2") == mig_layout.IN_USE
    assert mig_layout.plan(H100, with_ci, "mig_ci_create", "2,1,2")[0]["compute"] == [
        {"id": 0, "slices": 2, "start": 0}, {"id": 2, "slices": 1, "start": 2}]
    # MIG off, or a board without MIG: NOT_SUPPORTED
    assert _refusal({"mode_current": "disabled"}, "mig_gi_create", "19,0") == (
        mig_layout.NOT_SUPPORTED)
    with pytest.raises(mig_layout.LayoutRefusal):
        mig_layout.plan("Tesla T4", on, "mig_gi_create", "19,0")
