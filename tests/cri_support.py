"""Helpers shared by the cri tests (no tests here): states, driver files, real tools, fakes.

The NVIDIA Container Toolkit is the real release (``nvidia-ctk`` v1.20.2,
``real_component``), and so is containerd wherever a test asks it for its
merged config (``config_dump``: the machine's 1.6, 1.7.24 and 2.1.9, no
daemon started).  The one stand-in left is
``tests/data/fake-toolkit/fake-systemctl``: it records calls and answers
``is-active``, because a test must never restart the machine's own
containerd.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import attrs
import jsonschema
import pytest
import referencing
import referencing.jsonschema
import yaml

from mokka import layout
from mokka.noderoot.commands import SubprocessRunner
from mokka.noderoot.host import Artifact, CharDevice, Directory, File, Host, Symlink
from mokka.simulators.cri.settings import CriSettings
from mokka.state.model import Fabric, Gpu, Nvlink, NvlinkSwitch, State, System
from tests import consumers
from tests.support import DATA, require_tool

DRIVER = "580.105.08"
#: H100 HGX bus numbers (SURFACES §2.1), in index order.
H100_BUSES = ("53", "64", "75", "86", "97", "a8", "b9", "ca")
FAKE_TOOLKIT = DATA / "fake-toolkit"
#: Manifest owner the tests stage the driver files with (standing in for gpudriver).
DRIVER_OWNER = "test-driver"
#: Debian's containerd 1.6 default config (/etc/containerd/config.toml).
DEBIAN_CONTAINERD_CONFIG = """\
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""


def uuid(i: int) -> str:
    return f"GPU-5f0e3c2a-8b1d-4c6e-9a7f-{i:012x}"


def h100_state(
    gpus: int = 8, *, nvswitch: bool = True, minors: tuple[int, ...] | None = None
) -> State:
    """An HGX H100 node: 8 GPUs behind NVSwitches (so a fabric manager runs)."""
    minors = minors or tuple(range(gpus))
    nvlink = None
    if nvswitch:
        switches = tuple(NvlinkSwitch(bdf=f"0000:0{i}:00.0", uuid=f"SW-{i}") for i in range(4))
        nvlink = Nvlink(
            version=4, links_per_gpu=18, bandwidth_per_link_mbps=26562, switches=switches
        )
    return State(
        generation=1,
        content_hash=f"h100-{gpus}-{nvswitch}-{minors}",
        node_name="node-a",
        profile_name="h100",
        system=System(
            driver_version=DRIVER, nvml_version="13." + DRIVER, cuda_version_major=13,
            cuda_version_minor=0,
        ),
        gpus=tuple(
            Gpu(
                index=i, minor=minors[i], uuid=uuid(i), serial=f"165432100000{i}",
                name="NVIDIA H100 80GB HBM3", brand="Nvidia", architecture="hopper",
                bus_id=f"0000:{H100_BUSES[i]}:00.0", pci_vendor_id=0x10DE, pci_device_id=0x2330,
                pci_subsystem_vendor_id=0x10DE, pci_subsystem_device_id=0x16C1,
                root_complex="pci0000:00", numa_node=0,
                fabric=Fabric(cluster_uuid="00000000-0000-0000-0000-000000000000", clique_id=0,
                              state="completed"),
            )
            for i in range(gpus)
        ),
        nvlink=nvlink,
    )


def driver_artifacts(state: State, *, imex: bool = False, fabric: bool = True) -> list[Artifact]:
    """The driver-tree files the specs name, as gpudriver (and imex, fabricmanager) stage them."""
    dev, lib, bin_ = layout.DRIVER_DEV, layout.DRIVER_LIB, layout.DRIVER_BIN
    arts: list[Artifact] = [CharDevice(f"{dev}/nvidia{g.minor}", 195, g.minor) for g in state.gpus]
    arts += [
        CharDevice(f"{dev}/nvidiactl", 195, 255),
        CharDevice(f"{dev}/nvidia-uvm", 510, 0),
        CharDevice(f"{dev}/nvidia-uvm-tools", 510, 1),
        File(f"{lib}/libnvidia-ml.so.{state.system.driver_version}", b"\x7fELF stand-in\n", 0o755),
        Symlink(f"{lib}/libnvidia-ml.so.1", f"libnvidia-ml.so.{state.system.driver_version}"),
        File(f"{bin_}/nvidia-smi", b"#!/bin/sh\n", 0o755),
        Directory(layout.CONFIG_DIR),
        File(layout.ENGINE_CONFIG, b"version: 1\n"),
    ]
    if fabric:
        arts.append(Directory(layout.FABRIC_STATE_DIR))
    if imex:
        arts += [File(f"{bin_}/{n}", b"#!/bin/sh\n", 0o755)
                 for n in ("nvidia-imex", "nvidia-imex-ctl", "nvidia-imex.real")]
    return arts


def stage_driver(host: Host, state: State, **kwargs: bool) -> None:
    host.converge(DRIVER_OWNER, driver_artifacts(state, **kwargs))


#: The containerd builds the tests ask for their merged config, by short version.
CONTAINERD_VERSIONS = ("1.7", "2.1")


