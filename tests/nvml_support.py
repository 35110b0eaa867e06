"""Shared pieces of the mock NVML tests: one native build per session, engine
configs written with the real writer, and runners for the probe and nvidia-smi."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mokka import layout
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.model import State
from native import toolchain

PROBE = Path(__file__).resolve().parent / "nvml_probe.py"


def load_target(name: str):
    """Import ``native/<name>/target.py`` the way ``native/build.py`` does."""
    return toolchain.load_target(name)


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler: install gcc (./scripts/install-system-deps)")
    return cc


def node_path(root: Path, node_path: str) -> Path:
    """A node path (``/var/lib/...``) under a test root."""
    return root / node_path.lstrip("/")


def state_with_overrides(profile: str, where: Path, *ctl_calls: list[str]) -> State:
    """``profile`` compiled with the overrides file the ``mokka ctl`` calls (verb and
    arguments each) write under ``where``."""
    from mokka.ctl import command as ctl
    from mokka.state.compile import compile_profile

    overrides = where / "overrides.yaml"
    for verb, *rest in ctl_calls:
        assert ctl.main([verb, "--file", str(overrides), *rest]) == 0
    used = overrides if overrides.exists() else None
    return compile_profile(profile, node_name="worker-1", overrides=used)


def write_config(root: Path, state: State) -> Path:
    """Render ``state`` to the engine config's node path under ``root``."""
    path = node_path(root, layout.ENGINE_CONFIG)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(render_engine_config(state))
    os.replace(tmp, path)
    return path


def nvml_env(native_dir: Path, config: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(LD_LIBRARY_PATH=str(native_dir), MOCK_NVML_CONFIG=str(config))
    # The host has no /dev/nvidia* (no filtering); tests that filter set their own.
    env.update(extra)
    return env


def probe(native_dir: Path, config: Path, *args: str, **extra: str) -> dict[str, Any]:
    """Run one probe command in a fresh interpreter; its JSON result."""
    return _json_of([str(PROBE), *args], native_dir, config, extra)


#: A probe script's ``attempt(call)``: the call's answer, or ``{"error": code}``
#: for an NVMLError; the scripts import nvidia-ml-py as ``nv``.
PYNVML_ATTEMPT = '''
def attempt(call):
    try:
        return call()
    except nv.NVMLError as error:
        return {"error": error.value}
'''


def run_script(native_dir: Path, config: Path, script: str, *args: str, **extra: str) -> Any:
    """Run the Python source ``script`` with ``args`` in a fresh interpreter against the
    library (a crash there fails the test, not the run); what it printed, as JSON."""
    return _json_of(["-c", script, *args], native_dir, config, extra)


def _json_of(argv: list[str], native_dir: Path, config: Path, extra: dict[str, str]) -> Any:
    result = subprocess.run(
        [sys.executable, *argv],
        env=nvml_env(native_dir, config, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{argv[:1]} {argv[2:]} failed:\n{result.stderr}"
    return json.loads(result.stdout)


def open_files(pid: int, suffix: str) -> list[tuple[int, str]]:
    """(inode, path) of each descriptor process ``pid`` holds on a path ending in
    ``suffix`` (``/config/generation``: the library's change notice), in fd order."""
    found = []
    fds = Path(f"/proc/{pid}/fd")
    for fd in sorted(fds.iterdir(), key=lambda p: int(p.name)):
        try:
            target = os.readlink(fd)
            inode = os.stat(fd).st_ino
        except FileNotFoundError:
            continue  # closed meanwhile
        if target.endswith(suffix):
            found.append((inode, target))
    return found


def run_smi(
    binary: Path, native_dir: Path, config: Path, *args: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(binary), *args],
        env=nvml_env(native_dir, config),
        capture_output=True,
        text=True,
        timeout=120,
    )


def library_without_config(directory: Path) -> Path:
    """The built mock library copied to ``directory/usr/lib64`` with no config beside it
    (``directory/config`` does not exist): what a container gets from a CDI spec that
    mounts only the library, so it must ask the node daemon's socket."""
    from mokka import native

    lib_dir = directory / "usr" / "lib64"
    lib_dir.mkdir(parents=True)
    copy = lib_dir / native.NVML_LIBRARY
    shutil.copyfile(native.artifact(native.NVML_LIBRARY), copy)
    assert not (directory / "config").exists()
    return copy


def socket_client_env(socket_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a client with no ``MOCK_NVML_CONFIG`` that asks ``socket_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_NVML")}
    env.update(MOCK_NVML_SOCKET=str(socket_path), **extra)
    return env
