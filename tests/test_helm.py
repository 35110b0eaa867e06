"""The Helm chart, rendered and linted by the real ``helm`` binary.

Every test renders ``helm/mokka`` with ``helm template`` (or lints it) and
asserts on the parsed objects: the DaemonSet's flags, probes, mounts and
volumes, the ConfigMaps, and the schema's and templates' refusals.  The
rendered flags are then fed to the daemon's own argument parser, so the chart
cannot drift from the command line it drives.  ``helm`` comes from a PyPI
package (see ``tests/helm_tool.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm_tool import (
    CHART,
    HELM_DATA,
    NAMESPACE,
    RELEASE,
    Helm,
    agent,
    by_kind,
    chart_meta,
    configmap,
    daemonset,
    default_values,
    documented_values,
    flags,
    helm_binary,
    helm_version,
    mounts,
    parse_daemon_args,
    pod_spec,
    value_leaves,
    volumes,
)
from tests.support import ROOT


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binary = helm_binary()
    assert helm_version(binary).startswith(("v3.", "v4.")), helm_version(binary)
    return Helm(binary, tmp_path_factory.mktemp("helm-home"))


#: Value sets every general test runs against: ``default`` and the chart's
#: ``ci/<name>-values.yaml`` files (the chart-testing convention).
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    **{
        path.name.removesuffix("-values.yaml"): yaml.safe_load(path.read_text())
        for path in sorted((CHART / "ci").glob("*-values.yaml"))
    },
}
CUSTOM_PROFILE: str = VALUE_SETS["custom-profile"]["nodeAgent"]["customProfile"]
SHA = VALUE_SETS["imex-image"]["nodeAgent"]["imex"]["archive"]["sha256"]


# --------------------------------------------------------------------------
# Lint
# --------------------------------------------------------------------------


@pytest.mark.realclient
@pytest.mark.parametrize("strict", [False, True], ids=["lint", "lint-strict"])
def test_lint_default_values(helm: Helm, strict: bool) -> None:
    done = helm.run("lint", *(["--strict"] if strict else []), str(CHART))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.realclient
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_strict_value_sets(helm: Helm, name: str) -> None:
    done = helm.run("lint", "--strict", str(CHART), *helm.values_args(VALUE_SETS[name], ()))
    assert done.returncode == 0, done.stdout + done.stderr


# --------------------------------------------------------------------------
# Default rendering
# --------------------------------------------------------------------------


@pytest.mark.realclient
def test_default_render_objects(helm: Helm) -> None:
    docs = helm.template()
    assert sorted(d["kind"] for d in docs) == ["DaemonSet", "ServiceAccount"]
    # No RBAC: the agent never talks to the API server.
    assert not [
        d for d in docs if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
    ]
    sa = by_kind(docs, "ServiceAccount")[0]
    spec = pod_spec(docs)
    assert spec["serviceAccountName"] == sa["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is False
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["helm.sh/chart"] == f"mokka-{chart_meta()['version']}"
        assert doc["metadata"]["namespace"] == NAMESPACE


@pytest.mark.realclient
def test_default_render_container(helm: Helm) -> None:
    docs = helm.template()
    container = agent(docs)
    meta = chart_meta()
    assert container["image"] == f"ghcr.io/mokka/mokka:{meta['appVersion']}"
    assert container["command"] == ["mokka-node-agent"]
    assert flags(docs) == {
        "--root": "/host",
        "--profile": "h100",
        "--node-name": "$(NODE_NAME)",
        "--health-addr": "0.0.0.0:9091",
        "--resync-interval": "60",
        "--shutdown-timeout": "25",
        "--log-format": "text",
        "--log-level": "info",
        "--imex": "auto",
        "--fabric-manager": "auto",
        "--fabric-manager-init-delay": "0",
        "--kmsg-style": "journald",
        "--ib-mode": "auto",
        "--driver-publish": "auto",
        "--nfd-features-dir": "/etc/kubernetes/node-feature-discovery/features.d",
        "--container-runtime": "on",
        "--containerd-config-dir": "/etc/containerd/conf.d",
        "--restart-mode": "systemd",
        "--nri": "on",
        "--nri-socket": "/var/run/nri/nri.sock",
    }
    assert container["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    assert container["securityContext"] == {"privileged": True}
    assert container["ports"] == [{"name": "health", "containerPort": 9091, "protocol": "TCP"}]


@pytest.mark.realclient
def test_default_render_probes(helm: Helm) -> None:
    container = agent(helm.template())
    live, ready = container["livenessProbe"], container["readinessProbe"]
    assert live["httpGet"] == {"path": "/healthz", "port": "health"}
    assert ready["httpGet"] == {"path": "/readyz", "port": "health"}
    # Generous liveness: a failing Stage is retried by the agent itself; the
    # kubelet restarts the pod only after minutes of continuous failure.
    assert live["periodSeconds"] * live["failureThreshold"] >= 300
    assert ready["periodSeconds"] * ready["failureThreshold"] <= 60


@pytest.mark.realclient
def test_default_render_pod(helm: Helm) -> None:
    docs = helm.template()
    spec = pod_spec(docs)
    assert spec["hostPID"] is True
    assert spec["terminationGracePeriodSeconds"] == 25 + 5
    assert "initContainers" not in spec
    container_mounts = mounts(agent(docs))
    assert container_mounts["/host"] == {
        "name": "host-root",
        "mountPath": "/host",
        "mountPropagation": "Bidirectional",
    }
    assert container_mounts["/dev/kmsg"]["name"] == "kmsg"
    assert "/etc/mokka" not in container_mounts
    vols = volumes(docs)
    assert vols["host-root"]["hostPath"] == {"path": "/", "type": "Directory"}
    assert vols["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert set(vols) == {"host-root", "kmsg"}
    strategy = daemonset(docs)["spec"]["updateStrategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
    }


@pytest.mark.realclient
def test_selector_matches_pod_labels(helm: Helm) -> None:
    ds = daemonset(helm.template(None, "podLabels.team=gpu", "commonLabels.env=ci"))
    selector = ds["spec"]["selector"]["matchLabels"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert pod_labels["team"] == "gpu"
    assert pod_labels["env"] == "ci"
    assert ds["metadata"]["labels"]["env"] == "ci"
    assert "team" not in selector


# --------------------------------------------------------------------------
# Value sets
# --------------------------------------------------------------------------


@pytest.mark.realclient
def test_custom_profile_configmap(helm: Helm) -> None:
    docs = helm.template(VALUE_SETS["custom-profile"])
    cm = configmap(docs, "-profile")
    assert cm["data"]["config.yaml"] == CUSTOM_PROFILE
    assert flags(docs)["--profile"] == "/etc/mokka/config.yaml"
    mount = mounts(agent(docs))["/etc/mokka"]
    # A directory mount, never subPath: subPath mounts miss ConfigMap updates.
    assert "subPath" not in mount
    assert mount["readOnly"] is True
    sources = volumes(docs)[mount["name"]]["projected"]["sources"]
    assert sources == [
        {
            "configMap": {
                "name": cm["metadata"]["name"],
                "items": [{"key": "config.yaml", "path": "config.yaml"}],
            }
        }
    ]
    # No checksum annotation: the agent hot-reloads the profile.
    assert "annotations" not in daemonset(docs)["spec"]["template"]["metadata"]


@pytest.mark.realclient
def test_custom_profile_upstream_gb200_survives_rendering(helm: Helm) -> None:
    """A whole upstream GB200 profile passes through the chart unchanged."""
    text = (HELM_DATA / "gb200-upstream.yaml").read_text()
    docs = helm.template({"nodeAgent": {"customProfile": text}})
    rendered = configmap(docs, "-profile")["data"]["config.yaml"]
    assert yaml.safe_load(rendered) == yaml.safe_load(text)


@pytest.mark.realclient
def test_custom_profile_as_mapping(helm: Helm) -> None:
    profile = yaml.safe_load(CUSTOM_PROFILE)
    docs = helm.template({"nodeAgent": {"customProfile": profile}})
    assert yaml.safe_load(configmap(docs, "-profile")["data"]["config.yaml"]) == profile


@pytest.mark.realclient
def test_custom_profile_invalid_yaml_is_refused(helm: Helm) -> None:
    expected = "nodeAgent.customProfile: expected a profile as a YAML mapping"
    for text, detail in [
        ("version: [1.0\n", "does not parse"),
        ("just a string\n", "does not parse"),
        ("# only a comment\n", "the document is empty"),
    ]:
        error = helm.template_error({"nodeAgent": {"customProfile": text}})
        assert expected in error, error
        assert detail in error, error


@pytest.mark.realclient
def test_topology_configmap(helm: Helm) -> None:
    values = VALUE_SETS["topology"]
    docs = helm.template(values)
    doc = yaml.safe_load(configmap(docs, "-topology")["data"]["topology.yaml"])
    assert doc == {"version": 1, "domains": values["topology"]["domains"]}
    assert flags(docs)["--topology"] == "/etc/mokka/topology.yaml"
    assert flags(docs)["--profile"] == "h100"
    mount = mounts(agent(docs))["/etc/mokka"]
    sources = volumes(docs)[mount["name"]]["projected"]["sources"]
    assert [s["configMap"]["items"] for s in sources] == [
        [{"key": "topology.yaml", "path": "topology.yaml"}]
    ]


@pytest.mark.realclient
def test_topology_values_file_of_the_earlier_chart(helm: Helm) -> None:
    """A topology values file written for the earlier mock's chart works unchanged."""
    values_file = HELM_DATA / "topology-example-values.yaml"
    docs = helm.template(files=(values_file,))
    doc = yaml.safe_load(configmap(docs, "-topology")["data"]["topology.yaml"])
    expected = yaml.safe_load(values_file.read_text())["topology"]["domains"]
    assert doc == {"version": 1, "domains": expected}
    assert [c["nodes"] for d in doc["domains"] for c in d["cliques"]] == [
        ["worker-0"],
        ["worker-1"],
        ["worker-2"],
        ["worker-3"],
    ]


