"""The setup scripts say what they are doing: one line on stderr as each step starts and
one when it ends, with its duration; a warm run prints no step at all.

``scripts/bootstrap``, ``scripts/install-system-deps`` and ``scripts/install-consumers``
run for real against stand-ins for what is slow or changes the machine: a Python whose
``-m venv`` makes a venv of itself, ``dpkg-query``/``apt-get`` that only record their
arguments, a ``go`` that writes a binary reporting the release it was asked for.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.consumers import SCRIPT as INSTALL_CONSUMERS
from tests.consumers import components, containerd, containerd_versions
from tests.support import ROOT

pytestmark = pytest.mark.timeout(60)

STEP = re.compile(
    r"^(?P<script>[\w-]+): \[(?P<n>\d+)/(?P<total>\d+)\] (?P<what>.+?) \.\.\.(?P<end>.*)$"
)
END = re.compile(r"^ (done in|failed after) \d+ s$")


def steps(stderr: str, script: str) -> list[tuple[int, int, str, str]]:
    """``(n, total, what, end)`` per step line; every line must be one, started before it ends."""
    found = []
    for line in stderr.splitlines():
        match = STEP.match(line)
        assert match, f"not a step line: {line!r}"
        assert match["script"] == script
        assert match["end"] == "" or END.match(match["end"]), line
        found.append((int(match["n"]), int(match["total"]), match["what"], match["end"].strip()))
    # Each step: a start line, then its end line with the same number and words.
    for start, end in zip(found[::2], found[1::2], strict=True):
        assert start[:3] == end[:3]
        assert start[3] == ""
        assert end[3]
    return found


def stub(directory: Path, name: str, body: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text("#!/bin/bash\n" + body)
    (directory / name).chmod(0o755)


def run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=30, env={**os.environ, **env}
    )


# --------------------------------------------------------------------------
# scripts/bootstrap
# --------------------------------------------------------------------------

#: A Python that records its calls: ``-m venv DIR`` makes ``DIR/bin/python`` (itself),
#: ``-c`` prints a version, a pip install fails when FAIL_INSTALL is set.
FAKE_PYTHON = """\
echo "$*" >> "$CALLS"
case "$1 ${2:-}" in
  "-m venv") mkdir -p "$3/bin"; cp "$0" "$3/bin/python" ;;
  "--version ") echo "Python 3.11.2" ;;
  "-c "*) echo 0.1.0 ;;
