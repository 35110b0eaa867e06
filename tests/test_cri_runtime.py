"""containerd runtime setup: toolkit, nvidia-ctk, drop-in, NRI, restarts, leave-alone, teardown.

Runs the real NVIDIA Container Toolkit release (``nvidia-ctk`` v1.20.2,
recorded by ``RecordingRunner``) and the recording ``fake-systemctl`` (a
test must never restart the machine's containerd).  One test keeps a
stand-in ``nvidia-ctk``, for the one fault the real tool cannot produce.
"""

from __future__ import annotations

import datetime
import math
import os
import tomllib
from pathlib import Path

import pytest

from mokka.errors import CommandError
from mokka.noderoot.host import Host
from mokka.simulators.cri import CriSettings, CriSimulator, mainconfig, tomlwriter
from mokka.simulators.cri import runtime as runtime_mod
from tests.cri_support import (
    DEBIAN_CONTAINERD_CONFIG,
    DRIVER_OWNER,
    Fakes,
    RecordingRunner,
    fake_settings,
    h100_state,
    install_fakes,
    load_spec,
    real_component,
    seed_containerd_host,
    stage_driver,
)
from tests.support import snapshot

DROPIN = "etc/containerd/conf.d/50-mokka.toml"
#: The command after its scratch paths (``--config``, ``--drop-in-config``).
CTK_ARGS = [
    "--nvidia-runtime-name=nvidia",
    "--nvidia-runtime-path=/usr/bin/nvidia-container-runtime",
    "--nvidia-set-as-default",
    "--cdi.enabled",
]
RESTART = ["restart", "containerd"]
IS_ACTIVE = ["is-active", "containerd"]
QUEUED = ["restart", "--no-block", "containerd"]
CRI = 'plugins."io.containerd.grpc.v1.cri"'
IMPORT = f'imports = ["/etc/containerd/conf.d/*.toml"]  {mainconfig.MARK}\n'

#: What must stay after teardown: the toolkit install (running containers call
#: it) and its manifest (so `mokka cleanup` can remove it).  containerd's main
#: config is back byte for byte.
STAYS = {
    "usr/local": ("dir", 0o755),
    "usr/local/nvml-mock": ("dir", 0o755),
    "usr/local/nvml-mock/toolkit": ("dir", 0o755),
    "usr/local/nvml-mock/toolkit/nvidia-cdi-hook": ("file", 0o755),
    "usr/local/nvml-mock/toolkit/nvidia-container-runtime": ("file", 0o755),
    "usr/local/nvml-mock/toolkit/nvidia-ctk": ("file", 0o755),
    "usr/local/nvml-mock/toolkit/config.toml": ("file", 0o644),
    "usr/bin/nvidia-container-runtime": (
        "link", "../local/nvml-mock/toolkit/nvidia-container-runtime"
    ),
    "usr/bin/nvidia-ctk": ("link", "../local/nvml-mock/toolkit/nvidia-ctk"),
    "usr/bin/nvidia-cdi-hook": ("link", "../local/nvml-mock/toolkit/nvidia-cdi-hook"),
    "etc/nvidia-container-runtime": ("dir", 0o755),
    "etc/nvidia-container-runtime/config.toml": (
        "link", "../../usr/local/nvml-mock/toolkit/config.toml"
    ),
    "var": ("dir", 0o755),
    "var/lib": ("dir", 0o755),
    # Mokka's bookkeeping is private (0700), whatever the umask.
    "var/lib/mokka": ("dir", 0o700),
    "var/lib/mokka/manifests": ("dir", 0o700),
    "var/lib/mokka/manifests/cri-toolkit.json": ("file",),
    # The record of the state directory's ancestors it made (var, var/lib).
    ".mokka-created-parents.json": ("file", 0o600),
}


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fakes:
    return install_fakes(tmp_path, monkeypatch)


@pytest.fixture
def runner() -> RecordingRunner:
    return RecordingRunner()


@pytest.fixture
def host(node_root: Path, runner: RecordingRunner) -> Host:
    return Host(node_root, runner=runner)


