"""Concurrency and memory safety of the mock NVML library under valgrind.

A small C driver (tests/nvml_hammer.c) runs 8 threads of NVML calls plus
event waits for 1.5 s of its own time; memcheck must report no error and no
definite leak.  The engine config is rewritten as soon as the driver runs,
so the library swaps snapshots under contention too (it looks at the file
once a second).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import attrs
import pytest

from mokka.state.compile import compile_profile
from tests.nvml_support import compiler, load_target, nvml_env, write_config
from tests.support import require_tool

pytestmark = pytest.mark.realclient

HAMMER = Path(__file__).resolve().parent / "nvml_hammer.c"


def test_eight_threads_under_valgrind(native: Path, tmp_path: Path):
    valgrind = require_tool("valgrind")
    header = load_target("nvml")._exports().find_header()
    driver = tmp_path / "nvml_hammer"
    subprocess.run(
        [
            compiler(),
            "-O1",
            "-g",
            "-Wall",
            "-Werror",
            f"-I{header.parent}",
            str(HAMMER),
            "-o",
            str(driver),
            f"-L{native}",
            "-l:libnvidia-ml.so.1",
            "-pthread",
        ],
        check=True,
    )
    state = compile_profile("h100", node_name="worker-1")
    config = write_config(tmp_path, state)

    child = subprocess.Popen(
        [
            valgrind,
            "--error-exitcode=1",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--quiet",
            str(driver),
            "8",
            "1.5",
        ],
        env=nvml_env(native, config, MOCK_NVML_DEBUG="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "RUNNING"
        write_config(tmp_path, attrs.evolve(state, generation=2))
        stdout, stderr = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
    result = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "failures=0" in result.stdout
    assert "changed; re-read it" in result.stderr
