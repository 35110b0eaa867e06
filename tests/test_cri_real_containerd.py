"""The runtime setup with the real ``nvidia-ctk`` (v1.20.2), as real containerd 1.7 and 2.1 read it.

Each test configures a node root through the cri simulator, then asks the
real containerd for its merged config (``config dump``: no daemon, no
socket; see ``cri_support.config_dump``).  Main configs: Debian's packaged
one (config version 2) on 1.7.24 and 2.1.9, and 2.1.9's own ``config
default`` (version 3).  Every main config starts with a comment, which
the real tool drops when it rewrites a file: after teardown the file must
be back byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mokka.daemon import waves
from mokka.noderoot.host import Host
from mokka.simulators.cri import CriSimulator, mainconfig
from tests.cri_support import (
    DRIVER_OWNER,
    RecordingRunner,
    config_dump,
    default_config,
    fake_settings,
    h100_state,
    install_fakes,
    packaged_config,
    seed_containerd_host,
    stage_driver,
)
from tests.support import snapshot

pytestmark = pytest.mark.timeout(120)

V2_CRI = "io.containerd.grpc.v1.cri"
V3_CRI = "io.containerd.cri.v1.runtime"
COMMENT = "# The node's own containerd settings (kept by every tool that edits this file).\n"
SANDBOX = "registry.example/pause:3.10"
CERTS = "/etc/containerd/certs.d"

#: Another tool's drop-in, beside Mokka's (sorted before it), per config version.
SITE_DROPIN = {
    2: (
        "version = 2\n"
        f'[plugins."{V2_CRI}"]\n'
        f'  sandbox_image = "{SANDBOX}"\n'
        f'[plugins."{V2_CRI}".registry]\n'
        f'  config_path = "{CERTS}"\n'
    ),
    3: (
        "version = 3\n"
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]\n"
        f"  sandbox = '{SANDBOX}'\n"
        "[plugins.'io.containerd.cri.v1.images'.registry]\n"
        f"  config_path = '{CERTS}'\n"
    ),
}


def main_config(version: str, config_version: int) -> str:
    """The main config a case starts from, with a comment on top."""
    text = packaged_config(version) if config_version == 2 else default_config(version)
    return COMMENT + text


def cri(dump: dict) -> dict:
    """The CRI runtime plugin's merged table (2.x names it ``io.containerd.cri.v1.runtime``)."""
    return dump["plugins"].get(V3_CRI) or dump["plugins"][V2_CRI]


def sandbox_and_registry(dump: dict) -> tuple[str, str]:
    images = dump["plugins"].get("io.containerd.cri.v1.images")
    if images is not None:
        return images["pinned_images"]["sandbox"], images["registry"]["config_path"]
    table = dump["plugins"][V2_CRI]
    return table["sandbox_image"], table["registry"]["config_path"]


@pytest.mark.parametrize(
    ("version", "config_version"), [("1.7", 2), ("2.1", 2), ("2.1", 3)],
    ids=["1.7-packaged-v2", "2.1-packaged-v2", "2.1-default-v3"],
)
async def test_containerd_sees_nvidia_runc_cdi_nri_and_the_other_dropin(
    node_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str,
    config_version: int,
) -> None:
    install_fakes(tmp_path, monkeypatch)
    main = main_config(version, config_version)
    seed_containerd_host(node_root, main)
    (node_root / "etc/containerd/conf.d").mkdir()
    (node_root / "etc/containerd/conf.d/10-site.toml").write_text(SITE_DROPIN[config_version])
    before = snapshot(node_root)
    host = Host(node_root)
    state = h100_state(2)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings())
    await simulator.apply(host, state)
    assert simulator.readiness.ready, simulator.readiness.reason

    dump = config_dump(node_root, version)
    table = cri(dump)
    runtimes = table["containerd"]["runtimes"]
    assert table["containerd"]["default_runtime_name"] == "nvidia"
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    # The built-in handler survives the import (1.7 replaces the runtimes map).
    assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2"
    assert table["enable_cdi"] is True
    nri = dump["plugins"]["io.containerd.nri.v1.nri"]
    assert (nri["disable"], nri["socket_path"]) == (False, "/var/run/nri/nri.sock")
    # The other drop-in's CRI settings are still in force beside ours.
    assert sandbox_and_registry(dump) == (SANDBOX, CERTS)
    # The real tool writes the drop-in in the main config's version.
    dropin = (node_root / "etc/containerd/conf.d/50-mokka.toml").read_text()
    assert f"version = {config_version}\n" in dropin
    assert (V3_CRI if config_version == 3 else V2_CRI) in dropin
    # The main config gained the marked import, nothing else (2.1's default
    # config has an empty imports list: it is kept, commented, for teardown).
    edited = (node_root / "etc/containerd/config.toml").read_text()
    assert mainconfig.imported(edited) == ["/etc/containerd/conf.d/*.toml"]
    added = [line for line in edited.splitlines() if line not in main.splitlines()]
    assert added[-1].endswith(mainconfig.MARK)
    assert added[:-1] in ([], [mainconfig.WAS + "imports = []"])
    assert len(edited.splitlines()) == len(main.splitlines()) + 1

    await simulator.revoke(host)
    await simulator.discard(host)
    host.discard(DRIVER_OWNER)
    assert (node_root / "etc/containerd/config.toml").read_text() == main
    assert "nvidia" not in cri(config_dump(node_root, version))["containerd"]["runtimes"]
    host.discard_all()  # `mokka cleanup`: the toolkit install goes too
    assert snapshot(node_root) == before


