"""The package as it ships: the sdist, the wheels built from it and from the tree.

Everything is built for real, offline, with the venv's own build backend
(``python -m build --no-isolation``, ``pip wheel --no-build-isolation``)
from a copy of the source tree, so the tree itself is never touched.  The
copy keeps whatever an editable install compiled into ``mokka/_native`` plus
a stale file there, as a developer's tree has: none of it may reach a
distribution, which must carry only what its own build produced.
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import venv
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging import tags
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import mokka
from tests.support import ROOT

#: The module fixture compiles the native libraries three times (sdist to
#: wheel, pip wheel of the sdist, pip wheel of the tree): minutes on a busy
#: two-core machine, which the first test using it is charged with.
pytestmark = pytest.mark.timeout(900)

VERSION = mokka.__version__
#: Everything the build hook compiles into mokka/_native.
NATIVE_FILES = {
    "mokka/_native/libnvidia-ml.so.1",
    "mokka/_native/libmockfs.so",
    "mokka/_native/libibshim.so",
    "mokka/_native/libumadshim.so",
    "mokka/_native/libcuda.so.1",
    "mokka/_native/nvidia-smi",
    "mokka/_native/nvml-coverage.json",
}
STALE = "mokka/_native/libstale-leftover.so"
#: Not part of a source tree: caches, venvs, build output.
NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".tools",
    ".ruff_cache",
    ".pytest_cache",
    "__pycache__",
    "*.egg-info",
    "build",
    "dist",
    "mokka-node",
)


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        # Offline: every build requirement comes from this venv.
        env={**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout}\n{done.stderr}"
    return done


@dataclass(frozen=True)
class Built:
    sdist: Path
    #: python -m build: the wheel built from the sdist
    wheel_from_sdist: Path
    #: pip wheel <sdist>
    pip_wheel_of_sdist: Path
    #: pip wheel . in the source tree
    wheel_from_tree: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    base = tmp_path_factory.mktemp("packaging")
    tree = base / "src"
    shutil.copytree(ROOT, tree, ignore=NOT_SOURCES, symlinks=True)
    (tree / "mokka" / "_native").mkdir(exist_ok=True)
    (tree / STALE).write_bytes(b"left over from an old build")

    py = sys.executable
    # Without --sdist/--wheel, build makes the sdist and then the wheel from it.
    run(py, "-m", "build", "--no-isolation", "--outdir", base / "build", tree, cwd=base)
    (sdist,) = (base / "build").glob("*.tar.gz")
    (wheel_from_sdist,) = (base / "build").glob("*.whl")
    pip_wheel = (py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--quiet")
    run(*pip_wheel, "--wheel-dir", base / "pip-sdist", sdist, cwd=base)
    (pip_wheel_of_sdist,) = (base / "pip-sdist").glob("*.whl")
    run(*pip_wheel, "--wheel-dir", base / "pip-tree", ".", cwd=tree)
    (wheel_from_tree,) = (base / "pip-tree").glob("*.whl")
    return Built(sdist, wheel_from_sdist, pip_wheel_of_sdist, wheel_from_tree)


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def wheel_metadata(wheel: Path, name: str) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        return email.message_from_bytes(zf.read(f"mokka-{VERSION}.dist-info/{name}"))


def platform_tag() -> str:
    """The wheel's platform: manylinux_2_34 on this machine's architecture."""
    arch = sysconfig.get_platform().replace("-", "_").replace(".", "_").removeprefix("linux_")
    return f"manylinux_2_34_{arch}"


# --------------------------------------------------------------------------
# sdist and wheels
# --------------------------------------------------------------------------


def test_sdist_carries_the_native_sources_and_the_license(built: Built) -> None:
    prefix = f"mokka-{VERSION}/"
    with tarfile.open(built.sdist) as tar:
        names = {m.name.removeprefix(prefix) for m in tar.getmembers() if m.isfile()}
    native_sources = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "native").rglob("*")
        if p.suffix in {".c", ".h", ".py"} and "__pycache__" not in p.parts
    }
    assert native_sources, "no native sources found in the tree"
    assert native_sources <= names, f"missing from the sdist: {sorted(native_sources - names)}"
    assert {"LICENSE", "setup.py", "pyproject.toml", "MANIFEST.in"} <= names
    # Build products never travel as sources.
    assert not [n for n in names if n.startswith("mokka/_native/")]
    assert not [n for n in names if n.endswith((".so", ".o", ".pyc"))]


def test_every_wheel_has_the_same_files(built: Built) -> None:
    """The sdist builds the wheel `pip wheel .` builds, whichever tool builds it."""
    from_tree = wheel_names(built.wheel_from_tree)
    assert wheel_names(built.wheel_from_sdist) == from_tree
    assert wheel_names(built.pip_wheel_of_sdist) == from_tree
    assert from_tree >= NATIVE_FILES
    assert STALE not in from_tree
    assert {f"mokka/state/profiles/{p}.yaml" for p in ("h100", "gb200", "t4")} <= from_tree
    assert f"mokka-{VERSION}.dist-info/licenses/LICENSE" in from_tree


def test_the_wheel_is_tagged_for_any_python3_on_glibc_2_34(built: Built) -> None:
    expected = f"py3-none-{platform_tag()}"
    for wheel in (built.wheel_from_tree, built.wheel_from_sdist, built.pip_wheel_of_sdist):
        assert wheel.name == f"mokka-{VERSION}-{expected}.whl"
        info = wheel_metadata(wheel, "WHEEL")
        assert info.get_all("Tag") == [expected]
        # Platform-specific: it ships machine code, so it is not a pure wheel.
        assert info["Root-Is-Purelib"] == "false"
    assert wheel_metadata(built.wheel_from_tree, "METADATA")["Requires-Python"] == ">=3.11"


@pytest.mark.parametrize("python_version", ["3.11", "3.12", "3.13", "3.14"])
def test_pip_accepts_the_wheel_for_later_pythons(
    built: Built, tmp_path: Path, python_version: str
) -> None:
    """pip's own tag check, as it runs for another interpreter version.

    ``--python-version`` makes pip select the wheel as it would for that
    interpreter: the check that refused the former cp311-cp311 tag on Python
    3.12.  It covers versions no interpreter is installed for here (3.14);
    3.12 and 3.13 are also installed for real below.
    """
    done = run(
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", python_version,
        "--find-links", built.wheel_from_tree.parent, "--dest", tmp_path,
        f"mokka=={VERSION}",
        cwd=tmp_path,
    )  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == [built.wheel_from_tree.name], done.stdout
    # And packaging's tag list for CPython 3.12 on this machine (glibc 2.34 or
    # newer: Debian bookworm has 2.36) includes it.
    cp312 = set(tags.compatible_tags(python_version=(3, 12)))
    assert tags.Tag("py3", "none", platform_tag()) in cp312


def later_python(version: str) -> Path:
    """A CPython ``version`` interpreter: on PATH, or one pyenv installed.

    Debian bookworm packages only Python 3.11; the machines this project is
    built on carry later CPythons under pyenv.  A missing one fails the test
    with a way to get it rather than passing quietly.
    """
    found = shutil.which(f"python{version}")
    candidates = [Path(found)] if found else []
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(pyenv_root.glob(f"versions/{version}.*/bin/python{version}"))
    for candidate in candidates:
        probe = subprocess.run(
            [str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    pytest.fail(
        f"no Python {version} interpreter found (PATH, {pyenv_root}/versions); install one "
        f"(e.g. `pyenv install {version}`) to test the wheel on a Python other than 3.11"
    )


@pytest.mark.realclient
@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_the_wheel_installs_and_loads_on_a_later_python(
    built: Built, tmp_path: Path, version: str
) -> None:
    """A real install by that Python's own pip, then its native files in use there."""
    python = later_python(version)
    run(python, "-m", "venv", tmp_path / "venv", cwd=tmp_path)
    vpy = tmp_path / "venv" / "bin" / "python"
    run(vpy, "-m", "pip", "install", "--quiet", "--no-deps", built.wheel_from_sdist, cwd=tmp_path)
    probe = (
        "import ctypes, importlib.metadata as m, pathlib, sys, mokka;"
        "native = pathlib.Path(mokka.__file__).parent / '_native';"
        "lib = ctypes.CDLL(str(native / 'libnvidia-ml.so.1'));"
        "print(sys.version_info[:2] == tuple(map(int, sys.argv[1].split('.'))),"
        " m.version('mokka'), hasattr(lib, 'nvmlInit_v2'), str(native).startswith(sys.prefix))"
    )
    done = run(vpy, "-c", probe, version, cwd=tmp_path)
    assert done.stdout.split() == ["True", VERSION, "True", "True"]


