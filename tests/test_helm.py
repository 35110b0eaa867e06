"""The Helm chart, rendered and linted by the real ``helm`` binary.

Every test renders ``helm/mokka`` with ``helm template`` (or lints it) and
asserts on the parsed objects: the DaemonSet's flags, probes, mounts and
volumes, the ConfigMaps, and the schema's and templates' refusals.  The
rendered flags are then fed to the daemon's own argument parser, so the chart
cannot drift from the command line it drives.  ``helm`` is the pinned helm
v4 that ``scripts/install-consumers`` builds (see ``tests/helm_tool.py``).
"""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import sys
import threading
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
    # The Pod is the `helm test` hook (see test_helm_test_hook_*).
    assert sorted(d["kind"] for d in docs) == ["DaemonSet", "Pod", "Service", "ServiceAccount"]
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
        assert doc["metadata"]["namespace"] == NAMESPACE
        if doc["kind"] == "Pod":
            continue
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["helm.sh/chart"] == f"mokka-{chart_meta()['version']}"


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
        "--workload": "auto",
        "--workload-socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
        "--workload-poll-interval": "5",
        "--workload-memory-share": "0.4",
        "--workload-utilization": "60",
        "--driver-publish": "auto",
        "--idle-signature": "on",
        "--nfd-features-dir": "/etc/kubernetes/node-feature-discovery/features.d",
        "--container-runtime": "on",
        "--containerd-config-dir": "/etc/containerd/conf.d",
        "--restart-mode": "systemd",
        "--nri": "on",
        "--nri-socket": "/var/run/nri/nri.sock",
        "--nri-plugin": "on",
        "--nri-plugin-socket": "/var/run/nri/nri.sock",
        "--nri-ambient": "off",
        "--nri-sys-devices": "off",
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
    # The NRI plugin's socket directory, at its node path (--nri-plugin-socket).
    assert container_mounts["/var/run/nri"] == {"name": "nri", "mountPath": "/var/run/nri"}
    assert vols["nri"]["hostPath"] == {"path": "/var/run/nri", "type": "DirectoryOrCreate"}
    assert set(vols) == {"host-root", "kmsg", "nri"}
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
    assert rendered["--nri-plugin"] == "off"  # no NRI, no plugin
    for absent in (
        "--containerd-config-dir",
        "--restart-mode",
        "--nri-socket",
        "--nri-plugin-socket",
        "--nri-ambient",
        "--nri-sys-devices",
    ):
        assert absent not in rendered
    assert "nri" not in volumes(docs)
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
def test_nri_plugin_off_keeps_containerds_nri(helm: Helm) -> None:
    docs = helm.template(None, "nodeAgent.nri.plugin.enabled=false")
    rendered = flags(docs)
    assert rendered["--nri"] == "on"
    assert rendered["--nri-plugin"] == "off"
    assert "--nri-plugin-socket" not in rendered
    assert "--nri-sys-devices" not in rendered
    assert "nri" not in volumes(docs)
    assert "/var/run/nri" not in mounts(agent(docs))


