"""A test kubelet for real device plugins, and the real NVIDIA device plugin run against it.

The kubelet side of the v1beta1 device plugin API, compiled at test time from
``tests/data/deviceplugin_v1beta1.proto`` (the published .proto) with the
pod-resources tests' protoc helper: a ``Registration`` server on
``kubelet.sock`` that, as the kubelet's device manager does, dials each
registering plugin's endpoint and keeps a ``ListAndWatch`` stream open,
recording every list it sends.

The plugin (``k8s-device-plugin``) is a Go program: it reads
``/sys/bus/pci/devices/<bdf>/numa_node`` directly, where the preload shim
cannot reach, and puts its socket under the hard-coded
``/var/lib/kubelet/device-plugins`` and its CDI specs under ``/var/run/cdi``.
``start_plugin`` therefore runs it in a private mount namespace
(``unshare -m``, propagation private) in which the node's PCI tree is bound
over ``/sys/bus/pci`` and ``/sys/devices`` and the test's own directories over
``/var/lib`` and ``/run``: the host's view changes nowhere, and the namespace,
with its mounts, goes with the process.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from types import ModuleType

import attrs
import grpc

from tests.consumers import consumer
from tests.podresources_support import compile_proto
from tests.support import DATA

PROTO = DATA / "deviceplugin_v1beta1.proto"
#: The v1beta1 API's socket directory; the plugin hard-codes it for its own socket.
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins"
#: Bound on every wait for the plugin (start-up, registration, an update).
WAIT = 30.0


def device_plugin_binary() -> Path:
    """The real ``nvidia-device-plugin`` (k8s-device-plugin v0.17.4) that
    ``scripts/install-consumers`` builds, or fail the test saying so: never a skip."""
    return consumer("nvidia-device-plugin")


def compile_api(out: Path) -> tuple[ModuleType, ModuleType]:
    """``(pb2, pb2_grpc)`` of the device plugin API, generated into ``out``."""
    return compile_proto(PROTO, out)


@attrs.define(eq=False)
class Registration:
    """One plugin's registration, and the lists its ``ListAndWatch`` stream sent since."""

    request: object
    channel: grpc.Channel
    stub: object
    updates: list = attrs.field(factory=list)
    #: why the stream ended (None: still open)
    ended: str | None = None
    _changed: threading.Condition = attrs.field(factory=threading.Condition)

    def record(self, response) -> None:
        with self._changed:
            self.updates.append(response)
            self._changed.notify_all()

    def end(self, reason: str) -> None:
        with self._changed:
            self.ended = reason
            self._changed.notify_all()

    def wait_updates(self, count: int, timeout: float = WAIT) -> list:
        """At least ``count`` lists (the first is the initial one); all of them."""
        with self._changed:
            if not self._changed.wait_for(
                lambda: len(self.updates) >= count or self.ended is not None, timeout
            ):
                raise AssertionError(
                    f"{len(self.updates)} ListAndWatch lists after {timeout} s, waited for {count}"
                )
            assert len(self.updates) >= count, (
                f"ListAndWatch ended ({self.ended}) after {len(self.updates)} lists, "
                f"waited for {count}"
            )
            return list(self.updates)


@attrs.define(eq=False)
class Kubelet:
    """``Registration`` on ``<directory>/kubelet.sock``, as the kubelet's device manager."""

    pb2: ModuleType
    pb2_grpc: ModuleType
    directory: Path
    registrations: queue.Queue = attrs.field(factory=queue.Queue)
    _server: grpc.Server | None = None
    _dir_fd: int | None = None
    _open: list[Registration] = attrs.field(factory=list)

    @property
    def socket(self) -> Path:
        return self.directory / "kubelet.sock"

    def _address(self, name: str) -> str:
        # Through the directory's descriptor: a test directory's path can be
        # longer than a unix socket address allows.
        return f"unix:/proc/self/fd/{self._dir_fd}/{name}"

    def _register(self, request, context: grpc.ServicerContext):
        # The kubelet answers first, then dials the endpoint and watches it.
        threading.Thread(target=self._watch, args=(request,), daemon=True).start()
        return self.pb2.Empty()

    def _watch(self, request) -> None:
        channel = grpc.insecure_channel(self._address(request.endpoint))
        registration = Registration(
            request, channel, self.pb2_grpc.DevicePluginStub(channel)
        )
        self._open.append(registration)
        self.registrations.put(registration)
        try:
            for response in registration.stub.ListAndWatch(self.pb2.Empty()):
                registration.record(response)
        except grpc.RpcError as error:
            registration.end(f"{error.code()}: {error.details()}")
        else:
            registration.end("closed by the plugin")

    def next_registration(self, timeout: float = WAIT) -> Registration:
        try:
            return self.registrations.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no device plugin registered within {timeout} s") from None

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.pb2_grpc.add_RegistrationServicer_to_server(_Servicer(self._register), server)
        self._dir_fd = os.open(self.directory, os.O_PATH | os.O_DIRECTORY)
        server.add_insecure_port(self._address(self.socket.name))
        server.start()
        self._server = server

    def stop(self) -> None:
        for registration in self._open:
            registration.channel.close()
        if self._server is not None:
            self._server.stop(grace=None).wait(10)
            self._server = None
        self.socket.unlink(missing_ok=True)
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None


class _Servicer:
    """The generated ``RegistrationServicer`` interface, answered by one callable."""

    def __init__(self, register: Callable) -> None:
        self.Register = register