def check_ctk_call(argv: list[str]) -> None:
    """The image's nvidia-ctk, on a scratch copy of the main config, never the node's."""
    assert argv[0] == str(real_component("toolkit") / "nvidia-ctk")
    assert argv[1:5] == ["runtime", "configure", "--runtime=containerd", "--config-source=file"]
    config, output = argv[5].removeprefix("--config="), argv[6].removeprefix("--drop-in-config=")
    assert Path(config).name == "config.toml"
    assert Path(output).parent == Path(config).parent
    assert not Path(config).parent.exists()  # the scratch directory is gone
    assert argv[7:] == CTK_ARGS


@pytest.fixture
def containerd_root(node_root: Path) -> Path:
    seed_containerd_host(node_root)
    return node_root


def diff(before: dict, after: dict) -> tuple[set[str], set[str], set[str]]:
    """(added, changed, removed) paths between two snapshots."""
    added = set(after) - set(before)
    removed = set(before) - set(after)
    changed = {p for p in set(before) & set(after) if before[p] != after[p]}
    return added, changed, removed


def dropin(root: Path) -> dict:
    return tomllib.loads((root / DROPIN).read_text())


async def teardown(simulator: CriSimulator, host: Host) -> None:
    await simulator.revoke(host)
    await simulator.discard(host)
    host.discard(DRIVER_OWNER)


async def test_first_apply_installs_configures_and_restarts_once(
    host: Host, containerd_root: Path, fakes: Fakes, runner: RecordingRunner
) -> None:
    root = containerd_root
    before = snapshot(root)
    state = h100_state(2)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings())
    await simulator.stage(host, state)
    assert runner.calls == []
    await simulator.apply(host, state)

    # The release is installed and linked from the package paths.
    for name in ("nvidia-container-runtime", "nvidia-ctk", "nvidia-cdi-hook"):
        installed = root / "usr/local/nvml-mock/toolkit" / name
        assert installed.read_bytes() == (real_component("toolkit") / name).read_bytes()
        assert os.stat(installed).st_mode & 0o777 == 0o755
        assert os.readlink(root / "usr/bin" / name) == f"../local/nvml-mock/toolkit/{name}"
    config = tomllib.loads((root / "etc/nvidia-container-runtime/config.toml").read_text())
    assert config["nvidia-container-runtime"]["mode"] == "cdi"
    assert config["nvidia-container-runtime"]["modes"]["cdi"]["default-kind"] == "nvidia.com/gpu"
    assert "/var/run/cdi" in config["nvidia-container-runtime"]["modes"]["cdi"]["spec-dirs"]

    # nvidia-ctk ran once, with exactly the documented command.
    (ctk,) = runner.ctk_calls()
    check_ctk_call(ctk)

    doc = dropin(root)
    assert doc["version"] == 2
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True
    assert cri["containerd"]["default_runtime_name"] == "nvidia"
    nvidia = cri["containerd"]["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert doc["plugins"]["io.containerd.nri.v1.nri"] == {
        "disable": False,
        "socket_path": "/var/run/nri/nri.sock",
    }
    assert os.stat(root / DROPIN).st_mode & 0o777 == 0o644
    # The real tool copies the node's CRI table into the drop-in.
    assert cri["cni"] == {"bin_dir": "/usr/lib/cni", "conf_dir": "/etc/cni/net.d"}
    assert cri["containerd"]["runtimes"]["runc"]["runtime_type"] == "io.containerd.runc.v2"
    main = (root / "etc/containerd/config.toml").read_text()
    assert main == IMPORT + DEBIAN_CONTAINERD_CONFIG

    # The spec names the installed ldcache hook.
    hooks = load_spec(root, "/var/run/cdi/nvidia.yaml")["containerEdits"]["hooks"]
    assert [h["path"] for h in hooks] == ["/usr/bin/nvidia-cdi-hook"]

    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE]
    assert simulator.readiness.ready
    assert simulator.readiness.reason == (
        "CDI specs published for 2 GPU(s); "
        "containerd configured by /etc/containerd/conf.d/50-mokka.toml"
    )

    # An unchanged reconcile runs nothing and restarts nothing.
    await simulator.apply(host, state)
    assert len(runner.ctk_calls()) == 1
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE]

    await teardown(simulator, host)
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE, QUEUED]
    after = snapshot(root)
    added, changed, removed = diff(before, after)
    assert (changed, removed) == (set(), set())
    assert added == set(STAYS)
    for path, expected in STAYS.items():
        assert after[path][: len(expected)] == expected, path

    # `mokka cleanup` (every manifest) removes the install too.
    host.discard_all()
    assert snapshot(root) == before


