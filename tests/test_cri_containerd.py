"""The drop-in through the machine's own containerd (Debian 1.6): it parses and merges.

The simulator configures a node root with the real ``nvidia-ctk``; the
test then bind-mounts that root's ``/etc/containerd`` over the machine's
inside a throwaway mount namespace, so the ``imports`` line (a host path,
``/etc/containerd/conf.d/*.toml``) resolves to the files just written, and
asks containerd for its merged config.  containerd 1.6 silently drops keys it
does not know (``enable_cdi`` and the NRI plugin are 1.7+), so those are
asserted on the parsed drop-in instead.  containerd 1.7 and 2.1 are in
``test_cri_real_containerd.py``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from mokka.noderoot.host import Host
from mokka.simulators.cri import CriSimulator
from tests.cri_support import (
    DRIVER_OWNER,
    config_dump,
    fake_settings,
    h100_state,
    install_fakes,
    seed_containerd_host,
    stage_driver,
)
from tests.support import snapshot


async def test_containerd_merges_the_dropin(
    host: Host, node_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fakes = install_fakes(tmp_path, monkeypatch)
    seed_containerd_host(node_root)
    before = snapshot(node_root)
    state = h100_state(2)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings())
    await simulator.apply(host, state)
    assert simulator.readiness.ready

    dump = config_dump(node_root)
    assert sorted(dump["imports"]) == [
        "/etc/containerd/conf.d/50-mokka.toml", "/etc/containerd/config.toml",
    ]
    containerd = dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert containerd["default_runtime_name"] == "nvidia"
    nvidia = containerd["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    # The main config's own CRI settings survive the import (the drop-in repeats
    # them), and so does the built-in runc handler (1.6 replaces the runtimes map).
    assert dump["plugins"]["io.containerd.grpc.v1.cri"]["cni"]["bin_dir"] == "/usr/lib/cni"
    assert containerd["runtimes"]["runc"]["runtime_type"] == "io.containerd.runc.v2"

    dropin = tomllib.loads((node_root / "etc/containerd/conf.d/50-mokka.toml").read_text())
    assert dropin["plugins"]["io.containerd.grpc.v1.cri"]["enable_cdi"] is True
    assert dropin["plugins"]["io.containerd.nri.v1.nri"] == {
        "disable": False, "socket_path": "/var/run/nri/nri.sock",
    }

    await simulator.revoke(host)
    await simulator.discard(host)
    host.discard(DRIVER_OWNER)
    # After revoke containerd no longer sees the runtime: the import matches nothing.
    dump = config_dump(node_root)
    assert "nvidia" not in dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert fakes.systemctl_calls()[-1] == ["restart", "--no-block", "containerd"]
    host.discard_all()
    # The main config too is back byte for byte (the imports line went at revoke).
    assert snapshot(node_root) == before