@attrs.define(eq=False)
class LoggedProcess:
    """A real process (the plugin, the daemon) whose log (stdout and stderr) a
    thread reads line by line, so a test can wait for a line with a deadline."""

    process: subprocess.Popen
    lines: list[str] = attrs.field(factory=list)
    #: the log has ended (the process closed its output: it exited)
    ended: bool = False
    _changed: threading.Condition = attrs.field(factory=threading.Condition)
    _reader: threading.Thread | None = None

    @classmethod
    def spawn(cls, argv: list[str], env: dict[str, str]) -> LoggedProcess:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=env,
        )
        logged = cls(process)
        logged._reader = threading.Thread(target=logged._read, daemon=True)
        logged._reader.start()
        return logged

    def _read(self) -> None:
        for raw in self.process.stdout:
            with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()
        self.process.stdout.close()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    def wait_for_line(self, needle: str, timeout: float = WAIT, *, after: int = 0) -> int:
        """The index of the first log line from ``after`` on that holds ``needle``."""
        def found() -> int | None:
            for index in range(after, len(self.lines)):
                if needle in self.lines[index]:
                    return index
            return None

        deadline = time.monotonic() + timeout
        with self._changed:
            while (index := found()) is None:
                left = deadline - time.monotonic()
                if left <= 0 or self.ended:
                    raise AssertionError(
                        f"{self.process.args[0]} did not log {needle!r} (exit status "
                        f"{self.process.poll()}); log:\n" + "\n".join(self.lines[-60:])
                    )
                self._changed.wait(min(left, 1.0))
            return index

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def stop(self) -> int:
        """SIGTERM (the plugin removes its socket, the daemon tears the node down),
        SIGKILL past the deadline; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self._reader is not None:
            self._reader.join(WAIT)
        return self.process.returncode


def start_plugin(
    *, node_root: Path, var_lib: Path, run: Path, config: Path, env: dict[str, str],
    driver_root_ctr: Path | None = None,
) -> LoggedProcess:
    """The plugin on the node published at ``<node_root>/run/nvidia/driver``, as a
    user runs it on a host: ``--driver-root`` at the published driver root (the
    host's path, which its CDI spec names), ``--driver-root-ctr-path`` at
    ``driver_root_ctr`` (where the plugin reads the driver; default the same
    published root: the plugin is not in a container, so the host's path is its
    own), NVML from there through ``LD_LIBRARY_PATH`` (the plugin checks for NVML
    with a plain ``dlopen("libnvidia-ml.so.1")`` before it uses the driver root),
    the flags that change in the plugin's config file ``config`` (a SIGHUP
    re-reads it).  In its mount namespace the node's PCI tree is bound over
    ``/sys/bus/pci`` and ``/sys/devices`` (the tree's links are relative, so both),
    ``var_lib`` over ``/var/lib`` and ``run`` over ``/run``.

    ``driver_root_ctr`` matters for the plugin's own CDI spec: on a node root
    whose ``run/nvidia/driver`` is a symlink (a local or test root), the
    toolkit's ``nvcdi`` resolves the links of every library it finds and then
    strips the driver root as a prefix, which a resolved path no longer has:
    every library is dropped from the spec.  Reading the driver from the
    directory itself (``var/lib/nvml-mock/driver``), as a container sees its
    mount of the driver root, keeps them (``driver_root_directory``)."""
    driver = node_root / "run/nvidia/driver"
    ctr = driver if driver_root_ctr is None else driver_root_ctr
    sys_root = node_root / "var/lib/nvml-mock/sys"
    binds = [
        (sys_root / "bus/pci", "/sys/bus/pci"),
        (sys_root / "devices", "/sys/devices"),
        (var_lib, "/var/lib"),
        (run, "/run"),
    ]
    script = " && ".join(f'mount --bind "{src}" "{dst}"' for src, dst in binds)
    argv = [
        "unshare", "--mount", "--propagation", "private", "--",
        "sh", "-c", f'{script} && exec "$0" "$@"',
        str(device_plugin_binary()),
        f"--driver-root={driver}", f"--driver-root-ctr-path={ctr}",
        f"--config-file={config}", "--fail-on-init-error=true",
    ]
    return LoggedProcess.spawn(argv, {**env, "LD_LIBRARY_PATH": str(ctr / "usr/lib64")})


def driver_root_directory(node_root: Path) -> Path:
    """The driver root itself (no link on the way), as a container's mount shows it."""
    return node_root / "var/lib/nvml-mock/driver"


#: The spec the plugin writes under its ``cdi-*`` strategies (in ``/var/run/cdi``).
PLUGIN_SPEC = "k8s.device-plugin.nvidia.com-gpu.json"
#: The CDI kind of the plugin's devices (named by UUID).
PLUGIN_CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"


def plugin_cdi_spec(*, node_root: Path, base: Path, env: dict[str, str]) -> Path:
    """The plugin's own CDI spec for the node at ``node_root``: the plugin run once
    under ``cdi-annotations`` (reading the driver from ``driver_root_directory``)
    against a kubelet of its own under ``base``, stopped once registered; the
    spec's path (in ``base``)."""
    run = base / "run"
    run.mkdir(parents=True, exist_ok=True)
    pb2, pb2_grpc = compile_api(base)
    config = base / "plugin-config.json"
    config.write_text(
        '{"version": "v1", "flags": {"plugin": {"deviceListStrategy": ["cdi-annotations"]}}}')
    kubelet = Kubelet(pb2, pb2_grpc, base / "var-lib/kubelet/device-plugins")
    kubelet.start()
    plugin = start_plugin(node_root=node_root, var_lib=base / "var-lib", run=run,
                          config=config, env=env,
                          driver_root_ctr=driver_root_directory(node_root))
    try:
        plugin.wait_for_line("Registered device plugin for 'nvidia.com/gpu'")
    finally:
        plugin.stop()
        kubelet.stop()
    return run / "cdi" / PLUGIN_SPEC
