"""docs/quickstart-kind.md and scripts/kind-load, checked against what exists.

No cluster runs here: ``scripts/kind-load`` runs against stub ``kind``,
``podman`` and ``docker`` executables that record their arguments (the stub
directory and a few links to coreutils are the whole PATH, so the machine's
real podman is never reached), and the guide's chart commands are rendered
with the real helm.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helm_tool import Helm, chart_meta, default_values, helm_binary, pod_spec
from tests.support import ROOT

pytestmark = pytest.mark.timeout(120)

GUIDE = ROOT / "docs" / "quickstart-kind.md"
KIND_LOAD = ROOT / "scripts" / "kind-load"
#: What the script needs besides the engines and kind.
TOOLS = ("bash", "sed", "head", "mktemp", "rm", "dirname", "cat", "test")


def default_image() -> str:
    return f"{default_values()['nodeAgent']['image']['repository']}:{chart_meta()['appVersion']}"


def guide_commands() -> list[list[str]]:
    """Every command in the guide's ``sh`` blocks, continuation lines joined, split as sh does."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", GUIDE.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(shlex.split(line, comments=True))
    return commands


def commands_of(program: str) -> list[list[str]]:
    return [c for c in guide_commands() if c[0] == program]


# --------------------------------------------------------------------------
# scripts/kind-load against stubs
# --------------------------------------------------------------------------


