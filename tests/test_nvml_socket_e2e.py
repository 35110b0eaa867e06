"""A container whose CDI spec the real ``nvidia-ctk cdi generate`` wrote has
working NVML: the real daemon, the real toolkit (v1.20.2), podman and runc,
and the real nvidia-smi 535 inside.

The spec the toolkit writes for a driver root mounts the library,
``nvidia-smi``, the device nodes and, because the daemon serves one there,
nvidia-persistenced's socket: no engine config.  The library asks the
socket.  podman runs as ``tests/test_cri_podman.py`` runs it (its image and
storage); the spec is read from a directory of its own, bind-mounted at
``/run/cdi`` in a private mount namespace, so the daemon's own spec (same
kind) never meets it.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import trio
import yaml

from mokka import layout
from mokka.simulators.gpudriver import nvml_socket
from tests.daemon_support import (
    PROCESS_TIMEOUT,
    kill_daemon,
    run_mokka,
    running_daemon,
    stop_daemon,
)
from tests.gpudriver_support import toolkit_binary
from tests.podman_support import IMAGE, Podman, podman_fixture  # noqa: F401 (the fixture)
from tests.support import real_nvidia_smi, require_tool

#: The nvidia-smi line of a GPU's temperature, and the value `mokka ctl` pins.
TEMPERATURE = re.compile(rb"GPU Current Temp\s*:\s*(\d+) C")
PINNED = 77


def generate(driver_root: Path, output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The real ``nvidia-ctk cdi generate`` on ``driver_root``, its hook path the real one."""
    return subprocess.run(
        [str(toolkit_binary("nvidia-ctk")), "cdi", "generate", "--driver-root", str(driver_root),
         "--nvidia-cdi-hook-path", str(toolkit_binary("nvidia-cdi-hook")),
         "--output", str(output), *extra],
        capture_output=True, text=True, timeout=PROCESS_TIMEOUT, check=False,
    )


def podman_env(pod: Podman) -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(pod.conf)}


def in_container(pod: Podman, spec_dir: Path, command: str) -> list[str]:
    """argv of ``podman run`` with every GPU of the spec in ``spec_dir``, in a
    private mount namespace where that directory is ``/run/cdi``."""
    script = " && ".join([
        "mount -t tmpfs mokka-test /run", "mount -t tmpfs mokka-test /var/lib",
        f"mkdir -p /run/cdi && mount --bind {shlex.quote(str(spec_dir))} /run/cdi",
        "exec " + shlex.join(pod.argv("run", "--rm", "--network", "none", "--device",
                                      "nvidia.com/gpu=all", IMAGE, "/bin/sh", "-c", command)),
    ])
    return [require_tool("unshare"), "--mount", "--propagation", "private", "sh", "-c", script]