@pytest.mark.realclient
def test_profile_and_topology_share_one_config_volume(helm: Helm) -> None:
    values = {**VALUE_SETS["custom-profile"], **VALUE_SETS["topology"]}
    docs = helm.template(values)
    assert len(by_kind(docs, "ConfigMap")) == 2
    mount = mounts(agent(docs))["/etc/mokka"]
    sources = volumes(docs)[mount["name"]]["projected"]["sources"]
    paths = [item["path"] for s in sources for item in s["configMap"]["items"]]
    assert paths == ["config.yaml", "topology.yaml"]


@pytest.mark.realclient
def test_runtime_setup_off(helm: Helm) -> None:
    docs = helm.template(VALUE_SETS["runtime-off"])
    spec = pod_spec(docs)
    assert "hostPID" not in spec
    rendered = flags(docs)
    assert rendered["--container-runtime"] == "off"
    assert rendered["--nri"] == "off"
    for absent in ("--containerd-config-dir", "--restart-mode", "--nri-socket"):
        assert absent not in rendered
    # The surge guard only applies while the runtime setup is on.
    docs = helm.template(
        VALUE_SETS["runtime-off"],
        "updateStrategy.rollingUpdate.maxSurge=1",
        "updateStrategy.rollingUpdate.maxUnavailable=0",
    )
    assert daemonset(docs)["spec"]["updateStrategy"]["rollingUpdate"] == {
        "maxSurge": 1,
        "maxUnavailable": 0,
    }


