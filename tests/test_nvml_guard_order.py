"""The order of NVIDIA's argument and support checks, for getters with two outputs.

The real nvidia-smi asks for one of a pair at a time and passes NULL for
the other (``--query-gpu=gom.current`` calls nvmlDeviceGetGpuOperationMode
with ``pending`` NULL): the library checks the handle and the board's
support first, and only a call with no output at all is invalid.
"""

from __future__ import annotations

import copy
from pathlib import Path

import attrs
import pytest

from mokka.state.compile import compile_profile
from mokka.state.model import Failure, State
from tests.nvml_support import run_smi, write_config

pytestmark = pytest.mark.realclient


def with_gom(state: State, modes: dict[int, tuple[str, str]]) -> State:
    def change(gpu):
        if gpu.index not in modes:
            return gpu
        fields = copy.deepcopy(gpu.fields)
        fields["gpu_operation_mode"] = dict(
            zip(("current", "pending"), modes[gpu.index], strict=True)
        )
        return attrs.evolve(gpu, fields=fields)

    return attrs.evolve(state, gpus=tuple(change(g) for g in state.gpus))


def test_gom_query_answers_per_board(native: Path, smi: Path, tmp_path: Path):
    state = with_gom(
        compile_profile("h100", node_name="worker-1"),
        {0: ("compute", "all_on"), 1: ("low_dp", "low_dp")},
    )
    config = write_config(tmp_path, state)
    result = run_smi(
        smi,
        native,
        config,
        "--query-gpu=index,gom.current,gom.pending",
        "--format=csv,noheader",
        "-i",
        "0,1,2",
    )
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines() == [
        "0, Compute, All On",
        "1, Low Double Precision, Low Double Precision",
        "2, [N/A], [N/A]",  # the profile's N/A: the board has no GOM
    ]


def test_gom_of_a_lost_gpu_is_lost_not_invalid(native: Path, smi: Path, tmp_path: Path):
    state = compile_profile("h100", node_name="worker-1")
    gpus = tuple(
        attrs.evolve(g, failure=Failure(mode="lost")) if g.index == 1 else g for g in state.gpus
    )
    config = write_config(tmp_path, attrs.evolve(state, gpus=gpus))
    result = run_smi(
        smi,
        native,
        config,
        "--query-gpu=gom.current,gom.pending",
        "--format=csv,noheader",
        "-i",
        "1",
    )
    assert result.stdout == "[GPU is lost], [GPU is lost]\n"


def test_no_getter_rejects_a_query_the_real_tool_makes(native: Path, smi: Path, tmp_path: Path):
    """Every --query-gpu field the real tool knows, on a healthy board: none
    is refused as an invalid argument."""
    config = write_config(tmp_path, compile_profile("h100", node_name="worker-1"))
    fields = query_fields(smi, native, config)
    assert len(fields) > 128
    result = run_smi(
        smi, native, config, f"--query-gpu={','.join(fields)}", "--format=csv", "-i", "0"
    )
    assert result.returncode == 0, result.stdout
    header, values = (line.split(", ") for line in result.stdout.splitlines())
    invalid = [h for h, v in zip(header, values, strict=True) if v == "[Invalid Argument]"]
    assert invalid == []


def query_fields(smi: Path, native: Path, config: Path) -> list[str]:
    """The field names ``nvidia-smi --help-query-gpu`` documents."""
    help_text = run_smi(smi, native, config, "--help-query-gpu").stdout
    names = []
    for line in help_text.splitlines():
        if line.startswith('"'):
            for name in line.replace('"', "").split(" or "):
                name = name.strip()
                if name and all(c.isalnum() or c in "._" for c in name):
                    names.append(name)
    return names
