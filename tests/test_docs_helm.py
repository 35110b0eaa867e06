"""The helm commands of README.md and docs/helm.md, rendered with the real helm.

No cluster runs here: each documented ``helm install`` / ``helm upgrade`` of
the local chart is turned into the ``helm template`` with the same release,
chart and value flags, and what it renders is checked against the
documented ``kubectl label`` steps.  The commands are read from the docs'
``sh`` blocks, so a doc edit that breaks one fails here.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm_tool import Helm, default_values, helm_binary, pod_spec
from tests.support import ROOT

pytestmark = pytest.mark.timeout(120)

README = ROOT / "README.md"
HELM_DOC = ROOT / "docs" / "helm.md"
#: Flags of ``helm install``/``upgrade`` that ``helm template`` does not take
#: and that change nothing it renders.
INSTALL_ONLY = {"--reuse-values", "--atomic", "--wait"}


def sh_commands(text: str) -> list[list[str]]:
    """The commands of the ``sh`` blocks of ``text``, lines joined and split as sh does."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(shlex.split(line, comments=True))
    return commands


def readme_helm_section() -> str:
    text = README.read_text()
    return text.split("\n## Deploying with Helm\n", 1)[1].split("\n## ", 1)[0]


def chart_commands(commands: list[list[str]]) -> list[list[str]]:
    """The ``helm install`` / ``helm upgrade`` commands of the local chart."""
    return [c for c in commands if c[:2] in (["helm", "install"], ["helm", "upgrade"])]


def as_template(command: list[str]) -> list[str]:
    """``helm install|upgrade [--install] NAME CHART FLAGS`` as ``template NAME CHART FLAGS``."""
    args = [a for a in command[2:] if a != "--install" and a not in INSTALL_ONLY]
    return ["template", *args]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm_binary(), tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the docs' relative paths resolve in: ``./helm/mokka`` and the
    ``./my-profile.yaml`` of the custom-profile example (a built-in profile)."""
    work = tmp_path_factory.mktemp("docs-cwd")
    (work / "helm").symlink_to(ROOT / "helm")
    shutil.copy(ROOT / "mokka" / "state" / "profiles" / "h100.yaml", work / "my-profile.yaml")
    return work


def render(helm: Helm, workdir: Path, command: list[str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(helm.binary), *as_template(command)],
        capture_output=True,
        text=True,
        env=helm.env,
        cwd=workdir,
        timeout=120,
    )
    assert done.returncode == 0, f"{shlex.join(command)}\nfails to render:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def namespace_of(command: list[str]) -> str:
    for flag in ("-n", "--namespace"):
        if flag in command:
            return command[command.index(flag) + 1]
    return "default"


def node_labels(commands: list[list[str]]) -> dict[str, str]:
    """What the ``kubectl label node NAME... KEY=VALUE...`` commands give a node."""
    labels: dict[str, str] = {}
    for command in commands:
        if command[:3] == ["kubectl", "label", "node"]:
            labels.update(dict(arg.split("=", 1) for arg in command[3:] if "=" in arg))
    return labels


# --------------------------------------------------------------------------
# The install steps give the agent a node
# --------------------------------------------------------------------------


#: The install steps a new user follows: the README's, docs/helm.md's and the
#: chart README's install sections.
INSTALL_STEPS = {
    "README.md": readme_helm_section,
    "docs/helm.md": lambda: HELM_DOC.read_text().split("\n## Install\n", 1)[1].split("\n### ")[0],
    "helm/mokka/README.md": lambda: (
        (ROOT / "helm" / "mokka" / "README.md").read_text().split("\n## Install\n", 1)[1]
    ).split("\n## ")[0],
}


@pytest.mark.parametrize("doc", sorted(INSTALL_STEPS))
def test_install_steps_run_the_agent_on_the_labelled_node(
    helm: Helm, workdir: Path, doc: str
) -> None:
    commands = sh_commands(INSTALL_STEPS[doc]())
    # The first install is the one the steps lead to (docs/helm.md goes on
    # with other node selections).
    install = next(c for c in chart_commands(commands) if c[1] == "install")
    spec = pod_spec(render(helm, workdir, install))
    selector = spec["nodeSelector"]
    assert selector, "the chart selects no node: the label step would be pointless"
    labels = node_labels(commands)
    assert selector.items() <= labels.items(), (
        f"{doc} labels nodes {labels}, the DaemonSet selects {selector}: zero pods"
    )
    # The release's namespace exists and admits the privileged agent.
    namespace = namespace_of(install)
    assert ["kubectl", "create", "namespace", namespace] in commands or (
        "--create-namespace" in install
    )
    assert [
        "kubectl",
        "label",
        "ns",
        namespace,
        "pod-security.kubernetes.io/enforce=privileged",
    ] in commands
    assert spec["containers"][0]["securityContext"]["privileged"] is True
    # The namespace is labelled before the install creates the pod.
    assert commands.index(install) > commands.index(
        ["kubectl", "label", "ns", namespace, "pod-security.kubernetes.io/enforce=privileged"]
    )


def test_readme_helm_label_check_catches_a_missing_label() -> None:
    """The check above is not vacuous: the README's old steps gave no node the label."""
    old = (
        "```sh\nhelm install mokka ./helm/mokka -n mokka-system --create-namespace \\\n"
        "  --set-string nodeSelector.mokka\\.io/gpu=true --set nodeAgent.profile=h100\n"
        "kubectl -n mokka-system rollout status daemonset/mokka\n```\n"
    )
    assert node_labels(sh_commands(old)) == {}
    assert default_values()["nodeSelector"] == {"mokka.io/gpu": "true"}


# --------------------------------------------------------------------------
# docs/helm.md: every chart command renders
# --------------------------------------------------------------------------


def test_every_helm_command_in_docs_helm_renders(helm: Helm, workdir: Path) -> None:
    commands = chart_commands(sh_commands(HELM_DOC.read_text()))
    # Install, the two node-selection forms, the custom profile, upgrade.
    assert len(commands) >= 5, commands
    for command in commands:
        render(helm, workdir, command)


def test_docs_helm_node_selection_examples_select_what_they_say(helm: Helm, workdir: Path) -> None:
    commands = chart_commands(sh_commands(HELM_DOC.read_text()))
    selectors = [pod_spec(render(helm, workdir, c)).get("nodeSelector") for c in commands]
    # Replacing the default label with another: only the new one is asked for.
    assert {"pool": "gpu-sim"} in selectors
    # The empty selector: every schedulable node.
    assert None in selectors
    # The install command's label is what the chart selects by default.
    labels = node_labels(sh_commands(HELM_DOC.read_text()))
    assert default_values()["nodeSelector"].items() <= labels.items()


def test_docs_helm_values_examples_render(helm: Helm, workdir: Path, tmp_path: Path) -> None:
    """The ``yaml`` values blocks of docs/helm.md are values files the chart takes."""
    blocks = re.findall(r"```yaml\n(.*?)```", HELM_DOC.read_text(), re.S)
    assert len(blocks) >= 3
    for number, block in enumerate(blocks):
        # The IMEX example leaves the archive's digest to the reader.
        block = block.replace("<64 hex digits of the archive>", "0" * 64)
        values = tmp_path / f"values-{number}.yaml"
        values.write_text(block)
        render(helm, workdir, ["helm", "install", "mokka", "./helm/mokka", "-f", str(values)])
