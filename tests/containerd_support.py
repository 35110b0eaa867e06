"""Helpers for running containers through CRI on a real containerd (no tests here).

What the tests need, and nothing of the machine's own containerd:

* ``real_components``: where the real binaries are (containerd and its shim
  per version, ``ctr``, ``crictl``, runc, the NVIDIA Container Toolkit,
  busybox), failing the test with a clear message when one is missing;
* ``seed_node``, ``stage_node``, ``cleanup_node``: a Mokka node in a
  temporary root (``mokka daemon --once`` with the real toolkit), whose
  containerd main config is the version's packaged one plus the test's
  settings, and ``mokka cleanup`` of it;
* ``build_image``: a tiny OCI image (busybox plus the C libraries the real
  ``nvidia-smi`` and the mock NVML library need);
* ``staged_node``: all of the above for one containerd version, the way
  every real-containerd test and benchmark starts;
* ``Containerd``: a test-owned containerd with its own root, state, socket
  and a private mount namespace in which the node's files sit at their
  host paths (see ``Containerd.start``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from mokka import native
from mokka.errors import NativeArtifactMissing
from tests import consumers
from tests.support import ROOT, real_nvidia_smi, require_tool, snapshot

#: The image every container (and every pod sandbox) of the tests runs.
IMAGE = "localhost/mokka-cri-test:1"
#: busybox applets the image links (the container scripts use these).
APPLETS = ("sh", "ls", "cat", "echo", "sleep", "test", "[")
#: Bounds one crictl/ctr call; each takes well under a second here.
CALL_TIMEOUT = 60
#: The containerd series the real-containerd tests and benchmarks run, newest
#: first (``tests.consumers.containerd`` picks the pinned release of each).
SERIES = ("2.1", "1.7")
#: Makes a module-scoped fixture run once per series (its ``request.param``).
per_series = pytest.fixture(scope="module", params=SERIES, ids=lambda v: f"containerd-{v}")


@attrs.frozen
class Components:
    """The real binaries one containerd version's tests run."""

    #: the directory of ``containerd``: its shim and ``ctr`` are beside it
    bin_dir: Path
    #: the package's own ``/etc/containerd/config.toml``
    packaged_config: Path
    crictl: Path
    #: ``nvidia-ctk``, ``nvidia-container-runtime``, ``nvidia-cdi-hook`` and nothing
    #: else (the cri simulator installs every file of its ``--toolkit-dir``)
    toolkit_dir: Path
    busybox: Path

    @property
    def containerd(self) -> Path:
        return self.bin_dir / "containerd"

    @property
    def ctr(self) -> Path:
        return self.bin_dir / "ctr"


def real_components(version: str, scratch: Path) -> Components:
    """The real components for containerd ``version``, or fail the test naming what is missing.

    The one place that knows where they come from: the pinned consumers of
    ``scripts/install-consumers`` (``tests.consumers``), runc and a static
    busybox from ``scripts/install-system-deps``.  The toolkit's three
    binaries are linked into a directory of their own (``consumers.toolkit_dir``).
    """
    unpacked = consumers.containerd(version)
    # containerd's shims find runc on the PATH.
    require_tool("runc")
    return Components(
        bin_dir=unpacked.bin_dir,
        packaged_config=unpacked.bin_dir.parent.parent / "etc/containerd/config.toml",
        crictl=consumers.consumer("crictl"),
        toolkit_dir=consumers.toolkit_dir(),
        busybox=Path(require_tool("busybox")),
    )


# ---- the node -------------------------------------------------------------


def main_config(components: Components) -> str:
    """The version's packaged ``/etc/containerd/config.toml`` plus the test's CRI settings.

    Both settings go into the main config's CRI table, which the cri
    simulator's drop-in repeats (so they survive the import on 1.7 too).
    """
    packaged = components.packaged_config
    if not packaged.is_file():
        pytest.fail(f"{packaged} is missing: run scripts/install-consumers again")
    text = packaged.read_text()
    header = '[plugins."io.containerd.grpc.v1.cri"]\n'
    assert text.count(header) == 1, f"{packaged}: expected one CRI table, found:\n{text}"
    settings = (
        # No registry is reachable: the pod sandbox runs the test's own image.
        f'    sandbox_image = "{IMAGE}"\n'
        # This VM refuses oom_score_adj=-998, which CRI gives every pod
        # sandbox; restricted, containerd caps it at its own score instead.
        "    restrict_oom_score_adj = true\n"
    )
    return text.replace(header, header + settings)


