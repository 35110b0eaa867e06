"""The scenario scripts under examples/: each runs as a user would run it.

Every script starts its own ``mokka daemon`` (the venv's, through ``MOKKA``)
on a root under the test's temporary directory (``TMPDIR``) with the real
``nvidia-smi`` 535 staged (``NVIDIA_SMI``), and must exit 0, print the lines
that show its scenario happened, stop every daemon it started and leave
nothing under ``TMPDIR``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, real_nvidia_smi, require_tool

pytestmark = pytest.mark.timeout(150)

EXAMPLES = ROOT / "examples"
MOKKA = ROOT / ".venv" / "bin" / "mokka"

#: Per script: lines (regular expressions, each matching one whole line) it must print.
EXPECTED: dict[str, list[str]] = {
    "xid-storm.sh": [
        r"gpu 0 \(GPU-[0-9a-f-]+\): failure mode ecc_uncorrectable, Xid 48; applied by the "
        r"daemon holding .* \(pid \d+\)",
        r"gpu 0 \(GPU-[0-9a-f-]+\): Xid 94 raised; applied by the daemon .*",
        r"NVRM: .*Xid \(PCI:0000:53:00\): 63, .*",
        r"NVRM: .*Xid \(PCI:0000:53:00\): 94, .*Contained ECC error\.",
        r"kernel log: 6 Xid line\(s\) for GPU 0",
        # The real nvidia-smi reads the injected uncorrectable ECC error.
        r"GPU 0 uncorrectable ECC errors \(volatile\): [1-9]\d*",
        r"0\s+failure\.mode\s+ecc_uncorrectable",
        r"gpu 0 \(GPU-[0-9a-f-]+\): overrides removed; applied by the daemon .*",
        r"no overrides in .*/overrides\.yaml",
    ],
    "fallen-off-bus.sh": [
        r"1, 00000000:64:00\.0, \[GPU is lost\], \[GPU is lost\]",
        r"NVRM: .*Xid \(PCI:0000:64:00\): 79, .*GPU has fallen off the bus\.",
        r"GPUs lost: 1",
        r"1, 00000000:64:00\.0, \d+, [\d.]+ W",
        r"GPUs lost: 0",
    ],
    "compute-domain.sh": [
        r'node-a: "nvlink":\{"ready":true,"reason":"topology staged \(node node-a in domain '
        r'00000000-0000-0000-0000-0000000000ab clique 7\)"',
        r'node-b: "nvlink":\{"ready":true,"reason":"topology staged \(node node-b in domain '
        r'00000000-0000-0000-0000-0000000000ab clique 7\)"',
        r"GPU 0: NVIDIA GB200 \(UUID: GPU-[0-9a-f-]+\)",
        r"\s+State\s+: Completed",
        r"2048 channels in node-a:/var/lib/nvml-mock/driver/dev/nvidia-caps-imex-channels",
        r"2048 channels in node-b:/var/lib/nvml-mock/driver/dev/nvidia-caps-imex-channels",
    ],
    "drain.sh": [
        r"== nvidia-smi drain -p 0000:75:00\.0 -q",
        r"The current drain state of GPU 00000000:75:00\.0 is: draining\.",
        r"NVRM: .*Xid \(PCI:0000:75:00\): 48, .*Double Bit ECC Error\.",
        r"GPU 2 uncorrectable ECC errors \(volatile\): [1-9]\d*",
        r"GPU-[0-9a-f-]+\s+drain_state\s+enabled",
        r"2\s+failure\.mode\s+ecc_uncorrectable",
        r"Successfully set GPU 00000000:75:00\.0 drain state to: not draining\.",
        r"gpu 2 \(GPU-[0-9a-f-]+\): overrides removed; applied by the daemon .*",
    ],
}
FINAL = "teardown: daemons exited (0), node roots removed"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A TMPDIR with a short path, as ``/tmp`` is for a user: the node's sockets
    live under the root, and pytest's own temporary paths would push them
    past the 108-byte limit of a Unix socket path."""
    path = Path(tempfile.mkdtemp(prefix="mkx-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_example(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    require_tool("curl")
    env = {
        **os.environ,
        "MOKKA": str(MOKKA),
        "NVIDIA_SMI": str(real_nvidia_smi()),
        "TMPDIR": str(tmp_path),
    }
    return subprocess.run(
        [str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def daemon_pids(stdout: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"^daemon on \S+ ready \(pid (\d+),", stdout, re.M)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_and_leaves_nothing(script: str, short_tmp: Path) -> None:
    tmp_path = short_tmp
    done = run_example(script, tmp_path)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    lines = done.stdout.splitlines()
    for pattern in EXPECTED[script]:
        assert any(re.fullmatch(pattern, line) for line in lines), (
            f"{script} printed no line matching {pattern!r}:\n{done.stdout}"
        )
    assert lines[-1] == FINAL, done.stdout
    pids = daemon_pids(done.stdout)
    assert len(pids) == (2 if script == "compute-domain.sh" else 1), done.stdout
    assert not [pid for pid in pids if alive(pid)], "a daemon outlived its script"
    assert list(tmp_path.iterdir()) == [], "the script left files in TMPDIR"
    mounted = Path("/proc/self/mounts").read_text().splitlines()
    assert not [line for line in mounted if str(tmp_path) in line], "a mount outlived its script"


def test_a_failing_example_still_stops_its_daemon(tmp_path: Path, short_tmp: Path) -> None:
    """A step that fails (here: a GPU the profile does not have) exits non-zero
    through ``set -e``, and the exit trap still stops the daemon and removes
    its root."""
    script = tmp_path / "bin" / "broken.sh"
    script.parent.mkdir()
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f"source {EXAMPLES / 'lib.sh'}\n"
        "start_daemon node --profile t4 --node-name node-a\n"
        'ctl "$ROOT" xid --gpu 5 --code 48\n'
        "teardown\n"
    )
    script.chmod(0o755)
    work = short_tmp
    done = subprocess.run(
        [str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "MOKKA": str(MOKKA), "TMPDIR": str(work)},
        timeout=120,
    )
    assert done.returncode != 0, done.stdout
    (pid,) = daemon_pids(done.stdout)
    assert not alive(pid), "the exit trap left the daemon running"
    assert list(work.iterdir()) == []


def test_the_readme_lists_every_example() -> None:
    listed = set(re.findall(r"^\| `([\w-]+\.sh)` \|", (EXAMPLES / "README.md").read_text(), re.M))
    scripts = {p.name for p in EXAMPLES.glob("*.sh")} - {"lib.sh"}
    assert listed == scripts == set(EXPECTED)
    for name in scripts:
        assert os.access(EXAMPLES / name, os.X_OK), f"{name} is not executable"