async def test_a_main_config_edit_reaches_containerd_within_one_repair_pass(
    node_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drop-in repeats the main config's CRI table, so it must follow edits of it.

    The edit is the one this VM needs before containerd can start a pod
    sandbox: it refuses ``oom_score_adj=-998``, and
    ``restrict_oom_score_adj = true`` caps the score at containerd's own.
    """
    fakes = install_fakes(tmp_path, monkeypatch)
    main = main_config("1.7", 2)
    seed_containerd_host(node_root, main)
    before = snapshot(node_root)
    runner = RecordingRunner()
    host = Host(node_root, runner=runner)
    state = h100_state(1)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings())
    replays = waves.Replays()

    async def repair_pass() -> None:
        (outcome,) = await waves.apply(host, [simulator], state, replays)
        assert outcome.ok, outcome

    await repair_pass()  # ran nvidia-ctk and systemctl: never replayed
    await repair_pass()  # nothing changed: nothing run, everything it read recorded
    await repair_pass()
    assert (replays.made, replays.replayed) == (2, 1)
    assert len(runner.ctk_calls()) == 1
    assert cri(config_dump(node_root, "1.7"))["restrict_oom_score_adj"] is False

    config = node_root / "etc/containerd/config.toml"
    header = f'[plugins."{V2_CRI}"]\n'
    edit = header + "restrict_oom_score_adj = true\n"
    config.write_text(config.read_text().replace(header, edit))
    await repair_pass()
    assert (replays.made, replays.replayed) == (3, 1)
    assert len(runner.ctk_calls()) == 2
    assert cri(config_dump(node_root, "1.7"))["restrict_oom_score_adj"] is True
    assert fakes.systemctl_calls()[-2:] == [["restart", "containerd"], ["is-active", "containerd"]]

    await simulator.revoke(host)
    host.discard(DRIVER_OWNER)
    host.discard_all()
    # The operator's edit stays; only Mokka's line went.
    assert config.read_text() == main.replace(header, edit)
    after = snapshot(node_root)
    assert {p for p in set(before) | set(after) if before.get(p) != after.get(p)} == {
        "etc/containerd/config.toml"
    }


@pytest.mark.parametrize(
    "original",
    [
        "version = 2\n",
        '# top\nimports = ["/etc/containerd/extra.toml"] # theirs\r\nversion = 2\n[plugins]\n',
        "imports = []\nversion = 3",
    ],
)
def test_the_imports_line_comes_out_exactly_as_it_went_in(original: str) -> None:
    glob = "/etc/containerd/conf.d/*.toml"
    edited = mainconfig.add(original, glob)
    assert edited is not None
    assert mainconfig.imported(edited)[-1] == glob
    assert mainconfig.add(edited, glob) is None  # imported already: nothing to do
    assert mainconfig.remove(edited) == original
    assert mainconfig.remove(original) is None
    # An edit elsewhere in the file meanwhile survives the removal.
    assert mainconfig.remove(edited + "# later\n") == original + "# later\n"


def test_an_imports_key_over_several_lines_is_refused() -> None:
    with pytest.raises(mainconfig.ImportsUnsupported, match="spans several lines"):
        mainconfig.add('imports = [\n  "/a.toml",\n]\n', "/etc/containerd/conf.d/*.toml")
