"""Shared by the gpudriver and nvlink tests: states, native stand-ins, and a
child-process runner (for an unshared mount namespace or a process without
CAP_MKNOD)."""

from __future__ import annotations

import functools
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from mokka.noderoot.host import Host
from mokka.simulators.gpudriver import GpuDriverSettings, GpuDriverSimulator
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests import consumers
from tests.support import ROOT, snapshot

DRIVER = "580.105.08"
LIB_BYTES = b"\x7fELF stand-in for the mock NVML library\n"
SMI_BYTES = b"\x7fELF stand-in for the fallback nvidia-smi\n"
CUDA_BYTES = b"\x7fELF stand-in for the CUDA stub\n"


@functools.cache
def h100() -> State:
    """The built-in h100 profile compiled for one node (8 GPUs, driver 580.105.08)."""
    state = compile_profile("h100", node_name="node-a")
    assert state.system.driver_version == DRIVER
    return state


def make_state(
    gpus: int = 8, *, driver: str = DRIVER, minors: tuple[int, ...] | None = None
) -> State:
    """The h100 state cut to ``gpus`` GPUs, optionally with another driver or minors."""
    base = h100()
    chosen = base.gpus[:gpus]
    if minors is not None:
        chosen = tuple(attrs.evolve(g, minor=m) for g, m in zip(chosen, minors, strict=True))
    return attrs.evolve(
        base, gpus=chosen, system=attrs.evolve(base.system, driver_version=driver)
    )


def use_native_stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A native build directory holding stand-ins for the libraries and the fallback nvidia-smi."""
    directory = tmp_path / "native"
    directory.mkdir()
    (directory / "libnvidia-ml.so.1").write_bytes(LIB_BYTES)
    (directory / "libcuda.so.1").write_bytes(CUDA_BYTES)
    (directory / "nvidia-smi").write_bytes(SMI_BYTES)
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(directory))
    return directory


def symlink_settings(tmp_path: Path) -> GpuDriverSettings:
    # No real nvidia-smi in the "image" nor installed: the fallback is chosen.
    return GpuDriverSettings(
        nvidia_smi_binary=tmp_path / "image" / "nvidia-smi",
        installed_nvidia_smi=tmp_path / "usr" / "bin" / "nvidia-smi",
        publish="symlink",
    )


def node_paths(root: Path) -> set[str]:
    """Every path under the root except Mokka's own bookkeeping (manifests, and the
    record of the state directory's ancestors at the top of the root)."""
    return {
        p
        for p in snapshot(root)
        if not p.startswith("var/lib/mokka") and p != ".mokka-created-parents.json"
    }


def expected_tree(minors: range | tuple[int, ...] = range(8), *, smi: bool = True) -> set[str]:
    nv = "var/lib/nvml-mock"
    drv = f"{nv}/driver"
    paths = {
        "var", "var/lib", nv, drv, f"{drv}/dev", f"{drv}/dev/nvidiactl",
        f"{drv}/dev/nvidia-modeset", f"{drv}/dev/nvidia-uvm", f"{drv}/dev/nvidia-uvm-tools",
        f"{drv}/dev/nvidia-caps", f"{drv}/dev/nvidia-caps/nvidia-cap1",
        f"{drv}/dev/nvidia-caps/nvidia-cap2", f"{drv}/usr", f"{drv}/usr/lib64",
        f"{drv}/usr/lib64/libnvidia-ml.so.{DRIVER}", f"{drv}/usr/lib64/libnvidia-ml.so.1",
        f"{drv}/usr/lib64/libnvidia-ml.so", f"{drv}/usr/lib64/libcuda.so.{DRIVER}",
        f"{drv}/usr/lib64/libcuda.so.1", f"{drv}/usr/lib64/libcuda.so",
        f"{drv}/proc", f"{drv}/proc/driver",
        f"{drv}/proc/driver/nvidia", f"{drv}/proc/driver/nvidia/version",
        f"{drv}/proc/driver/nvidia/params", f"{drv}/proc/driver/nvidia/capabilities",
        f"{drv}/proc/driver/nvidia/capabilities/mig",
        f"{drv}/proc/driver/nvidia/capabilities/mig/config",
        f"{drv}/proc/driver/nvidia/capabilities/mig/monitor", f"{drv}/config",
        f"{drv}/config/config.yaml", f"{drv}/config/generation",
        f"{nv}/sys", f"{nv}/sys/module", f"{nv}/sys/module/nvidia",
        f"{nv}/sys/module/nvidia/version",
    }
    paths |= {f"{drv}/dev/nvidia{m}" for m in minors}
    if smi:
        paths |= {f"{drv}/usr/bin", f"{drv}/usr/bin/nvidia-smi"}
    return paths