@pytest.mark.realclient
def test_nri_sys_devices_is_opt_in_and_extra_args_still_override_it(helm: Helm) -> None:
    from mokka.cli import build_parser

    parse = build_parser().parse_args
    assert flags(helm.template())["--nri-sys-devices"] == "off"
    on = helm.template(None, "nodeAgent.nri.sysDevices=true")
    assert flags(on)["--nri-sys-devices"] == "on"
    assert parse_daemon_args(parse, agent(on)["args"]).nri_sys_devices == "on"
    # The user's extraArgs come after it, so they win.
    args = agent(helm.template(None, "nodeAgent.nri.sysDevices=true",
                               "nodeAgent.extraArgs={--nri-sys-devices=off}"))["args"]
    assert parse_daemon_args(parse, args).nri_sys_devices == "off"


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
    assert rendered["--idle-signature"] == "off"
    assert rendered["--nri-socket"] == "/run/nri/nri.sock"
    assert rendered["--nri-plugin-socket"] == "/run/nri/nri.sock"
    assert rendered["--nri-ambient"] == "on"
    assert mounts(agent(docs))["/run/nri"]["name"] == "nri"
    assert volumes(docs)["nri"]["hostPath"] == {"path": "/run/nri", "type": "DirectoryOrCreate"}
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
        "nodeAgent:\n  imex:\n    mode: on\n  fabricManager:\n    mode: off\n  ib:\n    mode: off\n"
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
    ids=[
        "number",
        "boolean",
        "profile",
        "mode",
        "sha256",
        "ib-mode",
        "log-format",
        "topology-uuid",
        "gate",
    ],
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
    assert "port-forward" in notes
    assert "InfiniBand:" not in notes


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
    # On the host network (the IB relay) the node IP, which the kubelet expands.
    on_host_network = pod_spec(helm.template(VALUE_SETS[name])).get("hostNetwork", False)
    assert settings.health_addr == ("$(NODE_IP)" if on_host_network else "0.0.0.0", 9091)
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

    Only the pod-specific flags differ: the node root, the node name, the
    health address (all interfaces, for the kubelet's probes) and the NRI
    socket's path in the pod.
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

    # The NRI socket too: the pod mounts its directory at the node path,
    # where the daemon alone looks under its node root.
    pod_specific = {"--root", "--node-name", "--health-addr", "--nri-plugin-socket"}
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
# The chart README's values table cannot drift from values.yaml
# --------------------------------------------------------------------------


def test_docs_values_table_matches_values_yaml() -> None:
    leaves = value_leaves(default_values())
    documented = documented_values()
    undocumented = sorted(set(leaves) - set(documented))
    stale = sorted(set(documented) - set(leaves))
    assert not undocumented, (
        f"values.yaml keys missing from the chart README's table: {undocumented}"
    )
    assert not stale, f"the chart README documents keys values.yaml does not have: {stale}"
    for key, default in documented.items():
        assert yaml.safe_load(default) == leaves[key], (
            f"chart README: default of {key} is `{default}`, values.yaml has {leaves[key]!r}"
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


# --------------------------------------------------------------------------
# Conventions: stable pod labels, opted-in nodes, priority, health address
# --------------------------------------------------------------------------


def render_chart(helm: Helm, chart: Path, release: str, *sets: str) -> list[dict[str, Any]]:
    """``helm template`` of any chart directory under any release name."""
    args = [arg for item in sets for arg in ("--set", item)]
    done = helm.run("template", release, str(chart), "--namespace", NAMESPACE, *args)
    assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.realclient
def test_a_chart_only_version_bump_leaves_the_pod_template_alone(
    helm: Helm, tmp_path: Path
) -> None:
    """A changed pod template rolls every node; a chart bump must not change it."""
    bumped = tmp_path / "mokka"
    shutil.copytree(CHART, bumped)
    meta = chart_meta()
    meta["version"] = "99.0.0"
    (bumped / "Chart.yaml").write_text(yaml.safe_dump(meta))

    before, after = daemonset(helm.template()), daemonset(render_chart(helm, bumped, RELEASE))
    assert after["metadata"]["labels"]["helm.sh/chart"] == "mokka-99.0.0"
    assert before["metadata"]["labels"]["helm.sh/chart"] != "mokka-99.0.0"
    assert after["spec"]["template"] == before["spec"]["template"]
    # Only the selector labels (plus the user's own) sit on the pods.
    pod_labels = before["spec"]["template"]["metadata"]["labels"]
    assert pod_labels == before["spec"]["selector"]["matchLabels"]
    assert not {"helm.sh/chart", "app.kubernetes.io/version"} & set(pod_labels)


@pytest.mark.realclient
def test_agents_run_on_opted_in_nodes(helm: Helm) -> None:
    spec = pod_spec(helm.template())
    assert spec["nodeSelector"] == {"mokka.io/gpu": "true"}
    # The install command of the docs labels nodes with exactly that label.
    for doc in (ROOT / "docs" / "helm.md", CHART / "README.md"):
        assert "kubectl label node worker-1 worker-2 mokka.io/gpu=true" in doc.read_text(), doc
    # An explicit empty selector means every node again.
    everywhere = pod_spec(helm.template(None, "nodeSelector=null"))
    assert "nodeSelector" not in everywhere


def render_in(helm: Helm, namespace: str, *args: str) -> dict[str, Any]:
    """The agent's pod spec of a release in ``namespace``."""
    done = helm.run("template", RELEASE, str(CHART), "--namespace", namespace, *args)
    assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
    return pod_spec([doc for doc in yaml.safe_load_all(done.stdout) if doc])


@pytest.mark.realclient
def test_defaults_install_on_tainted_nodes_without_critical_priority_quota(helm: Helm) -> None:
    """Defaults that every cluster admits: GKE admits the critical classes only
    in kube-system, and GPU pools are commonly tainted."""
    spec = pod_spec(helm.template())
    assert NAMESPACE != "kube-system"
    assert "priorityClassName" not in spec
    # Tolerates every taint, NoExecute included (an empty key with Exists).
    assert spec["tolerations"] == [{"operator": "Exists"}]
    # In kube-system, where the quota admits it, the agent is node-critical.
    assert render_in(helm, "kube-system")["priorityClassName"] == "system-node-critical"


@pytest.mark.realclient
def test_scheduling_defaults_can_be_set_back(helm: Helm) -> None:
    spec = pod_spec(
        helm.template(None, "priorityClassName=system-node-critical", "tolerations=null")
    )
    assert spec["priorityClassName"] == "system-node-critical"
    assert "tolerations" not in spec
    # The forms docs/helm.md gives.
    only_gpu = '[{"key":"nvidia.com/gpu","operator":"Exists"}]'
    spec = render_in(helm, NAMESPACE, "--set-json", f"tolerations={only_gpu}")
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert "tolerations" not in render_in(helm, NAMESPACE, "--set-json", "tolerations=[]")
    text = (ROOT / "docs" / "helm.md").read_text()
    assert f"--set-json 'tolerations={only_gpu}'" in text
    assert "--set-json 'tolerations=[]'" in text
    # A class named explicitly wins in kube-system too.
    custom = render_in(helm, "kube-system", "--set", "priorityClassName=mokka-agents")
    assert custom["priorityClassName"] == "mokka-agents"


@pytest.mark.realclient
def test_notes_say_how_to_label_a_node(helm: Helm) -> None:
    """Without a cluster to look nodes up in, the notes give the label command
    for the selector in use, and say nothing of labels with no selector."""
    done = helm.run("install", RELEASE, str(CHART), "-n", NAMESPACE, "--dry-run=client")
    assert done.returncode == 0, done.stderr
    assert "kubectl get nodes -l mokka.io/gpu=true" in done.stdout
    assert "kubectl label node NODE_NAME mokka.io/gpu=true" in done.stdout
    assert "zero\npods" in done.stdout
    done = helm.run(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--dry-run=client",
        "--set",
        "nodeSelector.mokka\\.io/gpu=null",
        "--set-string",
        "nodeSelector.pool=gpu-sim",
    )
    assert done.returncode == 0, done.stderr
    assert "kubectl label node NODE_NAME pool=gpu-sim" in done.stdout
    done = helm.run(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--dry-run=client",
        "--set",
        "nodeSelector=null",
    )
    assert "kubectl label node" not in done.stdout
    assert "on every schedulable node" in done.stdout


@pytest.mark.realclient
def test_health_address_is_explicit_and_matches_the_port(helm: Helm) -> None:
    """The agent's own default is loopback: the chart must name an address kubelet reaches."""
    docs = helm.template()
    host, _, port = flags(docs)["--health-addr"].rpartition(":")
    assert host == "0.0.0.0"
    (container_port,) = agent(docs)["ports"]
    assert container_port == {"name": "health", "containerPort": int(port), "protocol": "TCP"}
    (service,) = by_kind(docs, "Service")
    assert service["spec"]["ports"] == [
        {"name": "http-metrics", "port": int(port), "targetPort": "health", "protocol": "TCP"}
    ]


# --------------------------------------------------------------------------
# Seconds: numbers or decimal strings, within bounds
# --------------------------------------------------------------------------


@pytest.mark.realclient
def test_seconds_accept_decimals_given_with_set(helm: Helm) -> None:
    docs = helm.template(None, "nodeAgent.shutdownTimeout=2.5")
    assert flags(docs)["--shutdown-timeout"] == "2.5"
    assert pod_spec(docs)["terminationGracePeriodSeconds"] == 3 + 5
    docs = helm.template(
        None, "nodeAgent.resyncInterval=0.5", "nodeAgent.fabricManager.initDelay=1.25"
    )
    assert flags(docs)["--resync-interval"] == "0.5"
    assert flags(docs)["--fabric-manager-init-delay"] == "1.25"
    # --set-string gives a string: accepted and rendered the same.
    done = helm.run(
        "template", RELEASE, str(CHART), "--set-string", "nodeAgent.shutdownTimeout=2.5"
    )
    assert done.returncode == 0, done.stderr
    assert '"--shutdown-timeout=2.5"' in done.stdout


@pytest.mark.realclient
@pytest.mark.parametrize(
    ("flag", "given", "message"),
    [
        ("--set", "nodeAgent.shutdownTimeout=601", "/nodeAgent/shutdownTimeout"),
        ("--set", "nodeAgent.shutdownTimeout=0", "/nodeAgent/shutdownTimeout"),
        (
            "--set-string",
            "nodeAgent.shutdownTimeout=900",
            "nodeAgent.shutdownTimeout=900: expected",
        ),
        (
            "--set-string",
            "nodeAgent.shutdownTimeout=0.0",
            "nodeAgent.shutdownTimeout=0.0: expected",
        ),
        ("--set", "nodeAgent.resyncInterval=86401", "/nodeAgent/resyncInterval"),
        ("--set-string", "nodeAgent.resyncInterval=100000", "nodeAgent.resyncInterval=100000"),
        ("--set", "nodeAgent.fabricManager.initDelay=3601", "/nodeAgent/fabricManager/initDelay"),
        ("--set", "nodeAgent.shutdownTimeout=2.5.1", "/nodeAgent/shutdownTimeout"),
        ("--set", "nodeAgent.probes.liveness.periodSeconds=100000", "periodSeconds"),
        ("--set", "nodeAgent.probes.readiness.failureThreshold=5000", "failureThreshold"),
    ],
)
def test_seconds_out_of_range_are_refused(helm: Helm, flag: str, given: str, message: str) -> None:
    done = helm.run("template", RELEASE, str(CHART), flag, given)
    assert done.returncode != 0, f"{flag} {given} was accepted"
    assert message in done.stderr, done.stderr


# --------------------------------------------------------------------------
# Metrics: the Service, ServiceMonitor and PodMonitor
# --------------------------------------------------------------------------


@pytest.mark.realclient
def test_service_selects_the_agents_ready_or_not(helm: Helm) -> None:
    docs = helm.template()
    (service,) = by_kind(docs, "Service")
    spec = service["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is True
    ds = daemonset(docs)
    assert spec["selector"] == ds["spec"]["selector"]["matchLabels"]
    assert spec["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert not by_kind(docs, "ServiceMonitor")
    assert not by_kind(docs, "PodMonitor")
    # Without the Service there is nothing for the test hook to resolve.
    docs = helm.template(None, "metrics.service.enabled=false")
    assert not by_kind(docs, "Service")
    assert not by_kind(docs, "Pod")


@pytest.mark.realclient
def test_service_monitor_scrapes_the_service(helm: Helm) -> None:
    docs = helm.template(
        None, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom"
    )
    (monitor,) = by_kind(docs, "ServiceMonitor")
    (service,) = by_kind(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {
        "port": service["spec"]["ports"][0]["name"],
        "path": "/metrics",
        "interval": "30s",
        "scrapeTimeout": "10s",
    }


@pytest.mark.realclient
def test_pod_monitor_scrapes_the_pods(helm: Helm) -> None:
    docs = helm.template(None, "metrics.podMonitor.enabled=true", "metrics.podMonitor.interval=1m")
    (monitor,) = by_kind(docs, "PodMonitor")
    ds = daemonset(docs)
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == agent(docs)["ports"][0]["name"]
    assert (endpoint["path"], endpoint["interval"]) == ("/metrics", "1m")


@pytest.mark.realclient
@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ("metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true"),
            "would scrape every agent twice",
        ),
        (
            ("metrics.serviceMonitor.enabled=true", "metrics.service.enabled=false"),
            "metrics.serviceMonitor.enabled=true needs metrics.service.enabled=true",
        ),
        (("metrics.serviceMonitor.interval=often",), "/metrics/serviceMonitor/interval"),
    ],
    ids=["both-monitors", "monitor-without-service", "interval"],
)
def test_monitor_values_that_cannot_work_are_refused(
    helm: Helm, sets: tuple[str, ...], message: str
) -> None:
    assert message in helm.template_error(None, *sets)


# --------------------------------------------------------------------------
# `helm test`: the readiness check of every agent
# --------------------------------------------------------------------------


def hook_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (pod,) = by_kind(docs, "Pod")
    return pod


@pytest.mark.realclient
def test_helm_test_hook_checks_every_agent_unprivileged(helm: Helm) -> None:
    docs = helm.template()
    pod = hook_pod(docs)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    (service,) = by_kind(docs, "Service")
    # The Service must not select the test pod itself.
    assert not service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert container["image"] == agent(docs)["image"]
    python, dash_c, script, host, port = container["command"]
    assert (python, dash_c) == ("python3", "-c")
    assert script == (CHART / "files" / "readyz-check.py").read_text()
    assert host == f"{service['metadata']['name']}.{NAMESPACE}.svc"
    assert int(port) == service["spec"]["ports"][0]["port"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


class _Readyz(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        body = json.dumps({"ready": self.status == 200, "path": self.path}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.realclient
@pytest.mark.parametrize(("status", "code"), [(200, 0), (503, 1)])
def test_helm_test_hook_script_against_a_health_server(helm: Helm, status: int, code: int) -> None:
    """The rendered command, run here against a local /readyz, passes or fails by its answer."""
    (container,) = hook_pod(helm.template())["spec"]["containers"]
    script = container["command"][2]
    handler = type("Readyz", (_Readyz,), {"status": status})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            done = subprocess.run(
                [sys.executable, "-c", script, "127.0.0.1", str(server.server_address[1])],
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            server.shutdown()
    assert done.returncode == code, done.stdout + done.stderr
    assert f"127.0.0.1: {status} " in done.stdout
    assert '"path": "/readyz"' in done.stdout
    assert f"{1 - code} of 1 node agents ready" in done.stdout


def test_helm_test_hook_script_names_a_missing_service() -> None:
    script = (CHART / "files" / "readyz-check.py").read_text()
    done = subprocess.run(
        [sys.executable, "-c", script, "no-such-agent.invalid", "9091"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "no node agent behind no-such-agent.invalid" in done.stdout


# --------------------------------------------------------------------------
# Object names, as the docs state them
# --------------------------------------------------------------------------


@pytest.mark.realclient
@pytest.mark.parametrize(
    ("release", "profile_cm", "topology_cm"),
    [
        ("mokka", "mokka-profile", "mokka-topology"),
        ("gpu-sim", "gpu-sim-mokka-profile", "gpu-sim-mokka-topology"),
    ],
)
def test_configmap_names_are_the_documented_ones(
    helm: Helm, release: str, profile_cm: str, topology_cm: str
) -> None:
    docs = render_chart(
        helm,
        CHART,
        release,
        "nodeAgent.customProfile.version=1.0",
        "topology.enabled=true",
    )
    names = sorted(d["metadata"]["name"] for d in by_kind(docs, "ConfigMap"))
    assert names == [profile_cm, topology_cm]
    projected = volumes(docs)["config"]["projected"]["sources"]
    assert [s["configMap"]["name"] for s in projected] == [profile_cm, topology_cm]
    for doc in (CHART / "README.md", ROOT / "docs" / "helm.md"):
        text = " ".join(doc.read_text().split())
        assert f"`{profile_cm}`" in text, f"{doc} does not name {profile_cm}"
    readme = " ".join((CHART / "README.md").read_text().split())
    assert f"`{topology_cm}`" in readme


@pytest.mark.realclient
def test_gpudriver_doc_states_the_mount_the_chart_renders(helm: Helm) -> None:
    """docs/gpudriver.md: the node's / at /host, Bidirectional; nothing at /run/nvidia."""
    docs = helm.template()
    container_mounts = mounts(agent(docs))
    bidirectional = {
        path for path, m in container_mounts.items() if m.get("mountPropagation") == "Bidirectional"
    }
    assert bidirectional == {"/host"}
    assert volumes(docs)[container_mounts["/host"]["name"]]["hostPath"]["path"] == "/"
    assert not [p for p in container_mounts if p.startswith("/run/nvidia")]
    assert flags(docs)["--root"] == "/host"
    text = " ".join((ROOT / "docs" / "gpudriver.md").read_text().split())
    assert (
        "the chart mounts the node's `/` at `/host` with `mountPropagation: Bidirectional`" in text
    )
    assert "mounts nothing at `/run/nvidia` itself" in text


@pytest.mark.realclient
def test_workload_values_reach_the_agent_and_bad_ones_are_refused(helm: Helm) -> None:
    docs = helm.template(
        None,
        "nodeAgent.workload.mode=off",
        "nodeAgent.workload.pollInterval=2.5",
        "nodeAgent.workload.socket=/run/kubelet/pr.sock",
    )
    rendered = flags(docs)
    assert rendered["--workload"] == "off"
    assert rendered["--workload-poll-interval"] == "2.5"
    assert rendered["--workload-socket"] == "/run/kubelet/pr.sock"
    for bad in (
        "nodeAgent.workload.memoryShare=1.5",
        "nodeAgent.workload.utilization=101",
        "nodeAgent.workload.socket=relative",
        "nodeAgent.workload.mode=sometimes",
    ):
        assert "workload" in helm.template_error(None, bad), bad


# --------------------------------------------------------------------------
# The InfiniBand relay (nodeAgent.ib.fabric)
# --------------------------------------------------------------------------

#: The fabric of the ci value set, on the default (and documented) port.
IB_FABRIC = VALUE_SETS["ib-fabric"]


@pytest.mark.realclient
def test_ib_fabric_is_off_by_default(helm: Helm) -> None:
    for docs in (helm.template(), helm.template(VALUE_SETS["topology"])):
        spec = pod_spec(docs)
        assert "hostNetwork" not in spec
        assert "dnsPolicy" not in spec
        assert not [f for f in flags(docs) if f.startswith(("--ib-relay", "--ib-peer"))]
        assert [p["name"] for p in agent(docs)["ports"]] == ["health"]
        assert not by_kind(docs, "NetworkPolicy")
        assert not by_kind(docs, "Secret")


@pytest.mark.realclient
def test_ib_fabric_runs_the_relay_on_the_host_network(helm: Helm) -> None:
    from mokka.cli import build_parser
    from mokka.simulators.ib.settings import RELAY_PORT, IbSettings

    docs = helm.template(IB_FABRIC)
    spec = pod_spec(docs)
    assert (spec["hostNetwork"], spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    container = agent(docs)
    rendered = flags(docs)
    assert rendered["--ib-relay-port"] == str(RELAY_PORT) == "18515"
    assert rendered["--ib-peer"] == "worker-1=10.0.0.11:18515"
    assert {"name": "ib-relay", "containerPort": RELAY_PORT, "protocol": "TCP"} in (
        container["ports"]
    )
    # The health port binds the node IP, not every interface of the node.
    assert rendered["--health-addr"] == "$(NODE_IP):9091"
    assert {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}} in (
        container["env"]
    )
    # The daemon's own parser and the simulator's settings take the flags.
    namespace = parse_daemon_args(build_parser().parse_args, container["args"])
    settings = IbSettings.from_args(namespace)
    assert settings.relay_port == RELAY_PORT
    assert str(settings.relay_key_file) == rendered["--ib-relay-key-file"]
    assert settings.peer_address("worker-1") == ("10.0.0.11", RELAY_PORT)
    assert settings.peer_address("worker-0") == ("worker-0", RELAY_PORT)
    # The notes say so, and read the health port at the node IP.
    done = helm.run(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        *helm.values_args(IB_FABRIC, ()),
    )
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "the agents relay on TCP port 18515" in notes
    assert "port-forward" not in notes
    assert 'curl -s "$IP:9091/readyz"' in notes
    # Another port reaches the flag and the container port alike.
    docs = helm.template(IB_FABRIC, "nodeAgent.ib.fabric.port=20000")
    assert flags(docs)["--ib-relay-key-file"] == "/etc/mokka-ib-relay/key"
    assert flags(docs)["--ib-relay-port"] == "20000"
    assert {"name": "ib-relay", "containerPort": 20000, "protocol": "TCP"} in (agent(docs)["ports"])


@pytest.mark.realclient
def test_ib_fabric_mounts_the_relay_key_from_a_secret(helm: Helm) -> None:
    import base64

    docs = helm.template(IB_FABRIC)
    (secret,) = by_kind(docs, "Secret")
    key = base64.b64decode(secret["data"]["key"])
    assert len(key) == 64
    assert key.isalnum()
    name = secret["metadata"]["name"]
    assert name == daemonset(docs)["metadata"]["name"] + "-ib-relay"
    # Mounted as a directory (a rotated Secret arrives), root's only, and named
    # by the flag.
    volume = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "ib-relay-key")
    assert volume["secret"] == {
        "secretName": name,
        "defaultMode": 0o400,
        "items": [{"key": "key", "path": "key"}],
    }
    mount = next(m for m in agent(docs)["volumeMounts"] if m["name"] == "ib-relay-key")
    assert mount == {"name": "ib-relay-key", "mountPath": "/etc/mokka-ib-relay", "readOnly": True}
    assert "subPath" not in mount
    assert flags(docs)["--ib-relay-key-file"] == f"{mount['mountPath']}/key"
    # Each render without a cluster makes a key of its own: nothing fixed ships.
    assert by_kind(helm.template(IB_FABRIC), "Secret")[0]["data"] != secret["data"]
    # The user's own Secret: the chart makes none and mounts that one.
    docs = helm.template(IB_FABRIC, "nodeAgent.ib.fabric.key.existingSecret=fabric-key")
    assert not by_kind(docs, "Secret")
    volume = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "ib-relay-key")
    assert volume["secret"]["secretName"] == "fabric-key"
    # No relay, no key.
    docs = helm.template(IB_FABRIC, "nodeAgent.profile=t4")
    assert not by_kind(docs, "Secret")
    assert "ib-relay-key" not in [v["name"] for v in pod_spec(docs).get("volumes", [])]


@pytest.mark.realclient
def test_ib_fabric_network_policy_admits_the_relay_from_agents_only(helm: Helm) -> None:
    docs = helm.template(IB_FABRIC)
    (policy,) = by_kind(docs, "NetworkPolicy")
    selector = daemonset(docs)["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["podSelector"] == {"matchLabels": selector}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    relay, health = policy["spec"]["ingress"]
    assert relay == {
        "from": [{"podSelector": {"matchLabels": selector}}, {"ipBlock": {"cidr": "10.0.0.0/16"}}],
        "ports": [{"protocol": "TCP", "port": 18515}],
    }
    # Isolated for ingress, the pods would lose their probes and scrapes.
    assert health == {"ports": [{"protocol": "TCP", "port": 9091}]}
    assert not by_kind(
        helm.template(IB_FABRIC, "nodeAgent.ib.fabric.networkPolicy.enabled=false"), "NetworkPolicy"
    )


@pytest.mark.realclient
def test_ib_fabric_without_hcas_renders_no_relay(helm: Helm) -> None:
    """A built-in profile without an infiniband block has nothing to relay."""
    for profile in ("a100", "l40s", "t4"):
        docs = helm.template(IB_FABRIC, f"nodeAgent.profile={profile}")
        assert "hostNetwork" not in pod_spec(docs), profile
        assert "--ib-relay-port" not in flags(docs)
        assert flags(docs)["--health-addr"] == "0.0.0.0:9091"
        assert not by_kind(docs, "NetworkPolicy")
    # Asked for explicitly (sysfs), or a custom profile: the chart trusts it.
    docs = helm.template(IB_FABRIC, "nodeAgent.profile=t4", "nodeAgent.ib.mode=sysfs")
    assert pod_spec(docs)["hostNetwork"] is True


def test_ib_fabric_profiles_without_hcas_are_the_built_in_ones() -> None:
    """The chart's list of built-in profiles without HCAs is the profiles' own."""
    from mokka.state.compile import compile_profile

    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    listed = helpers.split('define "mokka.profilesWithoutIb" -}}\n', 1)[1].split("\n", 1)[0]
    shipped = sorted(p.stem for p in (ROOT / "mokka" / "state" / "profiles").glob("*.yaml"))
    without = [name for name in shipped if compile_profile(name, node_name="n").infiniband is None]
    assert listed.split() == without
    assert without
    assert len(without) < len(shipped)


@pytest.mark.realclient
@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("topology.enabled=false",), "nodeAgent.ib.fabric.enabled=true needs topology.enabled"),
        (("nodeAgent.ib.mode=off",), "with nodeAgent.ib.mode=off: there are no HCAs"),
        (("nodeAgent.ib.fabric.port=9091",), "expected a port other than the health port 9091"),
        (("nodeAgent.ib.fabric.port=80",), "/nodeAgent/ib/fabric/port"),
        (("nodeAgent.ib.fabric.port=65536",), "/nodeAgent/ib/fabric/port"),
        (("nodeAgent.ib.fabric.port=x",), "/nodeAgent/ib/fabric/port"),
        (("nodeAgent.ib.fabric.peers.worker-1=10.0.0.11",), "/nodeAgent/ib/fabric/peers"),
        (("nodeAgent.ib.fabric.peers.worker-1=h:99999",), "/nodeAgent/ib/fabric/peers"),
        (
            ("nodeAgent.ib.fabric.networkPolicy.allow=x",),
            "'/nodeAgent/ib/fabric/networkPolicy': additional properties 'allow'",
        ),
        (
            ("nodeAgent.ib.fabric.relayPort=1",),
            "'/nodeAgent/ib/fabric': additional properties 'relayPort'",
        ),
        (
            ("nodeAgent.ib.fabric.key.existingSecret=Not_A_Name",),
            "/nodeAgent/ib/fabric/key/existingSecret",
        ),
        (
            ("nodeAgent.ib.fabric.key.value=x",),
            "'/nodeAgent/ib/fabric/key': additional properties 'value'",
        ),
    ],
    ids=[
        "no-topology",
        "ib-off",
        "health-port",
        "port-low",
        "port-high",
        "port-type",
        "peer-no-port",
        "peer-port-range",
        "policy-key",
        "fabric-key",
        "secret-name",
        "key-value",
    ],
)
def test_ib_fabric_values_that_cannot_work_are_refused(
    helm: Helm, sets: tuple[str, ...], message: str
) -> None:
    error = helm.template_error(IB_FABRIC, *sets)
    assert message in error, error
