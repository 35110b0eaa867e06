"""The real ``helm`` binary for the chart tests, and helpers over what it renders.

``helm`` is the pinned helm v4 that ``scripts/install-consumers`` builds with
``go install`` into its cache (see ``tests/consumers.py``); the tests run it
with its own homes under a temporary directory.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.consumers import consumer
from tests.support import DATA, ROOT


def helm_binary() -> Path:
    """Path of the pinned ``helm``, or fail the test saying how to install it."""
    return consumer("helm")


def helm_version(binary: Path) -> str:
    """``helm version --short``, e.g. ``v4.3.2``."""
    done = subprocess.run(
        [str(binary), "version", "--short"], capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.strip()


# --------------------------------------------------------------------------
# Rendering the chart and reading the rendered objects
# --------------------------------------------------------------------------

CHART = ROOT / "helm" / "mokka"
RELEASE = "mk"
NAMESPACE = "mokka-system"
HELM_DATA = DATA / "helm"


class Helm:
    """Runs the real helm with its caches under a temporary directory."""

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        self.home = home
        self._files = 0

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=self.env, timeout=120
        )

    def values_args(self, values: dict[str, Any] | None, sets: tuple[str, ...]) -> list[str]:
        args: list[str] = []
        if values is not None:
            self._files += 1
            path = self.home / f"values-{self._files}.yaml"
            path.write_text(yaml.safe_dump(values))
            args += ["-f", str(path)]
        for item in sets:
            args += ["--set", item]
        return args

    def template(
        self, values: dict[str, Any] | None = None, *sets: str, files: tuple[Path, ...] = ()
    ) -> list[dict[str, Any]]:
        """Render and parse; fails the test with helm's message when rendering fails."""
        extra = [arg for f in files for arg in ("-f", str(f))]
        done = self.run(
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            *extra,
            *self.values_args(values, sets),
        )
        assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]

    def template_error(self, values: dict[str, Any] | None = None, *sets: str) -> str:
        """Render expecting a refusal; returns helm's error output."""
        done = self.run(
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            *self.values_args(values, sets),
        )
        assert done.returncode != 0, f"helm template accepted values it must refuse:\n{done.stdout}"
        return done.stderr


# --------------------------------------------------------------------------
# Helpers over rendered objects
# --------------------------------------------------------------------------


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = by_kind(docs, "DaemonSet")
    return ds


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return daemonset(docs)["spec"]["template"]["spec"]


def agent(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = pod_spec(docs)["containers"]
    assert [c["name"] for c in containers] == ["node-agent"]
    return containers[0]


def flags(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The agent's ``--name=value`` arguments as a mapping (every one has a value)."""
    result = {}
    for arg in agent(docs)["args"]:
        name, sep, value = arg.partition("=")
        assert sep, f"argument {arg!r} is not --name=value"
        assert name.startswith("--"), f"argument {arg!r} is not --name=value"
        assert name not in result, f"{name} rendered twice"
        result[name] = value
    return result


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def volumes(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec(docs)["volumes"]}


def configmap(docs: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith(suffix)]
    return cm


def chart_meta() -> dict[str, Any]:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def default_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def parse_daemon_args(parse: Callable[[list[str]], Any], args: list[str]) -> Any:
    """``parse(["daemon", *args])``, turning argparse's exit into a readable failure."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            return parse(["daemon", *args])
        except SystemExit:
            pass
    pytest.fail(
        f"the daemon's argument parser refused the chart's flags: {stderr.getvalue().strip()}"
    )


# --------------------------------------------------------------------------
# The values table (helm/mokka/README.md)
# --------------------------------------------------------------------------

#: Kubernetes objects passed through verbatim: documented as one key.
OPAQUE_VALUES = {"nodeAgent.resources", "nodeSelector"}
VALUES_TABLE = CHART / "README.md"


def value_leaves(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    leaves: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in OPAQUE_VALUES:
            leaves.update(value_leaves(value, path + "."))
        else:
            leaves[path] = value
    return leaves


def documented_values() -> dict[str, str]:
    """Key → Default cell of the values table in the chart's README."""
    text = VALUES_TABLE.read_text()
    section = text.split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| [^|]+ \| `([^`]*)` \| (.+) \|$", section, re.M)
    assert rows, f"{VALUES_TABLE} has no values table under '## Values'"
    documented: dict[str, str] = {}
    for key, default, description in rows:
        assert key not in documented, f"{VALUES_TABLE} documents {key} twice"
        assert description.strip(), f"{VALUES_TABLE}: {key} has no description"
        documented[key] = default
    return documented
