"""``mokka ctl mig``: a GPU's MIG mode and layout, checked against the board's
table before anything is written, and what the daemon then renders from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mokka.ctl import command as ctl
from mokka.ctl.targets import engine_gpus
from mokka.simulators.gpudriver import mig_caps
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile
from mokka.state.overrides import load_overrides


@pytest.fixture
def file(tmp_path: Path) -> Path:
    """The overrides file of an h100 node whose engine config sits beside it."""
    (tmp_path / "config.yaml").write_text(render_engine_config(compile_profile("h100",
                                                                               node_name="n")))
    return tmp_path / "overrides.yaml"


def run(file: Path, *args: str) -> int:
    return ctl.main(["mig", "--file", str(file), *args])


def mig(file: Path, target: str = "1") -> dict[str, Any]:
    """The ``mig`` section written for GPU ``target``: under its UUID, where
    ``nvidia-smi mig`` and NVML write theirs too (an index section would lose)."""
    overrides = load_overrides(file)
    assert overrides is not None
    known = engine_gpus(file.with_name("config.yaml"))
    assert known is not None
    uuid = next(u for u, index in known.items() if str(index) == target)
    devices = overrides.to_mapping()["devices"]
    assert target not in devices
    return devices[uuid]["mig"]


def test_create_writes_the_layout_the_board_places(file: Path) -> None:
    assert run(file, "--gpu", "1", "--create", "3g.40gb,2x2g.20gb") == 0
    written = mig(file)
    assert (written["mode_current"], written["mode_pending"]) == ("enabled", "enabled")
    # a 2g instance starts at 0, 2 or 4 only: the 3g one takes 4
    assert [(gi["profile"], gi["start"]) for gi in written["instances"]] == [
        (9, 4), (14, 0), (14, 2)]
    # the daemon renders it: three MIG devices, each with its two capabilities
    state = compile_profile("h100", node_name="n", overrides=file)
    devices = mig_caps.mig_devices(state.gpus[1])
    assert [(d.gi, d.ci, d.gi_cap.minor, d.ci_cap.minor) for d in devices] == [
        (2, 0, 3 + 135 + 18, 3 + 135 + 19), (3, 0, 3 + 135 + 27, 3 + 135 + 28),
        (4, 0, 3 + 135 + 36, 3 + 135 + 37)]


def test_destroy_and_mode(file: Path) -> None:
    assert run(file, "--gpu", "1", "--create", "7x1g.10gb") == 0
    assert len(mig(file)["instances"]) == 7
    assert run(file, "--gpu", "1", "--destroy") == 0
    assert mig(file)["instances"] == []
    assert run(file, "--gpu", "1", "--create", "7g.80gb") == 0
    assert run(file, "--gpu", "1", "--mode", "disabled") == 0
    assert mig(file) == {"mode_current": "disabled", "mode_pending": "disabled",
                         "instances": []}


@pytest.mark.parametrize(("args", "expected"), [
    (["--create", "4g.40gb,4g.40gb"],
     "--create: NVIDIA H100 80GB HBM3: 4g.40gb, 4g.40gb does not fit the board: it holds "
     "seven compute slices and eight memory slices, at most 7x1g.10gb, 1x1g.10gb+me, "
     "4x1g.20gb, 3x2g.20gb, 2x3g.40gb, 1x4g.40gb, 1x7g.80gb"),
    (["--create", "1g.5gb"],
     "--create: NVIDIA H100 80GB HBM3: '1g.5gb' is not a GPU instance profile of this board, "
     "expected one of 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
    (["--create", ",, ,"],
     "--create: ',, ,' names no GPU instance profile, expected a comma-separated list such as "
     "7x1g.10gb (--destroy removes them all)"),
    (["--create", "9x1g.10gb"],
     "--create: NVIDIA H100 80GB HBM3: '9x1g.10gb': 9 GPU instances, the board holds 1 to 7"),
])
def test_a_layout_the_board_cannot_hold_writes_nothing(
    file: Path, capsys, args: list[str], expected: str
) -> None:
    assert run(file, "--gpu", "1", *args) == 2
    assert capsys.readouterr().err == f"mokka ctl: error: {expected}\n"
    assert not file.exists()


def test_a_board_without_mig_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.yaml").write_text(render_engine_config(compile_profile("t4",
                                                                               node_name="n")))
    assert run(tmp_path / "overrides.yaml", "--gpu", "0", "--create", "1g.5gb") == 2
    assert capsys.readouterr().err == (
        "mokka ctl: error: --create: Tesla T4 is not MIG capable\n")
