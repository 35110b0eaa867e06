"""The published CDI specs in a real CDI consumer: podman (Debian 4.3) with runc.

How the spec's host paths resolve here: the node is staged into a temporary
root as usual, and podman runs inside a throwaway mount namespace
(``unshare --mount``) where a tmpfs covers ``/var/lib`` and ``/run`` and the
staged ``var/lib/nvml-mock`` and ``var/run/cdi`` are bind-mounted at their
host paths.  podman thus reads the *published* spec, unchanged (it says
``/var/lib/nvml-mock/driver/dev/nvidia1``), from ``/var/run/cdi``, the
directory podman 4.3 always scans (it has no ``cdi_spec_dirs`` setting),
and nothing podman writes at run time reaches the machine's ``/run``.

The image is built from host files (no registry is reachable): ``/bin/sh``,
``ls``, ``cat`` and the ``ldd`` closure of those and of the real
``nvidia-smi``, imported with ``podman import``.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import stat
import subprocess
import tarfile
from pathlib import Path

import attrs
import pytest

from mokka import native
from mokka.errors import ApplyError, NativeArtifactMissing
from mokka.host import Host
from mokka.simulators.cri import CriSimulator
from mokka.simulators.fabricmanager import FabricManagerSimulator
from mokka.simulators.gpudriver import GpuDriverSettings, GpuDriverSimulator
from mokka.state.compile import compile_profile
from mokka.state.model import State
from tests.cri_support import fake_settings
from tests.support import ROOT, real_nvidia_smi, require_tool, snapshot

IMAGE = "localhost/mokka-cri-test:latest"
#: Bounds each podman call; a container here starts in about a second.
PODMAN_TIMEOUT = 180


@attrs.frozen
class Podman:
    """podman with storage, run root and config in a temporary directory."""

    base: Path

    @property
    def conf(self) -> Path:
        return self.base / "containers.conf"

    def argv(self, *args: str) -> list[str]:
        return [
            require_tool("podman"),
            "--root", str(self.base / "storage"),
            "--runroot", str(self.base / "runroot"),
            "--storage-driver", "vfs",
            "--cgroup-manager", "cgroupfs",
            "--runtime", "runc",
            *args,
        ]

    def run(self, *args: str, node_root: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``podman ARGS`` in a fresh mount namespace showing ``node_root``'s node files."""
        mounts = ["mount -t tmpfs mokka-test /run", "mount -t tmpfs mokka-test /var/lib"]
        if node_root is not None:
            for host_path, staged in (
                ("/var/lib/nvml-mock", node_root / "var/lib/nvml-mock"),
                ("/run/cdi", node_root / "var/run/cdi"),
            ):
                if staged.is_dir():
                    source = shlex.quote(str(staged))
                    mounts.append(f"mkdir -p {host_path} && mount --bind {source} {host_path}")
        script = " && ".join([*mounts, "exec " + shlex.join(self.argv(*args))])
        env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}
        return subprocess.run(
            [require_tool("unshare"), "--mount", "--propagation", "private", "sh", "-c", script],
            capture_output=True, text=True, timeout=PODMAN_TIMEOUT, env=env, check=False,
        )

    def container(
        self, device: str, command: str, node_root: Path
    ) -> subprocess.CompletedProcess[str]:
        return self.run(
            "run", "--rm", "--network", "none", "--device", device, IMAGE, "/bin/sh", "-c", command,
            node_root=node_root,
        )


def _ldd_closure(binaries: list[Path]) -> set[Path]:
    libs: set[Path] = set()
    for binary in binaries:
        ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True)
        out = ldd.stdout
        for line in out.splitlines():
            for word in line.split():
                if word.startswith("/"):
                    libs.add(Path(word))
    return libs


