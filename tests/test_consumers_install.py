"""The install step for the real consumers (``scripts/install-consumers``) and its locator.

Every pinned component is present and its binary reports the pinned release;
``--check`` names what is missing or stale without installing; a second
install run writes nothing; a locator pointed at an empty cache fails naming
the script.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.consumers import SCRIPT, cache_dir, components, consumer, containerd, containerd_versions

pytestmark = [pytest.mark.realclient, pytest.mark.timeout(120)]

GO_BUILT = (
    "nvidia-device-plugin",
    "nvidia-ctk",
    "nvidia-cdi-hook",
    "nvidia-container-runtime",
    "crictl",
    "helm",
)


def run_script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


def version_output(binary: Path) -> str:
    args = {"helm": ["version", "--short"], "containerd-shim-runc-v2": ["-v"]}.get(
        binary.name, ["--version"]
    )
    done = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout + done.stderr


def test_check_finds_every_pinned_component() -> None:
    done = run_script("--check")
    assert done.returncode == 0, done.stdout + done.stderr
    present = {
        tuple(line.split()[1:3]) for line in done.stdout.splitlines() if line.endswith(" present")
    }
    assert present == {
        (c.name.split("-")[0] if c.name.startswith("containerd-") else c.name, c.version)
        for c in components().values()
        if not c.unavailable
    }
    # The one the proxy cannot serve is named, with the reason, never silently dropped.
    assert "gpu-feature-discovery v0.17.4 not available" in done.stdout
    assert "sigs.k8s.io/node-feature-discovery@v0.15.7" in done.stdout


@pytest.mark.parametrize("name", GO_BUILT)
def test_go_built_consumer_reports_its_pin(name: str) -> None:
    binary = consumer(name)
    assert binary.parent == cache_dir() / "bin"
    pinned = components()[name]
    # Built with the release's own -X flag: "version unknown" would fail here.
    assert pinned.upstream in version_output(binary)


def test_containerd_builds_report_their_pins() -> None:
    assert [v.split(".")[0] for v in containerd_versions()] == ["1", "2"]
    for version in containerd_versions():
        build = containerd(version)
        assert build.version == version
        assert build.bin_dir.is_relative_to(cache_dir() / "containerd")
        for binary in (build.containerd, build.shim, build.ctr):
            assert version in version_output(binary), binary
    # A series names exactly one build.
    assert containerd("1.7").version.startswith("1.7.")
    assert containerd("2").version.startswith("2.")


def test_check_names_missing_and_stale_components(tmp_path: Path) -> None:
    # An empty cache: every component is named.
    done = run_script("--check", MOKKA_CONSUMERS=str(tmp_path))
    assert done.returncode == 1
    for component in components().values():
        if not component.unavailable:
            assert f" {component.version}\n" in done.stderr, component.name
    assert "run scripts/install-consumers" in done.stderr

    # A cache whose stamp names another release, and one whose binary reports another.
    (tmp_path / "bin").mkdir()
    (tmp_path / "stamps").mkdir()
    for name in GO_BUILT:
        (tmp_path / "bin" / name).symlink_to(consumer(name))
        (tmp_path / "stamps" / name).write_text(components()[name].version + "\n")
    (tmp_path / "stamps" / "helm").write_text("v4.0.0\n")
    (tmp_path / "bin" / "crictl").unlink()
    (tmp_path / "bin" / "crictl").symlink_to(consumer("nvidia-ctk"))
    done = run_script("--check", MOKKA_CONSUMERS=str(tmp_path))
    assert done.returncode == 1
    stale = {
        line.split(": ")[-1].split()[0]
        for line in done.stderr.splitlines()
        if "missing or at another version" in line
    }
    assert stale == {"helm", "crictl", "containerd"}, done.stderr


def test_second_install_run_installs_nothing() -> None:
    def state() -> dict[str, tuple[int, int, int]]:
        result = {}
        for path in [cache_dir(), *cache_dir().rglob("*")]:
            st = path.lstat()
            result[str(path)] = (st.st_ino, st.st_mtime_ns, st.st_size)
        return result

    before = state()
    # Without Go a build would fail; and every path keeps its inode, mtime and size.
    done = run_script(GO="/bin/false", PATH="/usr/bin:/bin")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all present" in done.stdout
    assert " built " not in done.stdout
    assert " unpacked " not in done.stdout
    assert state() == before


def test_install_without_go_names_what_to_install(tmp_path: Path) -> None:
    done = run_script(
        MOKKA_CONSUMERS=str(tmp_path / "cache"),
        MOKKA_GO_CACHE=str(tmp_path / "go"),
        GO=str(tmp_path / "no-go"),
    )
    assert done.returncode == 1
    assert "building nvidia-device-plugin v0.17.4 needs Go >= 1.26" in done.stderr
    assert "https://go.dev/dl/" in done.stderr
    assert not list((tmp_path / "cache" / "bin").iterdir())


def test_locators_fail_naming_the_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOKKA_CONSUMERS", str(tmp_path))
    with pytest.raises(
        pytest.fail.Exception,
        match=r"nvidia-ctk v1\.20\.2 is not installed.*scripts/install-consumers",
    ):
        consumer("nvidia-ctk")
    with pytest.raises(
        pytest.fail.Exception, match=r"containerd-1\.7\.\d+ .*scripts/install-consumers"
    ):
        containerd("1.7")
    with pytest.raises(pytest.fail.Exception, match=r"node-feature-discovery@v0\.15\.7"):
        consumer("gpu-feature-discovery")
    with pytest.raises(pytest.fail.Exception, match="no consumer 'kubectl'"):
        consumer("kubectl")