@pytest.mark.realclient
def test_restart_mode_none(helm: Helm) -> None:
    docs = helm.template(VALUE_SETS["restart-none"])
    assert "hostPID" not in pod_spec(docs)
    rendered = flags(docs)
    assert rendered["--container-runtime"] == "on"
    assert rendered["--restart-mode"] == "none"


@pytest.mark.realclient
def test_imex_from_image(helm: Helm) -> None:
    docs = helm.template(VALUE_SETS["imex-image"])
    spec = pod_spec(docs)
    (init,) = spec["initContainers"]
    assert init["image"] == "registry.example/imex:580.105.08"
    init_mount = mounts(init)
    (mount_path,) = init_mount
    assert init["command"] == ["cp", "-R", "/imex/.", f"{mount_path}/"]
    main_mount = mounts(agent(docs))[mount_path]
    assert main_mount["readOnly"] is True
    assert main_mount["name"] == init_mount[mount_path]["name"]
    assert volumes(docs)[main_mount["name"]] == {"name": main_mount["name"], "emptyDir": {}}
    rendered = flags(docs)
    assert rendered["--imex"] == "on"
    assert rendered["--imex-archive-dir"] == mount_path
    assert rendered["--imex-archive-sha256"] == SHA
    assert "--imex-archive-url" not in rendered