async def test_changed_dropin_restarts_unchanged_does_not(
    host: Host, containerd_root: Path, fakes: Fakes, runner: RecordingRunner
) -> None:
    root = containerd_root
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings())
    await simulator.apply(host, state)
    written = (root / DROPIN).read_bytes()
    await simulator.apply(host, state)
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE]

    # Someone edits the drop-in: the next reconcile puts it back and restarts.
    (root / DROPIN).write_text("version = 2\n")
    await simulator.apply(host, state)
    assert (root / DROPIN).read_bytes() == written
    assert len(runner.ctk_calls()) == 2
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE, RESTART, IS_ACTIVE]
    await simulator.apply(host, state)
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE, RESTART, IS_ACTIVE]

    await teardown(simulator, host)
    host.discard_all()
    assert snapshot(root) == before


async def test_daemon_start_restarts_once_even_when_unchanged(
    host: Host, containerd_root: Path, fakes: Fakes, runner: RecordingRunner
) -> None:
    root = containerd_root
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    await CriSimulator(fake_settings()).apply(host, state)
    written = (root / DROPIN).read_bytes()

    restarted = CriSimulator(fake_settings())  # a new daemon process
    await restarted.apply(host, state)
    assert (root / DROPIN).read_bytes() == written
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE, RESTART, IS_ACTIVE]
    await restarted.apply(host, state)
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE, RESTART, IS_ACTIVE]
    # nvidia-ctk ran again at start (an upgraded image may write something else).
    assert len(runner.ctk_calls()) == 2

    await teardown(restarted, host)
    host.discard_all()
    assert snapshot(root) == before


async def test_restart_mode_none_writes_and_stays_ready(
    host: Host, containerd_root: Path, fakes: Fakes, caplog: pytest.LogCaptureFixture
) -> None:
    root = containerd_root
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings(restart_mode="none"))
    await simulator.apply(host, state)
    assert (root / DROPIN).is_file()
    assert fakes.systemctl_calls() == []
    assert simulator.readiness.ready
    assert "restart pending" in simulator.readiness.reason
    assert any("containerd restart pending" in r.getMessage() for r in caplog.records)

    await teardown(simulator, host)
    assert fakes.systemctl_calls() == []
    assert not (root / DROPIN).exists()
    host.discard_all()
    assert snapshot(root) == before


async def test_containerd_not_coming_back_is_not_ready(
    host: Host, containerd_root: Path, fakes: Fakes
) -> None:
    root = containerd_root
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    fakes.containerd_state.write_text("failed\n")
    simulator = CriSimulator(fake_settings())
    await simulator.apply(host, state)
    readiness = simulator.readiness
    assert not readiness.ready
    assert readiness.reason == (
        "CDI specs published for 1 GPU(s); containerd did not come back after restart "
        "(systemctl is-active containerd: failed); see `journalctl -u containerd` on the node"
    )
    # Unchanged reconciles look again, without restarting again.
    await simulator.apply(host, state)
    assert not simulator.readiness.ready
    fakes.containerd_state.write_text("active\n")
    await simulator.apply(host, state)
    assert simulator.readiness.ready
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE, IS_ACTIVE, IS_ACTIVE]

    await teardown(simulator, host)
    host.discard_all()
    assert snapshot(root) == before


async def test_no_containerd_leaves_the_runtime_alone(
    host: Host, node_root: Path, fakes: Fakes, runner: RecordingRunner,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """CRI-O or an embedded containerd: no install, no drop-in, specs still published."""
    before = snapshot(node_root)
    state = h100_state(1)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings())
    await simulator.apply(host, state)
    await simulator.apply(host, state)
    assert simulator.readiness.ready
    assert simulator.readiness.reason.startswith(
        "CDI specs published for 1 GPU(s); no containerd on the host's PATH"
    )
    assert runner.ctk_calls() == []
    assert fakes.systemctl_calls() == []
    assert (node_root / "var/run/cdi/nvidia.yaml").is_file()
    assert not (node_root / "usr").exists()
    assert not (node_root / "etc").exists()
    assert "hooks" not in load_spec(node_root, "/var/run/cdi/nvidia.yaml")["containerEdits"]
    # Logged once, not once per reconcile.
    assert sum("no containerd" in r.getMessage() for r in caplog.records) == 1

    await teardown(simulator, host)
    assert fakes.systemctl_calls() == []
    assert snapshot(node_root) == before