def seed_node(root: Path, components: Components) -> None:
    """Make ``root`` look like a containerd node: what makes the cri simulator configure it.

    A ``/usr/bin/containerd`` (a stand-in file: the simulator only looks
    for one) and the version's main config (``main_config``).
    """
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/containerd").write_bytes(b"\x7fELF containerd stand-in\n")
    (root / "usr/bin/containerd").chmod(0o755)
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(main_config(components))


def stage_node(root: Path, components: Components) -> None:
    """A Mokka h100 node (``node-a``) in ``root`` (``mokka daemon --once``) with the real toolkit.

    The cri simulator runs the toolkit's ``nvidia-ctk`` on a scratch copy of
    the node's main config and adds the one marked ``imports`` line itself,
    naming ``/etc/containerd/conf.d/*.toml`` as on a real node.
    """
    try:
        native.artifact(native.NVML_LIBRARY)
    except NativeArtifactMissing as exc:
        pytest.fail(f"{exc}; build it with: .venv/bin/python native/build.py {ROOT}/mokka/_native")
    result = subprocess.run(
        [
            sys.executable, "-m", "mokka", "daemon", "--once", "--root", str(root),
            "--profile", "h100", "--node-name", "node-a", "--health-addr", "127.0.0.1:0",
            "--nvidia-smi-binary", str(real_nvidia_smi()),
            "--toolkit-dir", str(components.toolkit_dir),
            # The test starts its own containerd after staging.
            "--restart-mode", "none",
            # Nothing the containers here look at; keeps the pass short.
            "--ib-mode", "off", "--workload", "off",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def cleanup_node(root: Path) -> str:
    """``mokka cleanup --root``: what a daemon's teardown would remove, toolkit included."""
    result = subprocess.run(
        [sys.executable, "-m", "mokka", "cleanup", "--root", str(root)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


# ---- the image ------------------------------------------------------------


def ldd_closure(binaries: Sequence[Path]) -> set[Path]:
    """Every library path ``ldd`` names for ``binaries`` (the loader included)."""
    libs: set[Path] = set()
    for binary in binaries:
        out = subprocess.run(
            ["ldd", str(binary)], capture_output=True, text=True, check=True, timeout=30
        ).stdout
        libs.update(Path(word) for line in out.splitlines() for word in line.split()
                    if word.startswith("/"))
    return libs


def _tar_entry(tar: tarfile.TarFile, name: str, *, data: bytes | None = None,
               link: str | None = None, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.mode = mode
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
    elif data is None:
        info.type = tarfile.DIRTYPE
    else:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _blob(tar: tarfile.TarFile, media_type: str, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    _tar_entry(tar, f"blobs/sha256/{digest}", data=data, mode=0o644)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def build_image(path: Path, components: Components) -> None:
    """An OCI image layout tarball of one layer, for ``ctr images import``.

    The layer: a static busybox (the shell and tools) and the glibc files
    the real ``nvidia-smi`` and the mock NVML library load (``ldd``), at
    the paths ``ldd`` names; no ``nvidia-smi`` and no NVML library: those
    come from the CDI spec or not at all.  Its default command sleeps, so
    the image also serves as the pod sandbox.
    """
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for directory in ("bin", "dev", "proc", "sys", "tmp", "etc", "usr", "usr/bin"):
            _tar_entry(layer, directory)
        _tar_entry(layer, "bin/busybox", data=components.busybox.read_bytes())
        for applet in APPLETS:
            _tar_entry(layer, f"bin/{applet}", link="busybox")
        libraries = [real_nvidia_smi(), native.artifact(native.NVML_LIBRARY)]
        for lib in sorted(ldd_closure(libraries)):
            parent = ""
            for part in lib.parent.parts[1:]:
                parent = f"{parent}/{part}".lstrip("/")
                if parent not in layer.getnames():
                    _tar_entry(layer, parent)
            _tar_entry(layer, str(lib).lstrip("/"), data=lib.resolve().read_bytes())
    layer_bytes = layer_buf.getvalue()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": ["/bin/sleep", "2147483647"],
        },
        "rootfs": {"type": "layers",
                   "diff_ids": [f"sha256:{hashlib.sha256(layer_bytes).hexdigest()}"]},
    }
    with tarfile.open(path, mode="w") as tar:
        layer_desc = _blob(tar, "application/vnd.oci.image.layer.v1.tar", layer_bytes)
        config_desc = _blob(tar, "application/vnd.oci.image.config.v1+json",
                            json.dumps(config).encode())
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": config_desc, "layers": [layer_desc]}
        manifest_desc = _blob(tar, "application/vnd.oci.image.manifest.v1+json",
                              json.dumps(manifest).encode())
        manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
        manifest_desc["annotations"] = {
            "io.containerd.image.name": IMAGE,
            "org.opencontainers.image.ref.name": IMAGE.rsplit(":", 1)[1],
        }
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [manifest_desc]}
        _tar_entry(tar, "oci-layout", data=b'{"imageLayoutVersion": "1.0.0"}', mode=0o644)
        _tar_entry(tar, "index.json", data=json.dumps(index).encode(), mode=0o644)


# ---- containerd -----------------------------------------------------------


@attrs.frozen
class StagedNode:
    """A staged node, its image and the containerd to run on it (not started yet)."""

    containerd: Containerd
    #: the image tarball, for ``Containerd.import_image``
    image: Path
    #: the node root as seeded, before ``mokka daemon --once`` (``tests.support.snapshot``)
    before: dict
    #: the main config as seeded
    seeded_config: str

    @property
    def root(self) -> Path:
        return self.containerd.node_root


def staged_node(version: str, base: Path) -> StagedNode:
    """A Mokka h100 node for containerd ``version`` under ``base``.

    The node at ``base/node`` (``seed_node``, then ``stage_node``), the
    image at ``base/image.tar`` and the containerd's own files under
    ``base/containerd``.
    """
    components = real_components(version, base)
    root = base / "node"
    seed_node(root, components)
    before = snapshot(root)
    seeded_config = (root / "etc/containerd/config.toml").read_text()
    stage_node(root, components)
    build_image(base / "image.tar", components)
    return StagedNode(
        containerd=Containerd(components, base / "containerd", root),
        image=base / "image.tar",
        before=before,
        seeded_config=seeded_config,
    )


@attrs.frozen
class Container:
    """A finished container: its exit code and its output, by ``== section`` of the script."""

    exit_code: int
    sections: dict[str, list[str]]

    def nvidia_nodes(self) -> list[str]:
        return sorted(name for name in self.sections.get("dev", []) if name.startswith("nvidia"))


def _sections(lines: Sequence[str]) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] = sections.setdefault("", [])
    for line in lines:
        if line.startswith("== "):
            current = sections.setdefault(line[3:].strip(), [])
        else:
            current.append(line)
    return sections


@attrs.define(eq=False)
class Containerd:
    """A containerd of the test's own, in a private mount namespace.

    In that namespace (``unshare --mount --propagation private``: nothing
    mounted there reaches the machine) the node's files sit at the host
    paths the cri simulator's drop-in and CDI specs name:

    * tmpfs over ``/run`` and ``/var/lib`` (so the mount points below can
      be made, and what runc, NRI and the opt plugin keep there stays
      private), then the node's ``var/lib/nvml-mock`` and ``var/run/cdi``
      bind-mounted at ``/var/lib/nvml-mock`` and ``/run/cdi``;
    * the node's ``/etc/containerd`` bind-mounted at ``/etc/containerd``
      (the main config's ``imports`` names ``/etc/containerd/conf.d``);
    * read-only overlays of the node's ``usr/bin`` and ``usr/local`` on the
      machine's, so ``/usr/bin/nvidia-container-runtime`` (the ``nvidia``
      handler's ``BinaryName``) and ``/usr/bin/nvidia-cdi-hook`` resolve
      through the node's links to the installed toolkit.

    ``NVIDIA_CTK_CONFIG_FILE_PATH`` points the runtime (a child of the
    shim, which inherits containerd's environment) at the node's
    ``/etc/nvidia-container-runtime/config.toml`` instead of the machine's.
    Its own root, state and socket live in ``base``; the shims and every
    overlay mount of the snapshotter stay in the namespace and go with it.
    """

    components: Components
    base: Path
    node_root: Path
    _process: subprocess.Popen | None = None
    #: containerd's mount namespace (``mnt:[inode]``) and an open descriptor of
    #: it: held until stop() has killed what is left there, so the inode cannot
    #: be reused by another namespace whose processes stop() would then kill.
    _mount_ns: str | None = None
    _ns_fd: int | None = None

    @property
    def cgroup_parent(self) -> str:
        """The pods' cgroup parent: one of this containerd's own, never ``k8s.io``."""
        return f"mokka-cri-test-{self.base.parent.name}"

    @property
    def socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def log(self) -> Path:
        return self.base / "containerd.log"

    def start(self, timeout: float = 60) -> None:
        node = shlex.quote(str(self.node_root))
        mounts = [
            "mount -t tmpfs mokka-test /run",
            "mount -t tmpfs mokka-test /var/lib",
            "mkdir /var/lib/nvml-mock /run/cdi",
            f"mount --bind {node}/var/lib/nvml-mock /var/lib/nvml-mock",
            f"mount --bind {node}/var/run/cdi /run/cdi",
            f"mount --bind {node}/etc/containerd /etc/containerd",
            f"mount -t overlay mokka-test -o ro,lowerdir={node}/usr/bin:/usr/bin /usr/bin",
            f"mount -t overlay mokka-test -o ro,lowerdir={node}/usr/local:/usr/local /usr/local",
        ]
        argv = [
            str(self.components.containerd), "--config", "/etc/containerd/config.toml",
            "--root", str(self.base / "root"), "--state", str(self.base / "state"),
            "--address", str(self.socket),
        ]
        script = " && ".join([*mounts, "exec " + shlex.join(argv)])
        env = {
            # The version's shim before the machine's (Debian's 1.6 one in /usr/bin).
            "PATH": f"{self.components.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                    "/usr/bin:/sbin:/bin",
            "NVIDIA_CTK_CONFIG_FILE_PATH": str(
                self.node_root / "etc/nvidia-container-runtime/config.toml"
            ),
        }
        self.base.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self._process = subprocess.Popen(
                [require_tool("unshare"), "--mount", "--propagation", "private",
                 "sh", "-c", script],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                pytest.fail(f"containerd exited ({self._process.returncode}):\n{self.tail()}")
            if self.socket.exists():
                version = self.crictl("version", check=False)
                if version.returncode == 0:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"containerd did not serve CRI within {timeout}s:\n{self.tail()}")
            time.sleep(0.1)
        self._ns_fd = os.open(f"/proc/{self._process.pid}/ns/mnt", os.O_RDONLY)
        self._mount_ns = os.readlink(f"/proc/{self._process.pid}/ns/mnt")
        assert self._mount_ns != os.readlink("/proc/self/ns/mnt"), "unshare made no namespace"

    def in_namespace(self, path: str) -> Path:
        """``path`` as containerd (and every shim and runtime it starts) sees it."""
        assert self._process is not None, "containerd is not running"
        return Path(f"/proc/{self._process.pid}/root{path}")

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def crictl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.components.crictl), "--runtime-endpoint", f"unix://{self.socket}",
             "--image-endpoint", f"unix://{self.socket}", "--timeout", "30s", *args],
            capture_output=True, text=True, timeout=CALL_TIMEOUT, check=False,
        )
        if check:
            assert result.returncode == 0, (
                f"crictl {shlex.join(args)}: {result.stderr}\ncontainerd log:\n{self.tail()}"
            )
        return result

    def ctr(self, *args: str) -> str:
        result = subprocess.run(
            [str(self.components.ctr), "--address", str(self.socket), "--namespace", "k8s.io",
             *args],
            capture_output=True, text=True, timeout=CALL_TIMEOUT, check=False,
        )
        assert result.returncode == 0, f"ctr {shlex.join(args)}: {result.stderr}"
        return result.stdout

    def import_image(self, tarball: Path, timeout: float = 30) -> None:
        """``ctr images import``, then wait until CRI knows the image.

        CRI learns of an imported image from an event, a moment after ctr
        returns: a pod started before then tries to pull it.
        """
        self.ctr("images", "import", str(tarball))
        deadline = time.monotonic() + timeout
        while self.crictl("inspecti", IMAGE, check=False).returncode != 0:
            assert time.monotonic() < deadline, self.tail()
            time.sleep(0.05)

    def link_nri_socket(self, link: Path) -> None:
        """Point ``link`` at this containerd's NRI socket (again, after a restart).

        containerd makes the socket when its NRI plugin starts, which
        precedes CRI serving (``start`` waits for that).  A plugin connects
        through the link, so the link, not the plugin, follows a restart.
        """
        link.unlink(missing_ok=True)
        link.symlink_to(self.in_namespace("/run/nri/nri.sock"))

    # ---- pods and containers ------------------------------------------

    def run_pod(self, name: str, handler: str | None = None) -> str:
        """A pod sandbox on the node's network (no CNI here); its id."""
        config = self.base / f"pod-{name}.json"
        config.write_text(json.dumps(self._pod_config(name)))
        args = ["runp", *(("--runtime", handler) if handler else ()), str(config)]
        return self.crictl(*args).stdout.strip()

    def _pod_config(self, name: str) -> dict:
        logs = self.base / "logs" / name
        logs.mkdir(parents=True, exist_ok=True)
        return {
            "metadata": {"name": name, "namespace": "mokka-test", "uid": f"uid-{name}"},
            "log_directory": str(logs),
            "linux": {
                # cgroupfs: runc makes this directory in every hierarchy; stop() removes it.
                "cgroup_parent": f"/{self.cgroup_parent}",
                "security_context": {"namespace_options": {"network": 2}},
            },
        }

    def run_container(
        self, pod: str, pod_name: str, name: str, script: str, *,
        env: dict[str, str] | None = None, cdi_devices: Sequence[str] = (),
        annotations: dict[str, str] | None = None,
        mounts: Sequence[tuple[str, str]] = (), timeout: float = 60,
    ) -> Container:
        """Create and start a container running ``sh -c script``; wait for it to exit.

        ``mounts``: (host path, container path) pairs, bind-mounted read-only.
        """
        cid = self.start_container(
            pod, pod_name, name, ["/bin/sh", "-c", script], env=env,
            cdi_devices=cdi_devices, annotations=annotations, mounts=mounts)
        status = self.wait_exited(cid, timeout, name)
        lines = self.log_lines(pod_name, name)
        self.crictl("rm", cid)
        return Container(exit_code=int(status["exitCode"]), sections=_sections(lines))

    def start_container(
        self, pod: str, pod_name: str, name: str, command: Sequence[str], *,
        env: dict[str, str] | None = None, cdi_devices: Sequence[str] = (),
        annotations: dict[str, str] | None = None,
        mounts: Sequence[tuple[str, str]] = (),
        writable_mounts: Sequence[tuple[str, str]] = (),
    ) -> str:
        """Create and start a container running ``command``; its id (it may still run).

        ``mounts`` and ``writable_mounts``: (host path, container path) pairs,
        bind-mounted read-only and read-write.
        """
        binds = [(*pair, True) for pair in mounts] + [(*pair, False) for pair in writable_mounts]
        config = {
            "metadata": {"name": name},
            "image": {"image": IMAGE},
            "command": list(command),
            "envs": [{"key": k, "value": v} for k, v in (env or {}).items()],
            "log_path": f"{name}.log",
            "CDI_devices": [{"name": device} for device in cdi_devices],
            "annotations": annotations or {},
            "mounts": [{"container_path": container_path, "host_path": host_path,
                        "readonly": readonly} for host_path, container_path, readonly in binds],
        }
        path = self.base / f"container-{pod_name}-{name}.json"
        path.write_text(json.dumps(config))
        pod_path = self.base / f"pod-{pod_name}.json"
        cid = self.crictl("create", pod, str(path), str(pod_path)).stdout.strip()
        self.crictl("start", cid)
        return cid

    def log_lines(self, pod_name: str, name: str) -> list[str]:
        """What container ``name`` of pod ``pod_name`` has printed so far, line by line."""
        log = self.base / "logs" / pod_name / f"{name}.log"
        # CRI log lines: "<time> <stream> <F|P> <text>"
        return [line.split(" ", 3)[3] if line.count(" ") >= 3 else ""
                for line in log.read_text(errors="replace").splitlines()]

    def wait_exited(self, cid: str, timeout: float, name: str = "") -> dict:
        """The container's CRI status once it is ``CONTAINER_EXITED``, or fail the test."""
        deadline = time.monotonic() + timeout
        while True:
            status = json.loads(self.crictl("inspect", "-o", "json", cid).stdout)["status"]
            if status["state"] == "CONTAINER_EXITED":
                return status
            if time.monotonic() > deadline:
                pytest.fail(f"container {name or cid} still {status['state']} after {timeout}s")
            time.sleep(0.05)

    def remove(self, cid: str, timeout: float = 30) -> None:
        """Stop and remove a container that may still run.

        containerd 1.7 can still call a container "running" for a moment
        after its stop returned, and refuses ``rm`` (even ``--force``) then:
        the removal waits for the exited state first.
        """
        self.crictl("stop", "--timeout", "0", cid, check=False)
        self.wait_exited(cid, timeout)
        deadline = time.monotonic() + timeout
        # and its own record of the task may lag the status a moment longer
        while "still running" in (done := self.crictl("rm", cid, check=False)).stderr:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert done.returncode == 0, f"crictl rm {cid}: {done.stderr}\n{self.tail()}"

    # ---- teardown -----------------------------------------------------

    def stop(self, timeout: float = 30) -> list[str]:
        """Remove every pod, stop containerd, kill what is left in its namespace.

        Idempotent.  Returns what had to be forced (leftover processes,
        mounts under ``base``), so the caller can assert there was none.
        """
        forced: list[str] = []
        if self._process is None:
            return forced
        if self._process.poll() is None:
            self.crictl("rmp", "--all", "--force", check=False)
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                forced.append(f"containerd {self._process.pid} ignored SIGTERM")
                self._process.kill()
                self._process.wait(timeout=timeout)
        for pid in self._namespace_pids():
            with contextlib.suppress(ProcessLookupError):
                forced.append(f"process {pid} ({_comm(pid)}) left in containerd's namespace")
                os.kill(pid, signal.SIGKILL)
        try:
            self._wait_namespace_empty(timeout)
        finally:
            if self._ns_fd is not None:
                # The last reference: the namespace and every mount in it go now.
                os.close(self._ns_fd)
                self._ns_fd = None
        forced += self._remove_cgroups(timeout)
        for mount in self.mounts_below():
            forced.append(f"mount {mount}")
            subprocess.run(["umount", "-R", "-l", mount], timeout=CALL_TIMEOUT, check=False)
        self._process = None
        return forced

    def cgroups(self) -> list[Path]:
        """The pods' cgroup directories in every hierarchy, deepest first."""
        found = [
            path
            for top in Path("/sys/fs/cgroup").glob(f"*/{self.cgroup_parent}")
            if not top.parent.is_symlink()
            for path in [top, *top.rglob("*")]
            if path.is_dir()
        ]
        return sorted(found, key=lambda path: len(path.parts), reverse=True)

    def _remove_cgroups(self, timeout: float) -> list[str]:
        """Kill what is left in the pods' cgroups (a container's processes live in
        namespaces of their own, so a shim killed too early leaves them), then
        remove the directories."""
        forced: list[str] = []
        deadline = time.monotonic() + timeout
        while pids := {pid for cgroup in self.cgroups() for pid in _cgroup_pids(cgroup)}:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    forced.append(f"process {pid} ({_comm(pid)}) left in a pod's cgroup")
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                pytest.fail(f"processes {sorted(pids)} in {self.cgroup_parent} outlived SIGKILL")
            time.sleep(0.05)
        for cgroup in self.cgroups():
            try:
                cgroup.rmdir()
            except OSError as exc:
                forced.append(f"cgroup {cgroup}: {exc}")
        return sorted(set(forced))

    def _namespace_pids(self) -> list[int]:
        if self._mount_ns is None:
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "ns/mnt") == self._mount_ns:
                        pids.append(int(entry.name))
        return pids

    def _wait_namespace_empty(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._namespace_pids():
            if time.monotonic() > deadline:
                pytest.fail(f"processes {self._namespace_pids()} outlived SIGKILL")
            time.sleep(0.05)

    def mounts_below(self) -> list[str]:
        """Mount points in this (the machine's) namespace under ``base`` or the node root."""
        prefixes = (str(self.base) + "/", str(self.node_root) + "/")
        found = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefixes) or point in (str(self.base), str(self.node_root)):
                found.append(point)
        return sorted(found, reverse=True)


def _cgroup_pids(cgroup: Path) -> set[int]:
    try:
        return {int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()}
    except OSError:
        return set()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