@pytest.mark.realclient
def test_imex_image_without_sha256_is_refused(helm: Helm) -> None:
    error = helm.template_error(
        None, "nodeAgent.imex.binaries.image.repository=registry.example/imex"
    )
    assert "nodeAgent.imex.archive.sha256 is empty" in error


@pytest.mark.realclient
def test_everything_set(helm: Helm) -> None:
    docs = helm.template(VALUE_SETS["everything"])
    rendered = flags(docs)
    assert rendered["--profile"] == "gb200"
    assert rendered["--log-format"] == "json"
    assert rendered["--feature-gates"] == "IMEXDownload=true"
    assert (
        rendered["--imex-archive-url"]
        == VALUE_SETS["everything"]["nodeAgent"]["imex"]["archive"]["url"]
    )
    assert rendered["--fabric-manager"] == "on"
    assert rendered["--fabric-manager-init-delay"] == "5"
    assert rendered["--kmsg-style"] == "raw"
    assert rendered["--ib-mode"] == "full"
    assert rendered["--driver-publish"] == "symlink"
    assert rendered["--nri-socket"] == "/run/nri/nri.sock"
    assert rendered["--shutdown-timeout"] == "40"
    assert pod_spec(docs)["terminationGracePeriodSeconds"] == 45


@pytest.mark.realclient
def test_feature_gates(helm: Helm) -> None:
    rendered = flags(helm.template({"nodeAgent": {"featureGates": {"IMEXDownload": False}}}))
    assert rendered["--feature-gates"] == "IMEXDownload=false"
    assert "--feature-gates" not in flags(helm.template())


def test_schema_feature_gates_are_the_daemon_gates() -> None:
    """The schema refuses a gate the agent does not know (a typo would crash-loop every pod)."""
    import json

    from mokka.settings import FEATURE_GATES

    schema = json.loads((CHART / "values.schema.json").read_text())
    gates = schema["properties"]["nodeAgent"]["properties"]["featureGates"]
    assert gates["additionalProperties"] is False
    assert sorted(gates["properties"]) == sorted(FEATURE_GATES)


@pytest.mark.realclient
def test_unquoted_on_off_in_a_values_file(helm: Helm, tmp_path: Path) -> None:
    """YAML 1.1 reads an unquoted on/off as a boolean; the chart still means on/off."""
    values_file = tmp_path / "modes.yaml"
    values_file.write_text(
        "nodeAgent:\n  imex:\n    mode: on\n  fabricManager:\n    mode: off\n"
        "  ib:\n    mode: off\n"
    )
    rendered = flags(helm.template(files=(values_file,)))
    assert (rendered["--imex"], rendered["--fabric-manager"]) == ("on", "off")
    assert rendered["--ib-mode"] == "off"


@pytest.mark.realclient
def test_scheduling_values(helm: Helm) -> None:
    docs = helm.template(
        {
            "nodeSelector": {"mokka.io/gpu": "true"},
            "tolerations": [{"operator": "Exists"}],
            "priorityClassName": "system-node-critical",
            "imagePullSecrets": [{"name": "regcred"}],
            "nodeAgent": {
                "image": {"tag": "1.2.3", "pullPolicy": "Always"},
                "extraArgs": ["--resync-interval=5"],
                "extraEnv": [{"name": "X", "value": "1"}],
            },
            "serviceAccount": {"create": False, "name": "existing"},
        }
    )
    spec = pod_spec(docs)
    assert spec["nodeSelector"] == {"mokka.io/gpu": "true"}
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["serviceAccountName"] == "existing"
    assert not by_kind(docs, "ServiceAccount")
    container = agent(docs)
    assert container["image"].endswith(":1.2.3")
    assert container["imagePullPolicy"] == "Always"
    assert container["args"][-1] == "--resync-interval=5"
    assert container["env"][-1] == {"name": "X", "value": "1"}


# --------------------------------------------------------------------------
# Refusals: schema and templates
# --------------------------------------------------------------------------