@pytest.mark.parametrize(
    "foreign",
    [
        "usr/bin/nvidia-ctk",
        "usr/bin/nvidia-container-runtime",
        "usr/bin/nvidia-container-runtime-hook",
        "etc/nvidia-container-runtime/config.toml",
    ],
)
async def test_foreign_toolkit_file_leaves_the_runtime_alone(
    host: Host, containerd_root: Path, fakes: Fakes, runner: RecordingRunner, foreign: str
) -> None:
    root = containerd_root
    path = root / foreign
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"installed by the distribution's package\n")
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings())
    await simulator.apply(host, state)
    assert simulator.readiness.ready
    assert f"toolkit files not installed by mokka at /{foreign}" in simulator.readiness.reason
    assert runner.ctk_calls() == []
    assert fakes.systemctl_calls() == []
    assert not (root / "usr/local").exists()
    assert not (root / DROPIN).exists()

    await teardown(simulator, host)
    assert snapshot(root) == before


async def test_nri_off_leaves_the_nri_table_out(
    host: Host, containerd_root: Path, fakes: Fakes
) -> None:
    root = containerd_root
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings(nri=False))
    await simulator.apply(host, state)
    assert "io.containerd.nri.v1.nri" not in dropin(root)["plugins"]
    assert dropin(root)["plugins"]["io.containerd.grpc.v1.cri"]["enable_cdi"] is True
    await teardown(simulator, host)
    host.discard_all()
    assert snapshot(root) == before


async def test_custom_nri_socket_and_config_dir(
    host: Host, containerd_root: Path, fakes: Fakes
) -> None:
    root = containerd_root
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    settings = fake_settings(
        nri_socket="/run/containerd/nri.sock", containerd_config_dir="/etc/containerd/d"
    )
    simulator = CriSimulator(settings)
    await simulator.apply(host, state)
    doc = tomllib.loads((root / "etc/containerd/d/50-mokka.toml").read_text())
    assert doc["plugins"]["io.containerd.nri.v1.nri"]["socket_path"] == "/run/containerd/nri.sock"
    assert (root / "etc/containerd/config.toml").read_text().startswith(
        f'imports = ["/etc/containerd/d/*.toml"]  {mainconfig.MARK}\n'
    )
    await teardown(simulator, host)
    host.discard_all()
    assert snapshot(root) == before


async def test_nvidia_ctk_failure_is_not_ready_and_retried(
    host: Host, containerd_root: Path, fakes: Fakes, runner: RecordingRunner
) -> None:
    """A main config the real tool cannot load: not ready, specs published, retried."""
    root = containerd_root
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    config = root / "etc/containerd/config.toml"
    config.write_text("version = 2\n[plugins\n")
    simulator = CriSimulator(fake_settings())
    await simulator.apply(host, state)
    assert not simulator.readiness.ready
    assert simulator.readiness.reason.startswith(
        "CDI specs published for 1 GPU(s); nvidia-ctk runtime configure failed (exit 1): "
    )
    assert "unable to load config" in simulator.readiness.reason
    assert fakes.systemctl_calls() == []
    assert config.read_text() == "version = 2\n[plugins\n"  # untouched
    # The specs are published regardless: they do not depend on containerd.
    assert (root / "var/run/cdi/nvidia.yaml").is_file()

    config.write_text(DEBIAN_CONTAINERD_CONFIG)
    await simulator.apply(host, state)
    assert simulator.readiness.ready
    assert len(runner.ctk_calls()) == 2
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE]
    await teardown(simulator, host)
    host.discard_all()
    assert snapshot(root) == before


