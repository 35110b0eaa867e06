"""scripts/nvidia-smi-path and scripts/daemon: a local run stages NVIDIA's nvidia-smi when it can.

The resolver runs against fake Debian packages (real ``.deb`` files from
``dpkg-deb --build``) in a temp deb directory, a temp cache, and stub
``apt-cache``/``apt-get`` first on PATH, so nothing of the machine's apt or
caches is touched; one test unpacks the real 535 package into a temp cache
and checks that the gpudriver takes the result for NVIDIA's binary.
``scripts/daemon`` runs in a copy of ``scripts/`` whose neighbours (the
set-up scripts, the resolver, ``.venv/bin/mokka``) are stubs recording what
the daemon is started with.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mokka.simulators.gpudriver.binaries import is_real_nvidia_smi
from tests.image_support import build_deb
from tests.support import ROOT, real_nvidia_smi, snapshot

pytestmark = pytest.mark.timeout(120)

RESOLVER = ROOT / "scripts" / "nvidia-smi-path"
ELF_PATH = "usr/lib/nvidia/current/nvidia-smi"


def stub(directory: Path, name: str, body: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def resolve(
    tmp_path: Path, *, apt_knows: bool = False, apt_deb: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the resolver with its cache and deb dir in ``tmp_path`` and apt stubbed."""
    stubs = tmp_path / "stubs"
    stub(stubs, "apt-cache", "exit 0" if apt_knows else "exit 100")
    # apt-get download writes the package into the current directory.
    stub(
        stubs,
        "apt-get",
        f'echo "apt-get $*" >> {tmp_path}/apt.log\n'
        + (f"cp {apt_deb} ." if apt_deb else "exit 100"),
    )
    return subprocess.run(
        [str(RESOLVER)],
        capture_output=True,
        text=True,
        env={
            "PATH": f"{stubs}:/usr/bin:/bin",
            "MOKKA_SMI_CACHE": str(tmp_path / "tools" / "nvidia-smi"),
            "MOKKA_SMI_DEB_DIR": str(tmp_path / "debs"),
        },
        timeout=60,
    )


def fake_smi_deb(out_dir: Path, version: str) -> Path:
    return build_deb(out_dir, "nvidia-smi", version, {ELF_PATH: f"#!/bin/sh\necho {version}\n"})


def test_the_newest_deb_is_unpacked_into_the_cache_once(tmp_path: Path) -> None:
    debs = tmp_path / "debs"
    fake_smi_deb(debs, "535.54.03-1")
    fake_smi_deb(debs, "535.247.01-1~deb12u1")
    done = resolve(tmp_path)
    assert done.returncode == 0, done.stderr
    binary = tmp_path / "tools" / "nvidia-smi" / ELF_PATH
    assert done.stdout == f"{binary}\n"
    # Debian's version order: 535.247 is newer than 535.54, whatever the names sort as.
    assert "535.247.01" in binary.read_text()
    # Only the package's own files, nothing installed, no temp tree left.
    assert sorted(p.name for p in (tmp_path / "tools").iterdir()) == ["nvidia-smi"]
    assert not (tmp_path / "apt.log").exists()
    # Cached: the deb directory is no longer needed.
    shutil.rmtree(debs)
    again = resolve(tmp_path)
    assert again.stdout == f"{binary}\n"
    assert again.stderr == ""


def test_without_a_deb_it_downloads_when_apt_knows_the_package(tmp_path: Path) -> None:
    deb = fake_smi_deb(tmp_path / "elsewhere", "535.309.01-0+deb12u1")
    done = resolve(tmp_path, apt_knows=True, apt_deb=deb)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "apt.log").read_text() == "apt-get download -q nvidia-smi\n"
    assert (tmp_path / "tools" / "debs" / deb.name).is_file()
    assert done.stdout == f"{tmp_path / 'tools' / 'nvidia-smi' / ELF_PATH}\n"


def test_with_nothing_to_be_had_it_prints_nothing_and_names_the_fallback(tmp_path: Path) -> None:
    done = resolve(tmp_path)
    assert done.returncode == 0
    assert done.stdout == ""
    assert "fallback nvidia-smi" in done.stderr
    assert "./scripts/install-system-deps" in done.stderr
    assert not (tmp_path / "tools").exists()


def test_a_deb_without_the_binary_leaves_no_cache(tmp_path: Path) -> None:
    build_deb(tmp_path / "debs", "nvidia-smi", "535.1-1", {"usr/share/doc/x": "x"})
    done = resolve(tmp_path)
    assert done.returncode == 0
    assert done.stdout == ""
    assert "holds no nvidia-smi" in done.stderr
    assert list((tmp_path / "tools").iterdir()) == []


def test_the_real_package_gives_nvidias_binary(tmp_path: Path) -> None:
    real_nvidia_smi()  # fails the test, naming the set-up script, when the .deb is missing
    deb_dir = Path(os.environ.get("MOKKA_SMI_DEB_DIR", "/var/cache/mokka"))
    (tmp_path / "debs").symlink_to(deb_dir)
    done = resolve(tmp_path)
    assert done.returncode == 0, done.stderr
    binary = Path(done.stdout.strip())
    assert binary.is_relative_to(tmp_path / "tools" / "nvidia-smi")
    assert is_real_nvidia_smi(binary)


# --------------------------------------------------------------------------
# scripts/daemon
# --------------------------------------------------------------------------


def run_daemon_script(tmp_path: Path, resolved: str, *args: str) -> list[str]:
    """scripts/daemon in a tree of stubs; returns the argv ``mokka`` was started with."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "daemon", tree / "scripts" / "daemon")
    stub(tree / "scripts", "install-system-deps", "exit 0")
    stub(tree / "scripts", "bootstrap", "exit 0")
    stub(tree / "scripts", "nvidia-smi-path", f"echo -n {resolved}")
    record = tmp_path / "argv"
    stub(tree / ".venv" / "bin", "mokka", f'printf "%s\\n" "$@" > {record}')
    before = snapshot(tree)
    done = subprocess.run(
        [str(tree / "scripts" / "daemon"), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert snapshot(tree) == before
    return record.read_text().splitlines()


def test_the_daemon_script_stages_the_resolved_binary(tmp_path: Path) -> None:
    argv = run_daemon_script(tmp_path, "/cache/nvidia-smi", "--once")
    assert argv == ["daemon", "--nvidia-smi-binary", "/cache/nvidia-smi", "--once"]


def test_the_daemon_script_without_one_leaves_the_choice_to_the_daemon(tmp_path: Path) -> None:
    assert run_daemon_script(tmp_path, "", "--once") == ["daemon", "--once"]


def test_an_explicit_binary_wins(tmp_path: Path) -> None:
    argv = run_daemon_script(tmp_path, "/cache/nvidia-smi", "--nvidia-smi-binary=/mine")
    assert argv == ["daemon", "--nvidia-smi-binary=/mine"]