@pytest.mark.realclient
@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("nodeAgent.resyncInterval=soon",), "/nodeAgent/resyncInterval"),
        (("nodeAgent.containerRuntime.enabled=yes",), "/nodeAgent/containerRuntime/enabled"),
        (("nodeAgent.profile=h200",), "/nodeAgent/profile"),
        (("nodeAgent.imex.mode=sometimes",), "/nodeAgent/imex/mode"),
        (("nodeAgent.imex.archive.sha256=abc",), "/nodeAgent/imex/archive/sha256"),
        (("nodeAgent.ib.mode=on",), "/nodeAgent/ib/mode"),
        (("nodeAgent.logFormat=xml",), "/nodeAgent/logFormat"),
        (("topology.domains[0].uuid=not-a-uuid",), "/topology/domains/0"),
        (("nodeAgent.featureGates.IMEXDownload=maybe",), "/nodeAgent/featureGates/IMEXDownload"),
    ],
    ids=["number", "boolean", "profile", "mode", "sha256", "ib-mode", "log-format",
         "topology-uuid", "gate"],
)
def test_schema_rejects_wrong_types(helm: Helm, sets: tuple[str, ...], message: str) -> None:
    error = helm.template_error(None, *sets)
    assert message in error, error


@pytest.mark.realclient
@pytest.mark.parametrize(
    ("sets", "where"),
    [
        (("nodeAgent.replicas=2",), "'/nodeAgent': additional properties 'replicas'"),
        (
            ("nodeAgent.imex.binaries.images=x",),
            "'/nodeAgent/imex/binaries': additional properties 'images'",
        ),
        (("image.tag=1",), "additional properties 'image'"),
        (("containerRuntime.enabled=false",), "additional properties 'containerRuntime'"),
        (
            ("nodeAgent.featureGates.IMEXDownlaod=true",),
            "'/nodeAgent/featureGates': additional properties 'IMEXDownlaod'",
        ),
    ],
    ids=["nodeAgent", "nested", "top-level-image", "top-level-runtime", "feature-gate"],
)
def test_schema_rejects_unknown_keys(helm: Helm, sets: tuple[str, ...], where: str) -> None:
    error = helm.template_error(None, *sets)
    assert where in error, error


@pytest.mark.realclient
@pytest.mark.parametrize("surge", ["1", "10%"])
def test_max_surge_with_runtime_setup_is_refused(helm: Helm, surge: str) -> None:
    error = helm.template_error(None, f"updateStrategy.rollingUpdate.maxSurge={surge}")
    assert (
        f"updateStrategy.rollingUpdate.maxSurge={surge} cannot be used while "
        "nodeAgent.containerRuntime.enabled=true" in error
    )
    assert "teardown reverts the containerd setup" in error