async def test_nvidia_ctk_writing_no_runtime_is_not_ready(
    host: Host, containerd_root: Path, fakes: Fakes, tmp_path: Path
) -> None:
    """A STAND-IN nvidia-ctk, for the one fault the real tool cannot produce: exit 0, no
    ``nvidia`` runtime in its output (a toolkit whose flags changed meaning)."""
    release = tmp_path / "release"
    release.mkdir()
    for name in ("nvidia-container-runtime", "nvidia-cdi-hook"):
        (release / name).symlink_to(real_component("toolkit") / name)
    ctk = release / "nvidia-ctk"
    ctk.write_text(
        '#!/bin/sh\nfor a; do case "$a" in --drop-in-config=*) out="${a#*=}";; esac; done\n'
        'printf "version = 2\\n" > "$out"\n'
    )
    ctk.chmod(0o755)
    root = containerd_root
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings(toolkit_dir=release))
    await simulator.apply(host, state)
    assert not simulator.readiness.ready
    assert simulator.readiness.reason.endswith(
        "/etc/containerd/conf.d/50-mokka.toml: nvidia-ctk wrote no 'nvidia' runtime entry; "
        'expected [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]'
    )
    assert fakes.systemctl_calls() == []
    assert not (root / DROPIN).exists()
    await teardown(simulator, host)
    host.discard_all()
    assert snapshot(root) == before


@pytest.mark.parametrize(
    ("written", "problem"),
    [(b"\xff\xfe version = 2", "not UTF-8 text"), (b"[plugins", "not valid TOML")],
)
def test_a_dropin_nvidia_ctk_left_unreadable_is_one_error_naming_it(
    written: bytes, problem: str
) -> None:
    with pytest.raises(CommandError, match=f"/etc/containerd/d/50.toml: {problem} after "):
        runtime_mod._parse("/etc/containerd/d/50.toml", written)


async def test_missing_toolkit_in_the_image_is_not_ready(
    host: Host, containerd_root: Path, fakes: Fakes, runner: RecordingRunner, tmp_path: Path
) -> None:
    root = containerd_root
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings(toolkit_dir=tmp_path / "no-toolkit"))
    await simulator.apply(host, state)
    assert not simulator.readiness.ready
    assert "no-toolkit does not exist in the image" in simulator.readiness.reason
    assert (root / "var/run/cdi/nvidia.yaml").is_file()
    assert runner.ctk_calls() == []
    assert fakes.systemctl_calls() == []

    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "nvidia-ctk").symlink_to(real_component("toolkit") / "nvidia-ctk")
    simulator = CriSimulator(fake_settings(toolkit_dir=partial))
    await simulator.apply(host, state)
    assert simulator.readiness.reason.endswith(
        "lacks nvidia-container-runtime, nvidia-cdi-hook "
        "(expected nvidia-container-runtime, nvidia-ctk, nvidia-cdi-hook)"
    )
    await teardown(simulator, host)
    assert snapshot(root) == before


async def test_existing_file_at_our_dropin_name_is_restored(
    host: Host, containerd_root: Path, fakes: Fakes
) -> None:
    root = containerd_root
    (root / "etc/containerd/conf.d").mkdir()
    (root / DROPIN).write_text("# someone's own drop-in\n")
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    simulator = CriSimulator(fake_settings())
    await simulator.apply(host, state)
    runtimes = dropin(root)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert "nvidia" in runtimes
    await teardown(simulator, host)
    assert (root / DROPIN).read_text() == "# someone's own drop-in\n"
    host.discard_all()
    assert snapshot(root) == before


async def test_revoke_from_a_fresh_process(host: Host, containerd_root: Path, fakes: Fakes) -> None:
    """A killed daemon's drop-in is found through the manifest, removed, and a restart queued."""
    root = containerd_root
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    await CriSimulator(fake_settings()).apply(host, state)
    fresh = CriSimulator(fake_settings())
    await teardown(fresh, Host(root))
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE, QUEUED]
    assert not (root / DROPIN).exists()
    host.discard_all()
    assert snapshot(root) == before


async def test_turning_the_runtime_setup_off_withdraws_our_dropin(
    host: Host, containerd_root: Path, fakes: Fakes
) -> None:
    root = containerd_root
    before = snapshot(root)
    state = h100_state(1)
    stage_driver(host, state)
    await CriSimulator(fake_settings()).apply(host, state)
    off = CriSimulator(fake_settings(container_runtime=False))
    await off.apply(host, state)
    assert not (root / DROPIN).exists()
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE, QUEUED]
    assert off.readiness.ready
    await teardown(off, host)
    assert fakes.systemctl_calls() == [RESTART, IS_ACTIVE, QUEUED]
    host.discard_all()
    assert snapshot(root) == before