def real_component(name: str) -> Path:
    """Where a real component the cri tests run lives, or fail the test saying how to get it.

    ``toolkit``: the NVIDIA Container Toolkit release (the image's
    ``--toolkit-dir``: ``nvidia-ctk``, ``nvidia-cdi-hook``,
    ``nvidia-container-runtime``); ``containerd-1.7`` / ``containerd-2.1``:
    Debian's containerd package, unpacked (``usr/bin/containerd``, and
    ``etc/containerd/config.toml``, the config the package ships).  Both
    come from ``scripts/install-consumers`` (``tests.consumers``).
    """
    if name == "toolkit":
        return consumers.toolkit_dir()
    return consumers.containerd(name.removeprefix("containerd-")).bin_dir.parent.parent


def containerd_binary(version: str) -> Path:
    return real_component(f"containerd-{version}") / "usr/bin/containerd"


def packaged_config(version: str) -> str:
    """The ``/etc/containerd/config.toml`` Debian's package of ``version`` ships (config v2)."""
    path = real_component(f"containerd-{version}") / "etc/containerd/config.toml"
    if not path.is_file():
        pytest.fail(f"{path} is missing: unpack Debian's containerd {version} .deb again")
    return path.read_text()


def default_config(version: str) -> str:
    """``containerd config default`` of ``version`` (2.1: config version 3)."""
    result = subprocess.run(
        [str(containerd_binary(version)), "config", "default"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def config_dump(root: Path, version: str | None = None) -> dict:
    """containerd ``version``'s merged config for the node root's ``/etc/containerd``
    (``None``: the machine's own containerd, Debian's 1.6, found on ``PATH``).

    ``config dump`` needs no running daemon.  It runs in a throwaway mount
    namespace with ``<root>/etc/containerd`` bind-mounted over the
    machine's, so the ``imports`` line (a host path) resolves to the files
    the test's node holds; nothing of the machine's own containerd is read
    or touched.
    """
    containerd = require_tool("containerd") if version is None else containerd_binary(version)
    unshare = require_tool("unshare")
    if not Path("/etc/containerd").is_dir():
        pytest.fail(
            "/etc/containerd is missing (the mount point of the node's containerd config): "
            "reinstall Debian's containerd package (./scripts/install-system-deps)"
        )
    script = (
        f"mount --bind {root}/etc/containerd /etc/containerd && "
        f"exec {containerd} --config /etc/containerd/config.toml config dump"
    )
    result = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    return tomllib.loads(result.stdout)


def seed_containerd_host(root: Path, config: str = DEBIAN_CONTAINERD_CONFIG) -> None:
    """Make the node root look like a containerd node: the binary and a main config."""
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/bin/containerd").write_bytes(b"\x7fELF containerd stand-in\n")
    (root / "usr/bin/containerd").chmod(0o755)
    (root / "etc/containerd").mkdir(parents=True, exist_ok=True)
    (root / "etc/containerd/config.toml").write_text(config)


@attrs.define(eq=False)
class RecordingRunner:
    """``Host``'s command runner: runs each command for real and records its argv."""

    calls: list[list[str]] = attrs.field(factory=list)

    def run(self, argv, **kwargs) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        return SubprocessRunner().run(argv, **kwargs)

    def ctk_calls(self) -> list[list[str]]:
        return [c for c in self.calls if c[0].endswith("/nvidia-ctk")]


@attrs.frozen
class Fakes:
    """Where the systemctl stand-in records its calls."""

    systemctl_log: Path
    #: what ``is-active containerd`` answers (write "failed" to take containerd down)
    containerd_state: Path

    def systemctl_calls(self) -> list[list[str]]:
        return _json_lines(self.systemctl_log)


def _json_lines(path: Path) -> list:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def install_fakes(tmp_path: Path, monkeypatch) -> Fakes:
    """Point the systemctl stand-in's log into ``tmp_path`` (outside the node root)."""
    fakes = Fakes(
        systemctl_log=tmp_path / "systemctl.log",
        containerd_state=tmp_path / "containerd.state",
    )
    fakes.containerd_state.write_text("active\n")
    monkeypatch.setenv("MOKKA_FAKE_SYSTEMCTL_LOG", str(fakes.systemctl_log))
    monkeypatch.setenv("MOKKA_FAKE_CONTAINERD_STATE", str(fakes.containerd_state))
    return fakes


def fake_settings(**overrides) -> CriSettings:
    """Settings wired to the real toolkit and the recording systemctl."""
    values = {
        "systemctl": (str(FAKE_TOOLKIT / "fake-systemctl"),),
        "command_timeout": 30.0,
    }
    values.update(overrides)
    if "toolkit_dir" not in values:
        values["toolkit_dir"] = real_component("toolkit")
    return CriSettings(**values)


def cdi_validator() -> jsonschema.Draft7Validator:
    """The CDI JSON schema (tests/data/cdi-schema), with ``defs.json`` resolvable."""
    schema_dir = DATA / "cdi-schema"
    schema = json.loads((schema_dir / "schema.json").read_text())
    defs = json.loads((schema_dir / "defs.json").read_text())
    resource = referencing.Resource.from_contents(
        defs, default_specification=referencing.jsonschema.DRAFT7
    )
    registry = referencing.Registry().with_resource("defs.json", resource)
    return jsonschema.Draft7Validator(schema, registry=registry)


def load_spec(root: Path, node_path: str) -> dict:
    return yaml.safe_load((root / node_path.lstrip("/")).read_text())
