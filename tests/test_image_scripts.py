"""The image's payload scripts (deploy/image/*.sh), run against scratch trees.

The Containerfile only calls these scripts, so running them here tests the
image's payload layout without a container engine: the real Debian
nvidia-smi .deb goes through install-nvidia-smi.sh (install-ib-tools.sh has
its own module, test_image_ib_tools.py, and its bundle is part of the
payload verify-layout.sh checks here), fake toolkit packages
built with ``dpkg-deb --build`` go through install-toolkit.sh, and
fetch-toolkit.sh downloads from a local apt repository signed with a key
made for the test (apt itself checks the signature and the pinned version).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import mokka
from tests.ib_support import TOOLS_TARGET, install_ib_tools
from tests.image_support import build_deb, debian_arch
from tests.support import ROOT, require_tool, snapshot

SCRIPTS = ROOT / "deploy" / "image"
SMI_TARGET = "usr/local/lib/mokka/nvidia-smi"
TOOLKIT_TARGET = "usr/local/lib/mokka/toolkit"
TOOLKIT_BINARIES = ("nvidia-container-runtime", "nvidia-ctk", "nvidia-cdi-hook")
RPATH = "$ORIGIN/../lib64"


def run_script(
    name: str, *args: object, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_", "TOOLKIT_", "LD_"))
    }
    return subprocess.run(
        ["bash", str(SCRIPTS / name), *map(str, args)],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=300,
    )


def toolkit_debs(
    out_dir: Path,
    version: str,
    *,
    arch: str | None = None,
    base_version: str | None = None,
    drop: str | None = None,
) -> list[Path]:
    """The two toolkit packages as NVIDIA splits them; each script prints its name and version."""
    base = {
        f"usr/bin/{b}": f"#!/bin/sh\necho {b} {version}\n" for b in TOOLKIT_BINARIES if b != drop
    }
    return [
        build_deb(out_dir, "nvidia-container-toolkit-base", base_version or version, base, arch),
        build_deb(
            out_dir,
            "nvidia-container-toolkit",
            version,
            {"usr/bin/nvidia-container-runtime-hook": "#!/bin/sh\n"},
            arch,
        ),
    ]


def real_smi_deb() -> Path:
    deb_dir = Path(os.environ.get("MOKKA_SMI_DEB_DIR", "/var/cache/mokka"))
    debs = sorted(deb_dir.glob("nvidia-smi_*.deb"))
    if not debs:
        pytest.fail(
            f"no nvidia-smi .deb in {deb_dir}; run ./scripts/install-system-deps "
            "(it enables Debian non-free and downloads it)"
        )
    return debs[-1]


# --------------------------------------------------------------------------
# install-nvidia-smi.sh
# --------------------------------------------------------------------------


@pytest.mark.realclient
def test_install_nvidia_smi_from_the_debian_deb(tmp_path: Path) -> None:
    patchelf = require_tool("patchelf")
    dest = tmp_path / "payload"
    done = run_script("install-nvidia-smi.sh", dest, real_smi_deb())
    assert done.returncode == 0, done.stderr
    assert "installed nvidia-smi 535." in done.stdout
    # Exactly one file lands, and nothing beside it.
    tree = snapshot(dest)
    assert sorted(k for k, v in tree.items() if v[0] != "dir") == [SMI_TARGET]
    assert tree[SMI_TARGET][1] == 0o755
    rpath = subprocess.run(
        [patchelf, "--print-rpath", dest / SMI_TARGET], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert rpath == RPATH
    needed = subprocess.run(
        [patchelf, "--print-needed", dest / SMI_TARGET], capture_output=True, text=True, check=True
    ).stdout.split()
    # nvidia-smi dlopens NVML; it must not link it (the mock is found at run time).
    assert not [lib for lib in needed if "nvidia-ml" in lib]


@pytest.mark.realclient
def test_installed_nvidia_smi_finds_nvml_beside_it_through_its_runpath(tmp_path: Path) -> None:
    """Staged as <driver>/usr/bin/nvidia-smi, it loads <driver>/usr/lib64/libnvidia-ml.so.1.

    No LD_LIBRARY_PATH: the RUNPATH alone must lead its dlopen there.  A stub
    NVML whose init answers DRIVER_NOT_LOADED (9) proves which library ran.
    """
    gcc = require_tool("gcc")
    dest = tmp_path / "payload"
    assert run_script("install-nvidia-smi.sh", dest, real_smi_deb()).returncode == 0
    driver = tmp_path / "driver"
    (driver / "usr" / "bin").mkdir(parents=True)
    smi = driver / "usr" / "bin" / "nvidia-smi"
    shutil.copy2(dest / SMI_TARGET, smi)

    def run_smi() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(smi), "-L"],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin"},
            cwd=tmp_path,
            timeout=60,
        )

    missing = run_smi()
    assert missing.returncode == 12, missing.stdout
    assert "couldn't find libnvidia-ml.so" in missing.stdout

    source = tmp_path / "stub.c"
    source.write_text(
        "int nvmlInitWithFlags(unsigned int flags) { (void)flags; return 9; }\n"
        "int nvmlInit_v2(void) { return 9; }\n"
        "int nvmlShutdown(void) { return 0; }\n"
    )
    lib = driver / "usr" / "lib64" / "libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True)
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(lib), str(source)],
        check=True,
    )
    found = run_smi()
    assert found.returncode == 9, found.stdout
    assert "couldn't communicate with the NVIDIA driver" in found.stdout


@pytest.mark.realclient
def test_install_nvidia_smi_refuses_another_package(tmp_path: Path) -> None:
    deb = build_deb(
        tmp_path / "debs", "nvidia-smi-impostor", "1.0-1", {"usr/bin/nvidia-smi": "#!/bin/sh\n"}
    )
    done = run_script("install-nvidia-smi.sh", tmp_path / "payload", deb)
    assert done.returncode != 0
    assert "package is 'nvidia-smi-impostor', expected nvidia-smi" in done.stderr
    assert not (tmp_path / "payload").exists()


@pytest.mark.realclient
def test_install_nvidia_smi_usage(tmp_path: Path) -> None:
    done = run_script("install-nvidia-smi.sh")
    assert done.returncode != 0
    assert "usage: install-nvidia-smi.sh DESTDIR [DEB]" in done.stderr
    done = run_script("install-nvidia-smi.sh", tmp_path / "payload", tmp_path / "missing.deb")
    assert done.returncode != 0
    assert "missing.deb: no such .deb" in done.stderr


# --------------------------------------------------------------------------
# install-toolkit.sh
# --------------------------------------------------------------------------


@pytest.mark.realclient
def test_install_toolkit_layout(tmp_path: Path) -> None:
    debs = tmp_path / "debs"
    toolkit_debs(debs, "1.18.0-1")
    dest = tmp_path / "payload"
    done = run_script("install-toolkit.sh", dest, debs, "1.18.0-1")
    assert done.returncode == 0, done.stderr
    assert "installed NVIDIA Container Toolkit 1.18.0-1" in done.stdout
    tree = snapshot(dest)
    files = {k: v for k, v in tree.items() if v[0] != "dir"}
    assert sorted(files) == sorted(f"{TOOLKIT_TARGET}/{b}" for b in TOOLKIT_BINARIES)
    for binary in TOOLKIT_BINARIES:
        kind, mode, content = files[f"{TOOLKIT_TARGET}/{binary}"]
        assert (kind, mode) == ("file", 0o755)
        assert content == f"#!/bin/sh\necho {binary} 1.18.0-1\n".encode()
    # The pin may also come from the environment, as the Containerfile's ARG.
    again = run_script(
        "install-toolkit.sh",
        tmp_path / "payload2",
        debs,
        env={"NVIDIA_CONTAINER_TOOLKIT_VERSION": "1.18.0-1"},
    )
    assert again.returncode == 0, again.stderr
    assert snapshot(tmp_path / "payload2") == tree


@pytest.mark.realclient
@pytest.mark.parametrize(
    ("make", "pin", "message"),
    [
        (
            lambda d: toolkit_debs(d, "1.18.0-1"),
            "1.17.8-1",
            "version 1.18.0-1, expected the pinned 1.17.8-1",
        ),
        (
            lambda d: toolkit_debs(d, "1.18.0-1", base_version="1.17.8-1"),
            "",
            "nvidia-container-toolkit is 1.18.0-1 but the other package is 1.17.8-1",
        ),
        (
            lambda d: toolkit_debs(d, "1.18.0-1", drop="nvidia-cdi-hook"),
            "",
            "no executable usr/bin/nvidia-cdi-hook",
        ),
        (
            lambda d: toolkit_debs(
                d, "1.18.0-1", arch="s390x" if debian_arch() != "s390x" else "amd64"
            ),
            "",
            "expected " + debian_arch(),
        ),
        (
            lambda d: [*toolkit_debs(d / "a", "1.18.0-1"), *toolkit_debs(d / "b", "1.17.8-1")],
            "",
            "more than one nvidia-container-toolkit",
        ),
        (lambda d: d.mkdir(), "", "no nvidia-container-toolkit-base .deb"),
    ],
    ids=["pin", "mixed-versions", "missing-binary", "architecture", "duplicate", "empty"],
)
def test_install_toolkit_refusals(tmp_path: Path, make, pin: str, message: str) -> None:
    debs = tmp_path / "debs"
    make(debs)
    for sub in ("a", "b"):
        # The duplicate case builds in two directories; gather them in one.
        if (debs / sub).is_dir():
            for deb in (debs / sub).glob("*.deb"):
                deb.rename(debs / f"{sub}-{deb.name}")
    args = [tmp_path / "payload", debs, *([pin] if pin else [])]
    done = run_script("install-toolkit.sh", *args)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert not (tmp_path / "payload" / TOOLKIT_TARGET / "nvidia-ctk").exists()


# --------------------------------------------------------------------------
# fetch-toolkit.sh against a local, signed apt repository
# --------------------------------------------------------------------------


class SignedRepo:
    """A flat apt repository (Packages, signed InRelease) and its armoured public key."""

    def __init__(self, directory: Path, gnupg_home: Path) -> None:
        self.directory = directory
        self.gnupg_home = gnupg_home
        self.key = directory.parent / "key.asc"

    def gpg(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                require_tool("gpg"),
                "--batch",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
                *args,
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "GNUPGHOME": str(self.gnupg_home)},
            timeout=120,
        )

    def publish(self, debs: list[Path]) -> None:
        stanzas = []
        for deb in debs:
            control = subprocess.run(
                ["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True
            ).stdout.rstrip("\n")
            data = deb.read_bytes()
            stanzas.append(
                f"{control}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
                f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
            )
            shutil.copy2(deb, self.directory / deb.name)
        packages = "\n".join(stanzas).encode()
        (self.directory / "Packages").write_bytes(packages)
        (self.directory / "Release").write_text(
            "Origin: mokka-tests\nLabel: mokka-tests\n"
            "Date: Thu, 01 Jan 2026 00:00:00 UTC\nSHA256:\n"
            f" {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
        )
        self.gpg("--quick-gen-key", "Mokka tests <tests@invalid>", "ed25519", "sign", "never")
        self.gpg(
            "--clearsign", "-o", str(self.directory / "InRelease"), str(self.directory / "Release")
        )
        self.key.write_text(self.gpg("--armor", "--export").stdout)


@pytest.fixture
def gnupg_home() -> Iterator[Path]:
    # A short path: gpg-agent's socket path must fit in sun_path.
    home = Path(tempfile.mkdtemp(prefix="mokka-gpg-", dir="/tmp"))
    home.chmod(0o700)
    try:
        yield home
    finally:
        # gpg started an agent for this home; stop exactly that one.
        subprocess.run(
            ["gpgconf", "--kill", "gpg-agent"],
            env={**os.environ, "GNUPGHOME": str(home)},
            capture_output=True,
            check=False,
        )
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def signed_repo(tmp_path: Path, gnupg_home: Path) -> SignedRepo:
    require_tool("apt-get")
    require_tool("curl")
    build = tmp_path / "build"
    debs = toolkit_debs(build / "new", "1.18.0-1") + toolkit_debs(build / "old", "1.17.8-1")
    repo_dir = tmp_path / "repo"
    repo_dir.mkdir()
    repo = SignedRepo(repo_dir, gnupg_home)
    repo.publish(debs)
    return repo


@pytest.mark.realclient
def test_fetch_toolkit_downloads_the_pinned_version(
    tmp_path: Path, signed_repo: SignedRepo
) -> None:
    debs = tmp_path / "fetched"
    env = {
        "TOOLKIT_REPO": f"file://{signed_repo.directory}",
        "TOOLKIT_KEY_URL": f"file://{signed_repo.key}",
    }
    done = run_script("fetch-toolkit.sh", "1.17.8-1", debs, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    arch = debian_arch()
    assert sorted(p.name for p in debs.iterdir()) == [
        f"nvidia-container-toolkit-base_1.17.8-1_{arch}.deb",
        f"nvidia-container-toolkit_1.17.8-1_{arch}.deb",
    ]
    # The fetched pair goes straight into install-toolkit.sh, as in the Containerfile.
    dest = tmp_path / "payload"
    installed = run_script("install-toolkit.sh", dest, debs, "1.17.8-1")
    assert installed.returncode == 0, installed.stderr
    ctk = dest / TOOLKIT_TARGET / "nvidia-ctk"
    assert (
        subprocess.run([str(ctk)], capture_output=True, text=True).stdout == "nvidia-ctk 1.17.8-1\n"
    )


@pytest.mark.realclient
def test_fetch_toolkit_refuses_an_unknown_version(tmp_path: Path, signed_repo: SignedRepo) -> None:
    env = {
        "TOOLKIT_REPO": f"file://{signed_repo.directory}",
        "TOOLKIT_KEY_URL": f"file://{signed_repo.key}",
    }
    done = run_script("fetch-toolkit.sh", "9.9.9-1", tmp_path / "fetched", env=env)
    assert done.returncode != 0
    assert "version 9.9.9-1 of the toolkit packages is not in" in done.stderr
    assert list((tmp_path / "fetched").glob("*.deb")) == []


@pytest.mark.realclient
def test_fetch_toolkit_refuses_a_repository_signed_by_another_key(
    tmp_path: Path, signed_repo: SignedRepo
) -> None:
    # Re-sign the repository with a fresh key, but hand the script the old one.
    old_key = tmp_path / "old-key.asc"
    shutil.copy2(signed_repo.key, old_key)
    other = SignedRepo(signed_repo.directory, signed_repo.gnupg_home / "other")
    other.gnupg_home.mkdir(mode=0o700)
    try:
        other.gpg("--quick-gen-key", "Someone else <else@invalid>", "ed25519", "sign", "never")
        other.gpg(
            "--yes",
            "--clearsign",
            "-o",
            str(signed_repo.directory / "InRelease"),
            str(signed_repo.directory / "Release"),
        )
        env = {
            "TOOLKIT_REPO": f"file://{signed_repo.directory}",
            "TOOLKIT_KEY_URL": f"file://{old_key}",
        }
        done = run_script("fetch-toolkit.sh", "1.18.0-1", tmp_path / "fetched", env=env)
    finally:
        subprocess.run(
            ["gpgconf", "--kill", "gpg-agent"],
            env={**os.environ, "GNUPGHOME": str(other.gnupg_home)},
            check=False,
        )
    assert done.returncode != 0
    assert "NO_PUBKEY" in done.stdout + done.stderr or "not signed" in done.stdout + done.stderr
    assert list((tmp_path / "fetched").glob("*.deb")) == []


@pytest.mark.realclient
def test_fetch_toolkit_refuses_a_key_that_is_not_a_key(tmp_path: Path) -> None:
    require_tool("curl")
    bogus = tmp_path / "key.html"
    bogus.write_text("<html>not found</html>\n")
    done = run_script(
        "fetch-toolkit.sh",
        "1.18.0-1",
        tmp_path / "fetched",
        env={"TOOLKIT_REPO": f"file://{tmp_path}", "TOOLKIT_KEY_URL": f"file://{bogus}"},
    )
    assert done.returncode != 0
    assert "not an ASCII-armoured PGP public key" in done.stderr


# --------------------------------------------------------------------------
# verify-layout.sh: the whole payload
# --------------------------------------------------------------------------


@pytest.mark.realclient
def test_verify_layout_accepts_the_scripts_payload(tmp_path: Path) -> None:
    require_tool("patchelf")
    dest = tmp_path / "payload"
    toolkit_debs(tmp_path / "debs", "1.18.0-1")
    assert run_script("install-nvidia-smi.sh", dest, real_smi_deb()).returncode == 0
    assert run_script("install-toolkit.sh", dest, tmp_path / "debs").returncode == 0
    install_ib_tools(dest)
    done = run_script("verify-layout.sh", dest)
    assert done.returncode == 0, done.stderr
    assert "as the simulators expect" in done.stdout


@pytest.mark.realclient
def test_verify_layout_names_every_drift(tmp_path: Path) -> None:
    require_tool("patchelf")
    dest = tmp_path / "payload"
    toolkit_debs(tmp_path / "debs", "1.18.0-1")
    assert run_script("install-nvidia-smi.sh", dest, real_smi_deb()).returncode == 0
    assert run_script("install-toolkit.sh", dest, tmp_path / "debs").returncode == 0
    ib = install_ib_tools(dest)
    subprocess.run(["patchelf", "--remove-rpath", str(dest / SMI_TARGET)], check=True)
    (dest / TOOLKIT_TARGET / "VERSION").write_text("1.18.0-1\n")
    (dest / TOOLKIT_TARGET / "nvidia-ctk").chmod(0o644)
    subprocess.run(["patchelf", "--remove-rpath", str(ib / "bin" / "ibstat")], check=True)
    (ib / "lib" / "libnl-3.so.200").unlink()
    shutil.copy2("/lib/x86_64-linux-gnu/libc.so.6" if Path("/lib/x86_64-linux-gnu/libc.so.6")
                 .exists() else ib / "lib" / "libibumad.so.3", ib / "lib" / "libc.so.6")
    (ib / "bin" / "ibsysstat").unlink()
    (ib / "bin" / "saquery").write_text("#!/bin/sh\n")
    done = run_script("verify-layout.sh", dest)
    assert done.returncode == 1
    assert f"{TOOLS_TARGET}/bin/ibstat: RUNPATH '', expected '$ORIGIN/../lib'" in done.stderr
    assert f"{TOOLS_TARGET}/lib/libnl-route-3.so.200: needs libnl-3.so.200, which is not in" in (
        done.stderr)
    assert f"{TOOLS_TARGET}/lib/libc.so.6: a glibc library" in done.stderr
    assert ("holds 'ibaddr iblinkinfo ibnetdiscover ibping ibportstate ibqueryerrors ibroute "
            "ibstat ibstatus ibtracert ibv_devices ibv_devinfo perfquery saquery sminfo "
            "smpquery'") in done.stderr
    assert f"{TOOLS_TARGET}/bin/ibsysstat: missing or not executable" in done.stderr
    assert f"{SMI_TARGET}: RUNPATH '', expected '$ORIGIN/../lib64'" in done.stderr
    assert "holds 'VERSION nvidia-cdi-hook nvidia-container-runtime nvidia-ctk'" in done.stderr
    assert f"{TOOLKIT_TARGET}/nvidia-ctk: missing or not executable" in done.stderr


# --------------------------------------------------------------------------
# The scripts and the Containerfile as files
# --------------------------------------------------------------------------


@pytest.mark.realclient
def test_scripts_pass_shellcheck() -> None:
    shellcheck = require_tool("shellcheck")
    scripts = sorted(SCRIPTS.glob("*.sh"))
    assert len(scripts) >= 5
    done = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
    for script in scripts:
        assert script.stat().st_mode & stat.S_IXUSR, f"{script} is not executable"


def containerfile_stages() -> list[tuple[str, str, list[str]]]:
    """(base image, stage name, instructions) per stage, continuation lines joined."""
    text = (ROOT / "Containerfile").read_text()
    lines = re.sub(r"\\\n\s*", " ", text).splitlines()
    stages: list[tuple[str, str, list[str]]] = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            parts = line.split()
            stages.append((parts[1], parts[3] if len(parts) > 3 else "", []))
        elif stages:
            stages[-1][2].append(line)
    return stages


def global_args() -> dict[str, str]:
    text = (ROOT / "Containerfile").read_text()
    head = text.split("\nFROM ", 1)[0]
    return dict(re.findall(r"^ARG (\w+)=(.*)$", head, re.M))


def test_containerfile_stages_and_payload() -> None:
    stages = containerfile_stages()
    args = global_args()
    assert args["PYTHON_IMAGE"].endswith("python:3.11-slim-bookworm")
    assert args["DEBIAN_IMAGE"].endswith("debian:bookworm-slim")
    assert re.fullmatch(r"\d+\.\d+\.\d+-\d+", args["NVIDIA_CONTAINER_TOOLKIT_VERSION"])
    names = [name for _, name, _ in stages]
    assert names == ["wheel", "venv", "payload", ""]
    wheel, _venv, payload, final = (body for _, _, body in stages)
    # The image's dependencies are the pinned ones (deploy/constraints.txt).
    assert (
        "RUN pip wheel --no-cache-dir --wheel-dir /wheels --constraint deploy/constraints.txt ."
        in wheel
    )
    assert any("gcc" in line for line in wheel)
    assert stages[-1][0] == "${DEBIAN_IMAGE}"
    # Every script the build calls exists here and is tested above.
    called = set(re.findall(r"/build/([\w-]+\.sh)", "\n".join(payload)))
    assert called == {
        "install-nvidia-smi.sh",
        "install-ib-tools.sh",
        "fetch-toolkit.sh",
        "install-toolkit.sh",
        "verify-layout.sh",
    }
    assert all((SCRIPTS / name).is_file() for name in called)
    assert any("verify-layout.sh /payload" in line for line in payload)
    # nvidia-smi is downloaded and unpacked, never installed with its
    # libnvidia-ml1 dependency: the mock library is the one it must load.
    installs = [line for _, _, body in stages for line in body if "apt-get install" in line]
    assert installs
    assert not [line for line in installs if "nvidia" in line]
    assert 'ENTRYPOINT ["mokka-node-agent"]' in final
    assert "COPY --from=payload /payload/ /" in final
    assert "COPY --from=venv /opt/mokka /opt/mokka" in final


def test_containerfile_labels_match_the_project() -> None:
    final = containerfile_stages()[-1][2]
    text = " ".join(final)
    labels = dict(re.findall(r'(org\.opencontainers\.image\.\w+)="([^"]*)"', text))
    assert set(labels) >= {
        "org.opencontainers.image.source",
        "org.opencontainers.image.version",
        "org.opencontainers.image.licenses",
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    chart = yaml.safe_load((ROOT / "helm" / "mokka" / "Chart.yaml").read_text())
    version_arg = dict(re.findall(r"^ARG (\w+)=(\S*)$", "\n".join(final), re.M))["VERSION"]
    # One version everywhere: the package's, the image label, the chart's default tag.
    assert version_arg == mokka.__version__ == chart["appVersion"]
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["org.opencontainers.image.licenses"] == project["license"]


def test_image_paths_are_the_simulators_defaults() -> None:
    """The payload lands where the daemon looks by default (no flag needed in the chart)."""
    from mokka.cli import build_parser

    namespace = build_parser().parse_args(["daemon"])
    assert str(namespace.nvidia_smi_binary) == "/" + SMI_TARGET
    assert str(namespace.toolkit_dir) == "/" + TOOLKIT_TARGET
    assert str(namespace.ib_tools_dir) == "/" + TOOLS_TARGET


def test_containerignore_keeps_the_build_inputs() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".containerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    needed = [
        "pyproject.toml",
        "setup.py",
        "MANIFEST.in",
        "LICENSE",
        "README.md",
        "mokka",
        "native",
        "deploy",
    ]
    for name in needed:
        assert name not in patterns, f"{name} is excluded"
        assert f"/{name}" not in patterns, f"{name} is excluded"
    for heavy in (".git", ".venv", ".tools", "mokka/_native"):
        assert heavy in patterns, f"{heavy} would be sent to the build"
