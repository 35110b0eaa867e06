"""podman as the suite runs it: a throwaway mount namespace, storage in a temporary directory.

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
``nvidia-smi``, imported with ``podman import``.  A test module takes the
``podman`` fixture by importing ``podman_fixture``.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import subprocess
import tarfile
from pathlib import Path

import attrs
import pytest

from mokka import native
from mokka.errors import NativeArtifactMissing
from tests.support import real_nvidia_smi, require_tool

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


@pytest.fixture(scope="module", name="podman")
def podman_fixture(tmp_path_factory: pytest.TempPathFactory) -> Podman:
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