def mtimes(root: Path) -> dict[str, tuple[int, int]]:
    """(mtime, inode) of every staged entry: a rewrite by rename changes the inode too.

    Mokka's own manifests (``var/lib/mokka``) are compacted on every pass and
    are not part of what consumers see.
    """
    result = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            rel = str((Path(dirpath) / name).relative_to(root))
            if not rel.startswith("var/lib/mokka"):
                st = os.lstat(Path(dirpath) / name)
                result[rel] = (st.st_mtime_ns, st.st_ino)
    return result


async def teardown(sim: GpuDriverSimulator, host: Host) -> None:
    await sim.revoke(host)
    await sim.discard(host)


# Runs one step in a child process: placed inside an unshared mount namespace
# for the bind-mount tests, or without CAP_MKNOD.  Prints one JSON line.
CHILD = r"""
import json, os, pickle, sys
import trio
from pathlib import Path
from mokka.noderoot.host import Host, SubprocessRunner
from mokka.simulators.gpudriver import GpuDriverSettings, GpuDriverSimulator
from mokka.simulators.gpudriver import publish

step, root, state_file = sys.argv[1:4]
calls = []

class Recording:
    def run(self, argv, **kwargs):
        calls.append(list(argv))
        return SubprocessRunner().run(argv, **kwargs)

host = Host(root, runner=Recording())
state = pickle.loads(Path(state_file).read_bytes())
mode = "symlink" if step == "apply-symlink" else "bind"
sim = GpuDriverSimulator(settings=GpuDriverSettings(publish=mode, nvidia_smi_binary="/nonexistent"))
mountpoint = Path(root) / "run/nvidia/driver"
report = {"step": step}
if step.startswith("apply"):
    trio.run(sim.apply, host, state)
elif step == "revoke":
    trio.run(sim.revoke, host)
elif step == "revoke-busy":
    with open(mountpoint / "proc/driver/nvidia/version") as held:
        trio.run(sim.revoke, host)
        report["held"] = held.read()
elif step == "stage":
    trio.run(sim.stage, host, state)
    report["readiness"] = [sim.readiness.ready, sim.readiness.reason]
report["calls"] = calls
report["mounted"] = publish.is_mountpoint(mountpoint)
report["islink"] = mountpoint.is_symlink()
found = Path(mountpoint / "proc/driver/nvidia/version")
report["version"] = found.read_text() if found.exists() else None
if step.startswith("apply") or step.startswith("revoke"):
    fm = __import__("subprocess").run(
        ["findmnt", "--json", "--output", "TARGET", "--mountpoint", str(mountpoint)],
        capture_output=True, text=True)
    report["findmnt"] = json.loads(fm.stdout)["filesystems"] if fm.returncode == 0 else []
print(json.dumps(report))
"""


def run_steps(
    node_root: Path, state: State, tmp_path: Path, steps: list[str], *, prefix: list[str]
) -> list[dict]:
    """Run ``steps`` as separate (fresh) processes, one after another, under ``prefix``."""
    state_file = tmp_path / "state.pickle"
    state_file.write_bytes(pickle.dumps(state))
    script = 'for step in "$@"; do "$PY" -c "$CHILD" "$step" "$ROOT" "$STATE" || exit $?; done'
    env = dict(
        os.environ, PY=sys.executable, CHILD=CHILD, ROOT=str(node_root), STATE=str(state_file)
    )
    result = subprocess.run(
        [*prefix, "sh", "-c", script, "steps", *steps],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


UNSHARE = ["unshare", "--mount", "--propagation", "private"]



def toolkit_binary(name: str) -> Path:
    """A binary of the real NVIDIA Container Toolkit (``nvidia-ctk``,
    ``nvidia-cdi-hook``); fails the test, saying so, when it is not installed."""
    return consumers.consumer(name)