def test_two_builds_in_two_directories_are_identical(built: Built) -> None:
    """Reproducible: three builds (two unpacked sdists in temp directories, the
    tree copy) give the same bytes, native libraries and timestamps included."""
    data = built.wheel_from_tree.read_bytes()
    assert built.wheel_from_sdist.read_bytes() == data
    assert built.pip_wheel_of_sdist.read_bytes() == data
    with zipfile.ZipFile(built.wheel_from_tree) as zf:
        for info in zf.infolist():
            assert str(built.sdist.parent.parent) not in zf.read(info).decode("latin-1"), (
                f"{info.filename} carries the build directory's path"
            )


def test_auditwheel_finds_nothing_newer_than_manylinux_2_34(built: Built) -> None:
    """The tag is what auditwheel derives from the native files' symbol versions.

    The fallback ``nvidia-smi`` finds ``libnvidia-ml.so.1`` through its
    RUNPATH: ``$ORIGIN/../lib64`` once staged in a driver tree, ``$ORIGIN`` in
    the wheel, where the wheel's own mock library sits beside it.
    """
    auditwheel = Path(sys.executable).with_name("auditwheel")
    assert auditwheel.exists(), "auditwheel is missing: install the test extras (./scripts/test)"
    done = run(auditwheel, "show", "--json", built.wheel_from_tree, cwd=built.sdist.parent)
    report = json.loads(done.stdout)
    assert report["sym_tag"] == platform_tag()
    assert report["overall_tag"] == platform_tag()
    assert report["external_libs"] == {}
    assert set(report["versioned_symbols"]) <= {"libc.so.6", "libm.so.6"}
    assert "mokka/_native/libnvidia-ml.so.1" in wheel_names(built.wheel_from_tree)