def make_path(tmp_path: Path, *stubs: str, fail: str = "") -> tuple[str, Path]:
    """A PATH of argv-recording stubs plus links to the coreutils the script needs.

    Each stub appends one line (its name and arguments, then whether the
    archive it was handed exists) to the log; ``save`` writes the ``-o``
    file as an engine would; the stub named by ``fail`` exits 1.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is not on this machine's PATH"
        (bin_dir / tool).symlink_to(found)
    for name in stubs:
        script = bin_dir / name
        script.write_text(
            "#!/bin/bash\n"
            f'echo "{name} $* | $PWD" >> {log}\n'
            f'[ "{name}" = "{fail}" ] && exit 1\n'
            # An engine's save writes the archive named by -o.
            'if [ "$1" = save ]; then while [ $# -gt 0 ]; do\n'
            '  [ "$1" = -o ] && echo archive > "$2"; shift; done; fi\n'
            # kind records whether the archive it was given is there.
            'if [ "$1" = load ]; then [ -f "$3" ] && echo "archive present" >> '
            f"{log}; fi\n"
            "exit 0\n"
        )
        script.chmod(0o755)
    return str(bin_dir), log


def run_kind_load(path: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KIND_LOAD), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PATH": path, "HOME": str(cwd), "TMPDIR": os.environ.get("TMPDIR", "/tmp")},
        timeout=60,
    )


def calls(log: Path) -> list[list[str]]:
    """Each stub call as argv, ``| cwd`` dropped (checked separately)."""
    if not log.exists():
        return []
    return [shlex.split(line.split(" | ")[0]) for line in log.read_text().splitlines()]


def test_kind_load_builds_with_podman_and_loads_the_charts_default_image(tmp_path: Path) -> None:
    path, log = make_path(tmp_path, "podman", "docker", "kind")
    done = run_kind_load(path, "--cluster", "dev")
    assert done.returncode == 0, done.stderr
    image = default_image()
    build, save, load, present = log.read_text().splitlines()
    assert build == f"podman build -f Containerfile -t {image} . | {ROOT}"
    argv = shlex.split(save.split(" | ")[0])
    assert argv[:5] == ["podman", "save", "--format", "docker-archive", "-o"]
    archive = Path(argv[5])
    assert argv[6:] == [image]
    assert shlex.split(load.split(" | ")[0]) == [
        "kind",
        "load",
        "image-archive",
        str(archive),
        "--name",
        "dev",
    ]
    assert present == "archive present"
    # The archive's temporary directory goes with the script.
    assert not archive.parent.exists()


def test_kind_load_takes_docker_when_podman_is_missing(tmp_path: Path) -> None:
    path, log = make_path(tmp_path, "docker", "kind")
    done = run_kind_load(path, "--image", "local/mokka:dev")
    assert done.returncode == 0, done.stderr
    build, save, load = calls(log)[:3]
    assert build == ["docker", "build", "-f", "Containerfile", "-t", "local/mokka:dev", "."]
    assert save[:3] == ["docker", "save", "-o"]
    assert save[4:] == ["local/mokka:dev"]
    # kind's own default cluster name when --cluster is not given.
    assert load == ["kind", "load", "image-archive", save[3], "--name", "kind"]


@pytest.mark.parametrize(
    ("stubs", "args", "missing"),
    [
        (("kind",), (), "neither podman nor docker is on PATH"),
        (("podman",), (), "kind is not on PATH"),
        (("docker", "kind"), ("--engine", "podman"), "podman is not on PATH"),
    ],
)
def test_kind_load_names_what_is_missing_before_building(
    tmp_path: Path, stubs: tuple[str, ...], args: tuple[str, ...], missing: str
) -> None:
    path, log = make_path(tmp_path, *stubs)
    done = run_kind_load(path, *args)
    assert done.returncode == 1
    assert missing in done.stderr
    assert calls(log) == [], "nothing may run before every tool is found"


def test_kind_load_stops_when_the_build_fails(tmp_path: Path) -> None:
    path, log = make_path(tmp_path, "podman", "kind", fail="podman")
    done = run_kind_load(path)
    assert done.returncode != 0
    assert [c[:2] for c in calls(log)] == [["podman", "build"]]


def test_kind_load_refuses_unknown_arguments(tmp_path: Path) -> None:
    path, log = make_path(tmp_path, "podman", "kind")
    done = run_kind_load(path, "--clsuter", "dev")
    assert done.returncode == 2
    assert "unknown argument: --clsuter" in done.stderr
    assert calls(log) == []


# --------------------------------------------------------------------------
# The guide's commands against what exists
# --------------------------------------------------------------------------


def test_the_guides_kind_load_command_runs_as_shown(tmp_path: Path) -> None:
    (command,) = [c for c in guide_commands() if c[0] == "./scripts/kind-load"]
    path, log = make_path(tmp_path, "podman", "kind")
    done = run_kind_load(path, *command[1:])
    assert done.returncode == 0, done.stderr
    (created,) = commands_of("kind")[:1]
    assert created[:3] == ["kind", "create", "cluster"]
    # The script loads into the cluster the guide created.
    assert calls(log)[-2][-2:] == ["--name", created[created.index("--name") + 1]]


def test_the_guides_manual_steps_use_the_charts_default_image() -> None:
    image = default_image()
    build, save = commands_of("podman")
    assert build == ["podman", "build", "-f", "Containerfile", "-t", image, "."]
    archive = save[save.index("-o") + 1]
    assert save[-1] == image
    text = GUIDE.read_text()
    for loader in (
        f"kind load image-archive {archive} --name mokka",
        f"sudo k3s ctr images import {archive}",
        f"minikube image load {archive}",
    ):
        assert f"`{loader}`" in text, loader


def test_every_script_and_linked_doc_the_guide_names_exists() -> None:
    text = GUIDE.read_text()
    for script in re.findall(r"scripts/[\w-]+", text):
        assert os.access(ROOT / script, os.X_OK), f"{script} is not an executable in the tree"
    for target, anchor in re.findall(r"\]\(([\w./-]+\.md)(?:#([\w-]+))?\)", text):
        doc = GUIDE.parent / target
        assert doc.is_file(), target
        if anchor:
            headings = {
                re.sub(r"[^\w -]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", doc.read_text(), re.M)
            }
            assert anchor in headings, f"{target} has no heading for #{anchor}"
    assert "docs/quickstart-kind.md" in (ROOT / "README.md").read_text()


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm_binary(), tmp_path_factory.mktemp("helm-home"))


def chart_sets(command: list[str]) -> list[str]:
    """The ``--set`` values of a ``helm install`` of the local chart."""
    return [command[i + 1] for i, arg in enumerate(command) if arg == "--set"]


def test_the_guides_chart_install_runs_the_agent_on_the_labelled_node(helm: Helm) -> None:
    (install,) = [
        c for c in commands_of("helm") if c[:2] == ["helm", "install"] and "./helm/mokka" in c
    ]
    namespace = install[install.index("-n") + 1]
    docs = helm.template(None, *chart_sets(install))
    spec = pod_spec(docs)
    (node_agent,) = spec["containers"]
    assert node_agent["image"] == default_image()
    # The label command gives the node exactly what the selector asks for.
    labels = {}
    for command in commands_of("kubectl"):
        if command[1:3] == ["label", "node"]:
            labels.update(dict(arg.split("=", 1) for arg in command[4:]))
    assert spec["nodeSelector"], "the chart selects no node: the label step would be pointless"
    assert spec["nodeSelector"].items() <= labels.items()
    # The namespace the guide labels for Pod Security is the release's.
    assert [
        "kubectl",
        "label",
        "ns",
        namespace,
        "pod-security.kubernetes.io/enforce=privileged",
    ] in commands_of("kubectl")
    assert spec["containers"][0]["securityContext"]["privileged"] is True


def test_the_k3s_variant_renders_without_the_runtime_setup(helm: Helm) -> None:
    (value,) = re.findall(r"--set (nodeAgent\.containerRuntime\.enabled=false)", GUIDE.read_text())
    with_setup = yaml.safe_dump(helm.template(None))
    without = yaml.safe_dump(helm.template(None, value))
    assert "containerd" in with_setup
    assert with_setup != without