def _image_tar(extra_binaries: list[Path]) -> bytes:
    """A root filesystem of host files: a shell, ls, cat and the libraries they all need."""
    tools = [Path("/bin/sh"), Path("/bin/ls"), Path("/bin/cat")]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for directory in ("bin", "dev", "proc", "sys", "tmp", "etc", "usr", "usr/bin", "usr/lib64"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for tool in tools:
            tar.add(os.path.realpath(tool), arcname=f"bin/{tool.name}")
        for lib in sorted(_ldd_closure(tools + extra_binaries)):
            tar.add(os.path.realpath(lib), arcname=str(lib).lstrip("/"))
    return buf.getvalue()


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    """podman with the test image imported (once per module)."""
    base = tmp_path_factory.mktemp("podman")
    pod = Podman(base)
    pod.conf.write_text(
        '[containers]\ndefault_ulimits = []\n\n[engine]\nevents_logger = "none"\n'
        'cgroup_manager = "cgroupfs"\nruntime = "runc"\n'
    )
    extra = [real_nvidia_smi()]
    # The library's dependencies are libc's anyway; the nvidia-smi test says
    # what is missing when it is not built.
    with contextlib.suppress(NativeArtifactMissing):
        extra.append(native.artifact(native.NVML_LIBRARY))
    tar = base / "rootfs.tar"
    tar.write_bytes(_image_tar(extra))
    result = pod.run("import", str(tar), IMAGE)
    assert result.returncode == 0, result.stderr
    return pod


def h100() -> State:
    return compile_profile("h100", node_name="node-a")


@pytest.fixture
def stand_in_native(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A native build holding a stand-in library (the device checks need no NVML)."""
    directory = tmp_path / "native"
    directory.mkdir()
    (directory / native.NVML_LIBRARY).write_bytes(b"\x7fELF stand-in for the mock NVML library\n")
    (directory / native.FALLBACK_NVIDIA_SMI).write_bytes(b"#!/bin/sh\n")
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(directory))
    return directory


@attrs.frozen
class Node:
    """The simulators whose files the specs name, staged; cri built but not applied."""

    driver: GpuDriverSimulator
    fabric: FabricManagerSimulator
    cri: CriSimulator


async def stage_node(host: Host, state: State) -> Node:
    """gpudriver (real nvidia-smi) and the fabric manager stage; cri stages."""
    node = Node(
        driver=GpuDriverSimulator(
            settings=GpuDriverSettings(nvidia_smi_binary=real_nvidia_smi(), publish="symlink")
        ),
        fabric=FabricManagerSimulator(),
        # Runtime setup off; host commands point at the stand-ins, never the machine's.
        cri=CriSimulator(fake_settings(container_runtime=False)),
    )
    await node.driver.stage(host, state)
    await node.fabric.stage(host, state)
    await node.cri.stage(host, state)
    return node


async def teardown(host: Host, node: Node) -> None:
    await node.cri.revoke(host)
    for simulator in (node.cri, node.fabric, node.driver):
        await simulator.discard(host)


def device_numbers(listing: str) -> dict[str, tuple[int, int]]:
    """``ls -ln`` lines of character devices: name -> (major, minor)."""
    numbers = {}
    for line in listing.splitlines():
        fields = line.split()
        if line.startswith("c") and len(fields) >= 10:
            numbers[fields[-1]] = (int(fields[4].rstrip(",")), int(fields[5]))
    return numbers


def nvidia_nodes(listing: str) -> list[str]:
    return sorted(name for name in listing.split() if name.startswith("nvidia"))


async def test_container_gets_exactly_the_requested_gpu(
    podman: Podman, host: Host, node_root: Path, stand_in_native: Path
) -> None:
    before = snapshot(node_root)
    state = h100()
    node = await stage_node(host, state)
    await node.cri.apply(host, state)
    minor = state.gpu(1).minor
    controls = ["nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]

    result = podman.container("nvidia.com/gpu=1", "ls /dev", node_root)
    assert result.returncode == 0, result.stderr
    assert nvidia_nodes(result.stdout) == sorted([f"nvidia{minor}", *controls])

    # Each node inside the container is a character device with the staged
    # node's numbers (a name alone would pass with a regular file).
    result = podman.container("nvidia.com/gpu=1", "ls -ln /dev", node_root)
    assert result.returncode == 0, result.stderr
    inside = device_numbers(result.stdout)
    assert inside[f"nvidia{minor}"] == (195, minor)
    assert inside["nvidiactl"] == (195, 255)
    dev_dir = node_root / "var/lib/nvml-mock/driver/dev"
    for name in [f"nvidia{minor}", *controls]:
        staged = os.stat(dev_dir / name)
        assert stat.S_ISCHR(staged.st_mode), f"{name} was staged as a placeholder"
        assert inside[name] == (os.major(staged.st_rdev), os.minor(staged.st_rdev)), name

    # The UUID entry names the same GPU.
    result = podman.container(f"nvidia.com/gpu={state.gpu(1).uuid}", "ls /dev", node_root)
    assert result.returncode == 0, result.stderr
    assert nvidia_nodes(result.stdout) == sorted([f"nvidia{minor}", *controls])

    result = podman.container("nvidia.com/gpu=all", "ls /dev", node_root)
    assert result.returncode == 0, result.stderr
    every = [f"nvidia{g.minor}" for g in state.gpus]
    assert nvidia_nodes(result.stdout) == sorted([*every, *controls])

    # The NRI plugin's kind carries device nodes only: no library, no env.
    result = podman.container(
        "mokka.nvidia.com/gpu=1", "ls /dev; ls /usr/lib64; echo env=$MOCK_NVML_CONFIG", node_root
    )
    assert result.returncode == 0, result.stderr
    assert nvidia_nodes(result.stdout) == sorted([f"nvidia{minor}", *controls])
    assert "libnvidia-ml.so.1" not in result.stdout
    assert "env=\n" in result.stdout

    # Mounts and env of the full kind: the engine config is where the env says.
    result = podman.container(
        "nvidia.com/gpu=0",
        'cat "$MOCK_NVML_CONFIG" > /dev/null && echo config-ok; ls /usr/lib64 /usr/bin; '
        "ls -d /var/lib/nvml-mock/fabric-state",
        node_root,
    )
    assert result.returncode == 0, result.stderr
    assert "config-ok" in result.stdout
    assert "libnvidia-ml.so.1" in result.stdout
    assert "nvidia-smi" in result.stdout
    assert "/var/lib/nvml-mock/fabric-state" in result.stdout

    await teardown(host, node)
    assert snapshot(node_root) == before
    # Revoked: podman no longer knows the kind.
    result = podman.container("nvidia.com/gpu=1", "true", node_root)
    assert result.returncode != 0
    assert "unresolvable CDI devices nvidia.com/gpu=1" in result.stderr


async def test_spec_for_a_missing_device_node_is_never_published(
    podman: Podman, host: Host, node_root: Path, stand_in_native: Path
) -> None:
    before = snapshot(node_root)
    state = h100()
    node = await stage_node(host, state)
    os.unlink(node_root / f"var/lib/nvml-mock/driver/dev/nvidia{state.gpu(1).minor}")
    with pytest.raises(ApplyError, match=r"nvidia1 does not exist"):
        await node.cri.apply(host, state)
    assert not (node_root / "var/run/cdi").exists()
    result = podman.container("nvidia.com/gpu=0", "true", node_root)
    assert result.returncode != 0
    assert "unresolvable CDI devices nvidia.com/gpu=0" in result.stderr

    await teardown(host, node)
    assert snapshot(node_root) == before


async def test_nvidia_smi_in_the_container_lists_only_its_gpu(
    podman: Podman, host: Host, node_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real nvidia-smi 535 with the mock NVML library, both injected by the spec."""
    try:
        native.artifact(native.NVML_LIBRARY)
    except NativeArtifactMissing as exc:
        pytest.fail(f"{exc}; build it with: .venv/bin/python native/build.py {ROOT}/mokka/_native")
    before = snapshot(node_root)
    state = h100()
    node = await stage_node(host, state)
    await node.cri.apply(host, state)

    result = podman.container("nvidia.com/gpu=1", "nvidia-smi -L", node_root)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    assert state.gpu(1).uuid in lines[0]

    result = podman.container("nvidia.com/gpu=all", "nvidia-smi -L", node_root)
    assert result.returncode == 0, result.stdout + result.stderr
    listed = result.stdout.strip().splitlines()
    assert len(listed) == len(state.gpus)
    for gpu, line in zip(state.gpus, listed, strict=True):
        assert gpu.uuid in line

    await teardown(host, node)
    assert snapshot(node_root) == before