def test_the_metadata_names_the_project_and_its_classifiers(built: Built) -> None:
    meta = wheel_metadata(built.wheel_from_tree, "METADATA")
    source = re.search(r"^ARG SOURCE_URL=(\S+)$", (ROOT / "Containerfile").read_text(), re.M)[1]
    urls = dict(line.split(", ", 1) for line in meta.get_all("Project-URL"))
    assert urls["Source"] == source
    assert all(url.startswith(source) for url in urls.values()), urls
    chart = yaml.safe_load((ROOT / "helm" / "mokka" / "Chart.yaml").read_text())
    assert chart["sources"] == [source]
    assert chart["home"] == source
    assert chart["maintainers"]
    classifiers = meta.get_all("Classifier")
    assert "Operating System :: POSIX :: Linux" in classifiers
    for minor in (11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    # The licence is the SPDX expression; a licence classifier beside it is refused.
    assert not [c for c in classifiers if c.startswith("License ::")]


def test_every_page_the_readme_links_is_in_the_sdist(built: Built) -> None:
    prefix = f"mokka-{VERSION}/"
    with tarfile.open(built.sdist) as tar:
        names = {m.name.removeprefix(prefix) for m in tar.getmembers() if m.isfile()}
    seen: set[str] = set()
    pending = ["README.md"]
    while pending:
        page = pending.pop()
        if page in seen:
            continue
        seen.add(page)
        assert page in names, f"{page} is linked from the README's pages but not in the sdist"
        if page.endswith(".md"):
            for target in re.findall(r"\]\(([^)\s#]+)", (ROOT / page).read_text()):
                if not re.match(r"[a-z]+:", target):
                    pending.append(os.path.normpath(os.path.join(os.path.dirname(page), target)))
    assert "docs/quickstart-kind.md" in seen
    assert "helm/mokka/README.md" in seen


def test_the_charts_readme_links_stay_inside_a_packaged_chart() -> None:
    chart = ROOT / "helm" / "mokka"
    for target in re.findall(r"\]\(([^)\s#]+)", (chart / "README.md").read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        resolved = (chart / target).resolve()
        assert resolved.is_relative_to(chart), (
            f"helm/mokka/README.md links outside the chart: {target}"
        )
        assert resolved.exists(), target


def test_native_files_do_not_use_the_cpython_abi(built: Built, tmp_path: Path) -> None:
    """What makes the py3-none tag true: nothing native links or calls libpython."""
    readelf = shutil.which("readelf")
    assert readelf, "readelf (binutils, installed with gcc) is needed to inspect the wheel"
    with zipfile.ZipFile(built.wheel_from_tree) as zf:
        zf.extractall(tmp_path)
    machine_code = sorted(
        name
        for name in wheel_names(built.wheel_from_tree)
        if name.startswith("mokka/_native/") and not name.endswith(".json")
    )
    assert set(machine_code) >= NATIVE_FILES - {"mokka/_native/nvml-coverage.json"}
    for name in machine_code:
        path = tmp_path / name
        dynamic = run(readelf, "--dynamic", path, cwd=tmp_path).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
        assert needed, f"{name}: no NEEDED entries (not a dynamic ELF file?)"
        assert not [n for n in needed if "python" in n], f"{name} links {needed}"
        symbols = run(readelf, "--dyn-syms", "--wide", path, cwd=tmp_path).stdout
        undefined = re.findall(r"\bUND\s+(\S+)", symbols)
        assert not [s for s in undefined if s.startswith(("Py", "_Py"))], name


def test_the_installed_wheel_reports_its_version(built: Built, tmp_path: Path) -> None:
    """The version comes from mokka/__init__.py into the metadata of the wheel."""
    target = tmp_path / "site"
    run(
        sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", target,
        built.wheel_from_sdist,
        cwd=tmp_path,
    )  # fmt: skip
    # -S: no site-packages, so neither the venv's editable mokka nor its
    # metadata can answer in place of the installed wheel.
    probe = (
        "import importlib.metadata as m, mokka, os;"
        "print(mokka.__file__, mokka.__version__, m.version('mokka'),"
        " os.access(os.path.join(os.path.dirname(mokka.__file__), '_native', 'nvidia-smi'),"
        " os.X_OK))"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        cwd=tmp_path,  # not the source tree, which `-c` would put first on sys.path
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out == [str(target / "mokka" / "__init__.py"), VERSION, VERSION, "True"]


# --------------------------------------------------------------------------
# One version, one licence
# --------------------------------------------------------------------------


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mokka.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)
    # Literal copies that cannot read the package are held equal here.
    chart = yaml.safe_load((ROOT / "helm" / "mokka" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION
    image_tags = {
        f"{path.relative_to(ROOT)}: {tag}"
        for path in [ROOT / "Containerfile", ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
        for tag in re.findall(r"ghcr\.io/mokka/mokka:([\w.-]+)", path.read_text())
    }
    assert image_tags, "no image reference found in the docs"
    assert {t for t in image_tags if not t.endswith(f": {VERSION}")} == set()


def test_the_license_is_the_apache_2_text(built: Built) -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text.splitlines()[1]
    assert "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    meta = wheel_metadata(built.wheel_from_sdist, "METADATA")
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]


# --------------------------------------------------------------------------
# The image's pinned dependencies
# --------------------------------------------------------------------------


def constraint_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "deploy" / "constraints.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)", line)
        assert match, f"deploy/constraints.txt: {line!r} is not an exact name==version pin"
        pins[canonicalize_name(match[1])] = match[2]
    return pins


def test_constraints_pin_every_runtime_dependency_within_its_range() -> None:
    pins = constraint_pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in pins, f"deploy/constraints.txt does not pin {name}"
        assert req.specifier.contains(pins[name]), (
            f"deploy/constraints.txt pins {name}=={pins[name]}, outside pyproject's {req}"
        )
    # The transitive closure as this venv resolved it (names: versions may
    # move on in a fresh venv, the image keeps the tested ones).
    closure: set[str] = set()
    pending = [Requirement(line).name for line in project["dependencies"]]
    while pending:
        dist = metadata.distribution(pending.pop())
        name = canonicalize_name(dist.metadata["Name"])
        if name in closure:
            continue
        closure.add(name)
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                pending.append(req.name)
    missing = closure - set(pins)
    assert not missing, f"not pinned: {sorted(missing)}; run deploy/update-constraints.py"
    # Nothing for tests only: the image installs what running needs.
    assert not {"pytest", "httpx", "nvidia-ml-py", "ruff"} & set(pins)


# --------------------------------------------------------------------------
# The quick start and CI scripts
# --------------------------------------------------------------------------


def script_commands(name: str) -> list[str]:
    lines = (ROOT / "scripts" / name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_the_quick_start_installs_no_test_extras() -> None:
    assert "./scripts/bootstrap" in script_commands("daemon")
    assert not [c for c in script_commands("daemon") if "--test" in c or "[test]" in c]
    # CI (.ci/run -> scripts/test) still installs everything the tests need.
    assert "./scripts/bootstrap --test" in script_commands("test")
    assert "./scripts/install-system-deps" in script_commands("test")
    assert "./scripts/test" in (ROOT / ".ci" / "run").read_text()
    bootstrap = (ROOT / "scripts" / "bootstrap").read_text()
    assert 'extras="[test]"' in bootstrap
    assert 'pip install --quiet --progress-bar off -e ".${extras}"' in bootstrap


@pytest.mark.realclient
def test_bootstrap_skips_an_install_that_is_current(tmp_path: Path) -> None:
    """A second start reinstalls nothing; a changed native source reinstalls.

    Runs the real script in a copy of the inputs it hashes, with a real
    .venv made without pip: an install attempt prints its "installing" line
    and then fails, so nothing can be installed anywhere.
    """
    shutil.copytree(ROOT / "native", tmp_path / "native", ignore=NOT_SOURCES)
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "scripts" / "lib", tmp_path / "scripts" / "lib")
    shutil.copy(ROOT / "scripts" / "bootstrap", tmp_path / "scripts" / "bootstrap")
    venv.create(tmp_path / ".venv", with_pip=False)

    def bootstrap(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(tmp_path / "scripts" / "bootstrap"), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    # No stamp: it installs (and fails offline, before writing a stamp).
    first = bootstrap()
    assert "mokka: installing mokka into .venv" in first.stdout
    assert first.returncode != 0
    assert "No module named pip" in first.stderr
    assert not (tmp_path / ".venv" / ".mokka-install-stamp").exists()

    # A stamp the script would write for a test install of these inputs.
    digest = subprocess.run(
        ["bash", "-c", 'source <(sed -n "/^inputs_hash()/,/^}/p" scripts/bootstrap); inputs_hash'],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    (tmp_path / ".venv" / ".mokka-install-stamp").write_text(f"{digest} [test]\n")
    for args in ((), ("--test",)):
        done = bootstrap(*args)
        assert done.returncode == 0, done.stderr
        assert "mokka: .venv is up to date ([test])" in done.stdout
        assert "installing" not in done.stdout

    # A runtime-only install does not serve the tests.
    (tmp_path / ".venv" / ".mokka-install-stamp").write_text(f"{digest} runtime\n")
    assert "up to date" in bootstrap().stdout
    assert "mokka: installing mokka[test]" in bootstrap("--test").stdout

    # A changed native source makes the stamp stale.
    (tmp_path / ".venv" / ".mokka-install-stamp").write_text(f"{digest} [test]\n")
    source = next((tmp_path / "native").rglob("*.c"))
    source.write_text(source.read_text() + "\n/* changed */\n")
    assert "mokka: installing mokka into .venv" in bootstrap().stdout
