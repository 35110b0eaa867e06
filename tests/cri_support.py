"""Helpers shared by the cri tests (no tests here): states, driver files, the fakes.

The fakes live in ``tests/data/fake-toolkit/``: ``release/`` is the
"image's" toolkit directory (a recording ``nvidia-ctk`` stand-in plus two
inert executables), ``fake-chroot`` runs an installed stand-in against the
node root, ``fake-systemctl`` records calls and answers ``is-active``.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import jsonschema
import referencing
import referencing.jsonschema
import yaml

from mokka import layout
from mokka.host import Artifact, CharDevice, Directory, File, Host, Symlink
from mokka.simulators.cri.settings import CriSettings
from mokka.state.model import Fabric, Gpu, Nvlink, NvlinkSwitch, State, System
from tests.support import DATA

DRIVER = "580.105.08"
#: H100 HGX bus numbers (SURFACES §2.1), in index order.
H100_BUSES = ("53", "64", "75", "86", "97", "a8", "b9", "ca")
FAKE_TOOLKIT = DATA / "fake-toolkit"
RELEASE = FAKE_TOOLKIT / "release"
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


def seed_containerd_host(root: Path) -> None:
    """Make the node root look like a containerd node: the binary and Debian's config."""
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/bin/containerd").write_bytes(b"\x7fELF containerd stand-in\n")
    (root / "usr/bin/containerd").chmod(0o755)
    (root / "etc/containerd").mkdir(parents=True, exist_ok=True)
    (root / "etc/containerd/config.toml").write_text(DEBIAN_CONTAINERD_CONFIG)


@attrs.frozen
class Fakes:
    """Where the stand-ins record their calls."""

    ctk_log: Path
    systemctl_log: Path
    #: what ``is-active containerd`` answers (write "failed" to take containerd down)
    containerd_state: Path

    def ctk_calls(self) -> list[dict]:
        return _json_lines(self.ctk_log)

    def systemctl_calls(self) -> list[list[str]]:
        return _json_lines(self.systemctl_log)


def _json_lines(path: Path) -> list:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def install_fakes(tmp_path: Path, monkeypatch) -> Fakes:
    """Point the stand-ins' logs into ``tmp_path`` (outside the node root)."""
    fakes = Fakes(
        ctk_log=tmp_path / "ctk.log",
        systemctl_log=tmp_path / "systemctl.log",
        containerd_state=tmp_path / "containerd.state",
    )
    fakes.containerd_state.write_text("active\n")
    monkeypatch.setenv("MOKKA_FAKE_CTK_LOG", str(fakes.ctk_log))
    monkeypatch.setenv("MOKKA_FAKE_SYSTEMCTL_LOG", str(fakes.systemctl_log))
    monkeypatch.setenv("MOKKA_FAKE_CONTAINERD_STATE", str(fakes.containerd_state))
    return fakes


def fake_settings(**overrides) -> CriSettings:
    """Settings wired to the stand-ins."""
    values = {
        "toolkit_dir": RELEASE,
        "systemctl": (str(FAKE_TOOLKIT / "fake-systemctl"),),
        "host_exec": (str(FAKE_TOOLKIT / "fake-chroot"), "{root}"),
        "command_timeout": 30.0,
    }
    values.update(overrides)
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