@pytest.mark.realclient
def test_max_surge_zero_and_on_delete_render(helm: Helm) -> None:
    docs = helm.template(None, "updateStrategy.rollingUpdate.maxSurge=0%")
    assert daemonset(docs)["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == "0%"
    docs = helm.template(None, "updateStrategy.type=OnDelete")
    assert daemonset(docs)["spec"]["updateStrategy"] == {"type": "OnDelete"}


# --------------------------------------------------------------------------
# NOTES.txt
# --------------------------------------------------------------------------


@pytest.mark.realclient
def test_notes_tell_readiness_and_driver_root(helm: Helm) -> None:
    done = helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {NAMESPACE} rollout status daemonset/{RELEASE}-mokka" in notes
    assert "/readyz" in notes
    assert "/var/lib/nvml-mock/driver" in notes
    assert "/etc/containerd/conf.d/50-mokka.toml" in notes


# --------------------------------------------------------------------------
# The chart against the daemon's real command line
# --------------------------------------------------------------------------


@pytest.mark.realclient
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_flags_are_accepted_by_the_daemon_parser(helm: Helm, name: str) -> None:
    from mokka.cli import build_parser

    args = agent(helm.template(VALUE_SETS[name]))["args"]
    parser = build_parser()
    # parse_known_args first, to name every flag the daemon lacks at once.
    namespace, unknown = parse_daemon_args(parser.parse_known_args, args)
    assert unknown == [], f"flags the chart renders but the daemon does not accept: {unknown}"
    namespace = parse_daemon_args(parser.parse_args, args)
    assert namespace.root == "/host"
    assert namespace.node_name == "$(NODE_NAME)"
    rendered = flags(helm.template(VALUE_SETS[name]))
    # Choice flags arrive as the parser's own spelling.
    assert namespace.container_runtime == rendered["--container-runtime"]
    assert namespace.imex == rendered["--imex"]


@pytest.mark.realclient
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_flags_pass_the_daemon_and_simulator_validation(helm: Helm, name: str) -> None:
    from mokka.cli import build_parser
    from mokka.settings import Settings

    args = agent(helm.template(VALUE_SETS[name]))["args"]
    namespace = parse_daemon_args(build_parser().parse_args, args)
    settings = Settings.from_args(namespace, environ={})
    assert str(settings.root) == "/host"
    assert settings.health_addr == ("0.0.0.0", 9091)
    # Every simulator builds (and so validates its settings) from the same flags.
    from mokka.simulators.registry import load_plugins

    built = {plugin.name: plugin.build(namespace) for plugin in load_plugins()}
    assert {"gpudriver", "cri", "imex", "fabricmanager", "kernellog", "ib"} <= set(built)
    # The grace period covers the agent's own teardown budget.
    grace = pod_spec(helm.template(VALUE_SETS[name]))["terminationGracePeriodSeconds"]
    assert grace >= settings.shutdown_timeout + 5


@pytest.mark.realclient
def test_chart_defaults_are_the_daemon_defaults(helm: Helm) -> None:
    """With default values the chart asks for what the daemon does unasked.

    Only the pod-specific flags differ: the node root, the node name and the
    health address (all interfaces, for the kubelet's probes).
    """
    from mokka.cli import build_parser

    parser = build_parser()
    own = parse_daemon_args(parser.parse_args, [])
    docs = helm.template()
    chart = parse_daemon_args(parser.parse_args, agent(docs)["args"])

    def normal(value: Any) -> str:
        try:
            return repr(float(value))
        except (TypeError, ValueError):
            return str(value).lower()

    pod_specific = {"--root", "--node-name", "--health-addr"}
    compared = 0
    for flag in sorted(set(flags(docs)) - pod_specific):
        dest = flag[2:].replace("-", "_")
        ours, theirs = getattr(chart, dest), getattr(own, dest)
        assert normal(ours) == normal(theirs), f"{flag}: chart {ours!r}, daemon {theirs!r}"
        compared += 1
    assert compared >= 15


def test_schema_profiles_are_the_built_in_profiles() -> None:
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["nodeAgent"]["properties"]["profile"]["enum"]
    shipped = ROOT / "mokka" / "state" / "profiles"
    names = sorted(p.stem for p in shipped.glob("*.yaml"))
    assert names, f"no built-in profiles in {shipped}"
    assert sorted(enum) == names


def test_default_values_validate_against_schema() -> None:
    import json

    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(default_values(), schema)


# --------------------------------------------------------------------------
# docs/helm.md: the values table cannot drift from values.yaml
# --------------------------------------------------------------------------


def test_docs_values_table_matches_values_yaml() -> None:
    leaves = value_leaves(default_values())
    documented = documented_values()
    undocumented = sorted(set(leaves) - set(documented))
    stale = sorted(set(documented) - set(leaves))
    assert not undocumented, f"values.yaml keys missing from the docs/helm.md table: {undocumented}"
    assert not stale, f"docs/helm.md documents keys values.yaml does not have: {stale}"
    for key, default in documented.items():
        assert yaml.safe_load(default) == leaves[key], (
            f"docs/helm.md: default of {key} is `{default}`, values.yaml has {leaves[key]!r}"
        )


def test_docs_values_table_check_catches_drift() -> None:
    """The check above fails on a missing key: it is not vacuous."""
    leaves = value_leaves(default_values())
    documented = documented_values()
    assert "nodeAgent.containerRuntime.restartMode" in leaves
    assert len(documented) == len(leaves) >= 40
    missing = dict(documented)
    missing.pop("nodeAgent.nri.socketPath")
    assert set(leaves) - set(missing) == {"nodeAgent.nri.socketPath"}