esac
case " $* " in *" -e "*) [ -z "${FAIL_INSTALL:-}" ] || exit 1 ;; esac
exit 0
"""


def bootstrap_tree(tmp_path: Path) -> Path:
    """A copy of what bootstrap reads (the inputs it hashes) and the script itself."""
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "native",
        tree / "native",
        ignore=lambda d, names: [
            n for n in names if not (Path(d, n).is_dir() or n.endswith((".c", ".h", ".py")))
        ],
    )
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "scripts" / "lib", tree / "scripts" / "lib")
    shutil.copy(ROOT / "scripts" / "bootstrap", tree / "scripts" / "bootstrap")
    stub(tmp_path / "bin", "python", FAKE_PYTHON)
    return tree


def test_bootstrap_prints_each_step_of_a_first_run(tmp_path: Path) -> None:
    tree = bootstrap_tree(tmp_path)
    env = {"PYTHON": str(tmp_path / "bin" / "python"), "CALLS": str(tmp_path / "calls")}

    first = run(["bash", "scripts/bootstrap", "--test"], tree, **env)
    assert first.returncode == 0, first.stderr
    found = steps(first.stderr, "bootstrap")
    assert [(n, total, what) for n, total, what, end in found[::2]] == [
        (1, 3, "creating .venv"),
        (2, 3, "upgrading pip"),
        (3, 3, "installing mokka[test] and its dependencies, compiling the native libraries"),
    ]
    assert "mokka: installed mokka[test] 0.1.0" in first.stdout
    assert (
        "-m pip install --quiet --progress-bar off -e .[test]" in (tmp_path / "calls").read_text()
    )

    # Warm: nothing to do, no step, one line.
    warm = run(["bash", "scripts/bootstrap", "--test"], tree, **env)
    assert warm.returncode == 0
    assert warm.stderr == ""
    assert warm.stdout == "mokka: .venv is up to date ([test])\n"


def test_bootstrap_says_which_step_failed(tmp_path: Path) -> None:
    tree = bootstrap_tree(tmp_path)
    env = {"PYTHON": str(tmp_path / "bin" / "python"), "CALLS": str(tmp_path / "calls")}
    assert run(["bash", "scripts/bootstrap"], tree, **env).returncode == 0
    (tree / ".venv" / ".mokka-install-stamp").unlink()

    done = run(["bash", "scripts/bootstrap"], tree, FAIL_INSTALL="1", **env)
    assert done.returncode != 0
    found = steps(done.stderr, "bootstrap")
    # The venv exists: one step, and it failed.
    assert [(n, total, what, end.split()[0]) for n, total, what, end in found[1:]] == [
        (1, 1, "installing mokka and its dependencies, compiling the native libraries", "failed")
    ]
    assert not (tree / ".venv" / ".mokka-install-stamp").exists()


# --------------------------------------------------------------------------
# scripts/install-system-deps
# --------------------------------------------------------------------------


def system_deps_path(tmp_path: Path, installed: bool) -> str:
    """dpkg-query saying every package is (or is not) installed; apt-get and sudo recording."""
    bin_dir = tmp_path / "bin"
    status = "install ok installed" if installed else "unknown ok not-installed"
    stub(bin_dir, "dpkg-query", f'printf "%s" "{status}"\n')
    stub(bin_dir, "apt-get", f'echo "apt-get $*" >> {tmp_path / "apt.log"}\n')
    stub(bin_dir, "sudo", 'exec "$@"\n')
    return f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"


def test_install_system_deps_prints_each_step(tmp_path: Path) -> None:
    script = str(ROOT / "scripts" / "install-system-deps")
    path = system_deps_path(tmp_path, installed=False)
    done = run([script, "--build-only"], tmp_path, PATH=path)
    assert done.returncode == 0, done.stderr
    found = steps(done.stderr, "install-system-deps")
    assert [(n, total, what) for n, total, what, end in found[::2]] == [
        (1, 2, "updating apt's package lists"),
        (2, 2, "installing gcc libc6-dev python3-venv"),
    ]
    assert (
        "install -y --no-install-recommends gcc libc6-dev python3-venv"
        in (tmp_path / "apt.log").read_text()
    )
    assert done.stdout == "build dependencies present\n"


def test_install_system_deps_warm_prints_no_step(tmp_path: Path) -> None:
    script = str(ROOT / "scripts" / "install-system-deps")
    path = system_deps_path(tmp_path, installed=True)
    smi, ib = tmp_path / "smi", tmp_path / "ib"
    smi.mkdir()
    ib.mkdir()
    (smi / "nvidia-smi_535_amd64.deb").touch()
    ib_packages = re.search(r"ib_packages=\(([^)]*)\)", Path(script).read_text())[1].split()
    for package in ib_packages:
        (ib / f"{package}_1_amd64.deb").touch()
    for args in ([], ["--build-only"]):
        done = run(
            [script, *args],
            tmp_path,
            PATH=path,
            MOKKA_SMI_DEB_DIR=str(smi),
            MOKKA_IB_DEB_DIR=str(ib),
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        assert done.stdout.endswith("dependencies present\n")
    assert not (tmp_path / "apt.log").exists()


# --------------------------------------------------------------------------
# scripts/install-consumers
# --------------------------------------------------------------------------

#: ``go install -ldflags ... MODULE/cmd/NAME@VERSION``: a NAME in $GOBIN that reports VERSION.
FAKE_GO = """\
if [ "$1" = env ]; then echo go1.26.0; exit 0; fi
target=${!#}
name=${target%@*}
name=${name##*/}
printf '#!/bin/sh\\necho "%s %s"\\n' "$name" "${target##*@}" > "$GOBIN/$name"
chmod +x "$GOBIN/$name"
"""


@pytest.mark.realclient
def test_install_consumers_prints_each_build(tmp_path: Path) -> None:
    """A cache holding the containerd builds (links to the real ones) and no Go-built
    consumer: one step per build, numbered out of the missing ones."""
    cache = tmp_path / "cache"
    (cache / "stamps").mkdir(parents=True)
    (cache / "containerd").mkdir()
    for series in containerd_versions():
        build = containerd(series)
        (cache / "containerd" / build.version).symlink_to(build.bin_dir.parent.parent)
        (cache / "stamps" / f"containerd-{build.version}").write_text(build.deb_version + "\n")
    stub(tmp_path / "go-bin", "go", FAKE_GO)
    go_built = [
        c
        for c in components().values()
        if not c.unavailable and not c.name.startswith("containerd")
    ]
    assert len(go_built) == 6

    done = run(
        [str(INSTALL_CONSUMERS)],
        tmp_path,
        MOKKA_CONSUMERS=str(cache),
        MOKKA_GO_CACHE=str(tmp_path / "go"),
        GO=str(tmp_path / "go-bin" / "go"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = steps(done.stderr, "consumers")
    assert [(n, total, what) for n, total, what, end in found[::2]] == [
        (i, 6, f"building {c.name} {c.version} with Go") for i, c in enumerate(go_built, 1)
    ]
    assert "consumers: all present" in done.stdout

    # Warm: every component present, no step.
    again = run([str(INSTALL_CONSUMERS)], tmp_path, MOKKA_CONSUMERS=str(cache), GO="/bin/false")
    assert again.returncode == 0, again.stderr
    assert again.stderr == ""