def test_default_command_runs_the_images_nvidia_ctk_on_a_scratch_copy() -> None:
    """In the pod: the image's nvidia-ctk, on files of the daemon's own; never the host's."""
    setup = runtime_mod.RuntimeSetup(CriSettings())
    argv = setup.ctk_argv("/tmp/x/config.toml", "/tmp/x/drop-in.toml")
    assert argv == [
        "/usr/local/lib/mokka/toolkit/nvidia-ctk", "runtime", "configure",
        "--runtime=containerd", "--config-source=file", "--config=/tmp/x/config.toml",
        "--drop-in-config=/tmp/x/drop-in.toml", *CTK_ARGS,
    ]
    assert runtime_mod.nri_settings("/var/run/nri/nri.sock") == {
        "disable": False, "socket_path": "/var/run/nri/nri.sock",
    }


def test_dropin_keeps_the_nodes_own_plugin_settings() -> None:
    """Before containerd 2.1 an imported table replaces the main one: ours repeats the node's."""
    main = tomllib.loads(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nsandbox_image = "pause:3.9"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd]\ndefault_runtime_name = "runc"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        "SystemdCgroup = true\n"
        '[plugins."io.containerd.nri.v1.nri"]\ndisable = true\nplugin_path = "/opt/nri"\n'
        '[plugins."io.containerd.internal.v1.opt"]\npath = "/opt/containerd"\n'
    )
    ours = {
        "version": 2,
        "plugins": {
            "io.containerd.grpc.v1.cri": {
                "enable_cdi": True,
                "containerd": {
                    "default_runtime_name": "nvidia",
                    "runtimes": {"nvidia": {"options": {"BinaryName": "/usr/bin/x"}}},
                },
            },
            "io.containerd.nri.v1.nri": runtime_mod.nri_settings("/var/run/nri/nri.sock"),
        },
    }
    merged = runtime_mod.merge_plugins(main, ours)
    assert merged == {
        "version": 2,
        "plugins": {
            "io.containerd.grpc.v1.cri": {
                "sandbox_image": "pause:3.9",
                "enable_cdi": True,
                "containerd": {
                    "default_runtime_name": "nvidia",
                    "runtimes": {
                        "runc": {"options": {"SystemdCgroup": True}},
                        "nvidia": {"options": {"BinaryName": "/usr/bin/x"}},
                    },
                },
            },
            "io.containerd.nri.v1.nri": {
                "disable": False,
                "plugin_path": "/opt/nri",
                "socket_path": "/var/run/nri/nri.sock",
            },
        },
    }
    # The merged drop-in survives the round trip through the TOML writer.
    assert tomllib.loads(tomlwriter.dumps(merged)) == merged


def test_toml_writer_round_trips_containerd_shaped_documents() -> None:
    doc = {
        "version": 2,
        "imports": ["/etc/containerd/conf.d/*.toml"],
        "oom_score": -999,
        "ratio": 0.5,
        "big": float("inf"),
        "when": datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.UTC),
        "plugins": {
            'odd "key".name': {"s": 'quote " backslash \\ newline \n tab \t ünïcode \x01'},
            "empty": {},
            "io.containerd.grpc.v1.cri": {
                "registry": {"mirrors": {"docker.io": {"endpoint": ["https://mirror"]}}},
                "list_of_tables": [{"a": 1, "b": [True, False]}],
            },
        },
    }
    text = tomlwriter.dumps(doc)
    assert tomllib.loads(text) == doc
    assert '[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]' in text
    assert "[plugins.empty]" in text
    assert math.isnan(tomllib.loads(tomlwriter.dumps({"x": float("nan")}))["x"])
    # What tomllib reads from a node's config must be written back readable:
    # DEL has to be escaped, and characters beyond the BMP must not become
    # surrogate pairs (which TOML refuses), in values and in keys alike.
    odd = {"del \x7f": "a\x7fb", "emoji": "😀 🚀", "k😀": {"v": "\U0001f600\x00"}}
    assert tomllib.loads(tomlwriter.dumps(odd)) == odd
    with pytest.raises(TypeError, match="cannot write NoneType None as TOML"):
        tomlwriter.dumps({"x": None})