@pytest.mark.timeout(300)
async def test_nvml_works_in_a_container_from_the_toolkits_own_spec(
    tmp_path: Path, podman: Podman
) -> None:
    node_root = tmp_path / "node"
    node_root.mkdir()
    driver_root = node_root / layout.DRIVER_ROOT.lstrip("/")
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    with trio.fail_after(240):
        async with running_daemon(
            "--root", str(node_root), "--profile", "t4", "--health-addr", "127.0.0.1:0",
            "--nvidia-smi-binary", str(real_nvidia_smi()), cwd=tmp_path,
        ) as daemon:
            await daemon.wait_for_line(r"reconcile pass ok generation=1")
            await daemon.wait_for_line(r"engine config served at")
            uuid = (driver_root / "config/config.yaml").read_text()
            uuid = re.search(r'device\.0\.uuid: "([^"]+)"', uuid)[1]

            # The toolkit's spec mounts the daemon's socket where NVML looks.
            generated = await trio.to_thread.run_sync(
                generate, driver_root, spec_dir / "nvidia.yaml")
            assert generated.returncode == 0, generated.stderr
            spec = yaml.safe_load((spec_dir / "nvidia.yaml").read_text())
            mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
            assert mounts["/run/nvidia-persistenced/socket"] == str(
                node_root / nvml_socket.SOCKET.lstrip("/"))
            assert not any("config" in path for path in mounts)

            listed = await trio.run_process(
                in_container(podman, spec_dir, "nvidia-smi -L"), capture_stdout=True,
                capture_stderr=True, check=False, env=podman_env(podman))
            assert listed.returncode == 0, listed.stderr.decode() + listed.stdout.decode()
            assert f"GPU 0: NVIDIA Tesla T4 (UUID: {uuid})" in listed.stdout.decode() or (
                f"(UUID: {uuid})" in listed.stdout.decode()), listed.stdout.decode()

            # A `mokka ctl` change reaches nvidia-smi in a running container
            # within a second: the container reads the temperature over and
            # over until it sees the pinned value.
            loop = (f"i=0; while [ $i -lt 2000 ]; do out=$(nvidia-smi -q -d TEMPERATURE); "
                    f'echo "$out"; case "$out" in *"Temp"*": {PINNED} C"*) exit 0;; esac; '
                    "i=$((i+1)); done; exit 1")
            process = await trio.lowlevel.open_process(
                in_container(podman, spec_dir, loop), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=podman_env(podman))
            try:
                seen = b""
                while not TEMPERATURE.search(seen):
                    chunk = await process.stdout.receive_some(65536)
                    assert chunk, f"the container ended before a reading:\n{seen.decode()}"
                    seen += chunk
                assert int(TEMPERATURE.search(seen)[1]) != PINNED
                changed = trio.current_time()
                ctl = await trio.to_thread.run_sync(functools.partial(
                    run_mokka, "ctl", "--root", str(node_root), "temp", "--gpu", "0",
                    "--celsius", str(PINNED), cwd=tmp_path))
                assert ctl.returncode == 0, ctl.stderr
                seen = b""
                while not any(int(t) == PINNED for t in TEMPERATURE.findall(seen)):
                    chunk = await process.stdout.receive_some(65536)
                    assert chunk, f"the container ended without seeing {PINNED} C"
                    seen += chunk
                assert trio.current_time() - changed < 1.0
                assert await process.wait() == 0
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()

            # `--dev-root` names where `dev/nvidia*` are: the driver root
            # (docs/gpudriver.md, "Device nodes and --dev-root").
            with_dev_root = await trio.to_thread.run_sync(
                generate, driver_root, tmp_path / "dev-root.yaml", "--dev-root", str(driver_root))
            assert with_dev_root.returncode == 0, with_dev_root.stderr
            devices = yaml.safe_load((tmp_path / "dev-root.yaml").read_text())["devices"]
            nodes = {n["hostPath"] for d in devices for n in d["containerEdits"]["deviceNodes"]}
            assert nodes == {str(driver_root / "dev/nvidia0")}

            assert await stop_daemon(daemon, 15) == 0
    # Teardown took the socket with everything else.
    assert not (node_root / nvml_socket.SOCKET.lstrip("/")).exists()
    assert list(node_root.iterdir()) == []


async def test_cleanup_after_a_kill_removes_the_socket(tmp_path: Path) -> None:
    node_root = tmp_path / "node"
    node_root.mkdir()
    socket_path = node_root / nvml_socket.SOCKET.lstrip("/")
    with trio.fail_after(PROCESS_TIMEOUT):
        async with running_daemon(
            "--root", str(node_root), "--profile", "t4", "--health-addr", "127.0.0.1:0",
            cwd=tmp_path,
        ) as daemon:
            await daemon.wait_for_line(r"engine config served at")
            assert socket_path.is_socket()
            await kill_daemon(daemon)
    assert socket_path.is_socket()  # nothing of the teardown ran
    cleanup = await trio.to_thread.run_sync(functools.partial(
        run_mokka, "cleanup", "--root", str(node_root), cwd=tmp_path))
    assert cleanup.returncode == 0, cleanup.stderr
    assert list(node_root.iterdir()) == []
