"""The chart's CSI node tier (nodeTier.mode: csi, the default): the
CSIDriver object, the driver's DaemonSet and its one right, none of them in
the hostPath fallback; the settings reach the driver's and the operator's
config as each loads them.
(Lint and strict conformance: the csi-node-tier variant of test_chart.py.)"""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.chart.support import CHART, REPO, Tools

from ckptdrain.csi import config as csi_config
from ckptdrain.csi.collection import Reclaim
from ckptdrain.operator import config as operator_config

PAGE = REPO / "docs" / "csi-driver.md"


def objects(tools: Tools, *args: str) -> list[dict[str, Any]]:
    text = tools.run("helm", "template", "ckptdrain", str(CHART), "--namespace", "ckptdrain",
                     *args).stdout
    return [d for d in yaml.safe_load_all(io.StringIO(text)) if d]


def one(docs: list[dict[str, Any]], kind: str, component: str = "csi-node") -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind
               and d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
               == component]
    return found


def page_object(kind: str) -> dict[str, Any]:
    [found] = [d for block in PAGE.read_text().split("```yaml\n")[1:]
               for d in yaml.safe_load_all(block.split("```")[0])
               if d and d.get("kind") == kind]  # values fragments have none
    return found


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_the_default_render_is_the_csi_node_tier(tools: Tools) -> None:
    """No value set: the driver is installed and the operator injects its
    volumes, the same render as asking for csi by name."""
    docs = objects(tools)
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "CSIDriver"] == [
        "node.ckptdrain.io"]
    daemonset = one(docs, "DaemonSet")
    assert daemonset["metadata"]["namespace"] == "ckptdrain"
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    assert driver_config(container).root == Path("/var/lib/ckptdrain/csi")
    env = env_of(one(docs, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][0])
    cfg = operator_config.from_env(env)
    assert (cfg.node_tier, cfg.csi_driver, cfg.csi_min_mount_group) == (
        "csi", "node.ckptdrain.io", 1000)
    assert docs == objects(tools, "--set", "nodeTier.mode=csi")


def test_the_hostpath_fallback_renders_no_driver(tools: Tools) -> None:
    docs = objects(tools, "--set", "nodeTier.mode=hostPath")
    assert not [d for d in docs if d["kind"] == "CSIDriver"
                or d["metadata"]["name"].endswith("csi-node")]
    deployment = one(docs, "Deployment", "operator")
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    assert operator_config.from_env(env).csi is False
    # The operator's environment is as it was when hostPath was the chart's
    # default: staying on hostPath explicitly rolls no operator pod.
    assert not {"CKPTDRAIN_NODE_TIER", "CKPTDRAIN_CSI_DRIVER",
                "CKPTDRAIN_CSI_MIN_MOUNT_GROUP"} & set(env)
    assert env["CKPTDRAIN_ALLOWED_ROOT"] == "/mnt/ckptdrain"
    assert env.get("CKPTDRAIN_PREPARE_LOCAL_TIER", "true") == "true"


def rendered_notes(tools: Tools, tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` prints it, without a cluster: a copy of
    the chart whose one extra template holds the notes as a YAML string."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)  # links followed: the copy stands alone
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_probe.tpl").write_text(
        '{{- define "probe.notes" }}' + notes + "{{- end }}")
    (chart / "templates" / "probe.yaml").write_text(
        'notes: {{ include "probe.notes" . | toJson }}\n')
    text = tools.run("helm", "template", "ckptdrain", str(chart), "--namespace", "ckptdrain",
                     "--show-only", "templates/probe.yaml", *args).stdout
    return str(yaml.safe_load(text)["notes"])


def test_the_notes_name_which_namespace_must_be_privileged(tools: Tools,
                                                           tmp_path: Path) -> None:
    csi = " ".join(rendered_notes(tools, tmp_path / "default").split())
    assert 'namespace ckptdrain must allow Pod Security "privileged"' in csi
    assert "every training namespace must enforce" not in csi
    fallback = " ".join(rendered_notes(tools, tmp_path / "hostpath",
                                       "--set", "nodeTier.mode=hostPath").split())
    assert 'every training namespace must enforce Pod Security "privileged"' in fallback
    assert "/mnt/ckptdrain/<namespace>/<policy>" in fallback
    assert "namespace ckptdrain must allow" not in fallback
    assert "now runs the CSI driver" not in csi
    upgrade = " ".join(rendered_notes(tools, tmp_path / "upgrade", "--is-upgrade").split())
    assert "a release that ran hostPath without naming it now runs the CSI driver" in upgrade
    assert "name nodeTier.mode: hostPath" in upgrade


def test_csi_mode_renders_the_driver_as_the_page_declares_it(tools: Tools) -> None:
    docs = objects(tools, "--set", "nodeTier.mode=csi")
    driver = next(d for d in docs if d["kind"] == "CSIDriver")
    assert driver["metadata"]["name"] == "node.ckptdrain.io"
    assert driver["spec"] == page_object("CSIDriver")["spec"]
    # Its rights: get on policies, list on classes, as the page lists them.
    assert one(docs, "ClusterRole")["rules"] == page_object("ClusterRole")["rules"]
    binding = one(docs, "ClusterRoleBinding")
    account = one(docs, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "ckptdrain"}]
    assert binding["roleRef"]["name"] == one(docs, "ClusterRole")["metadata"]["name"]
    # Its one write: its node's free space, in the release namespace only.
    role = one(docs, "Role")
    assert role["metadata"]["namespace"] == "ckptdrain"
    assert role["rules"] == page_object("Role")["rules"]
    bound = one(docs, "RoleBinding")
    assert bound["metadata"]["namespace"] == "ckptdrain"
    assert (bound["roleRef"]["kind"], bound["roleRef"]["name"]) == (
        "Role", role["metadata"]["name"])
    assert bound["subjects"] == binding["subjects"]


def test_the_operator_reads_the_drivers_free_space_in_the_release_namespace(
        tools: Tools) -> None:
    """The Role docs/rbac.md shows, bound to the operator's ServiceAccount
    in the release namespace, which its config names; none in hostPath mode."""
    docs = objects(tools, "--set", "nodeTier.mode=csi")
    [reader] = [d for d in docs if d["kind"] == "Role"
                and d["metadata"]["name"].endswith("-capacity-reader")]
    assert reader["metadata"]["namespace"] == "ckptdrain"
    assert reader["rules"] == rbac_section("## The CSI drivers' free space")
    # One LIST is all it makes (admission/node_room_read.py): no get.
    assert reader["rules"] == [{"apiGroups": ["storage.k8s.io"],
                                "resources": ["csistoragecapacities"], "verbs": ["list"]}]
    [bound] = [d for d in docs if d["kind"] == "RoleBinding"
               and d["roleRef"]["name"] == reader["metadata"]["name"]]
    deployment = one(docs, "Deployment", "operator")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert bound["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                  "namespace": "ckptdrain"}]
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    assert operator_config.from_env(env).csi_capacity_namespace == "ckptdrain"
    fallback = objects(tools, "--set", "nodeTier.mode=hostPath")
    assert not [d for d in fallback if d["metadata"]["name"].endswith("-capacity-reader")]
    env = env_of(one(fallback, "Deployment", "operator")["spec"]["template"]["spec"]
                 ["containers"][0])
    assert operator_config.from_env(env).csi_capacity_namespace == ""


def test_the_operators_capacity_reader_is_left_out_with_rbac_create_false(
        tools: Tools) -> None:
    """As rbac.yaml and peer-tier-rbac.yaml are: whoever sets rbac.create=false
    grants the operator its rights (docs/rbac.md), this one included."""
    docs = objects(tools, "--set", "nodeTier.mode=csi", "--set", "rbac.create=false")
    assert not [d for d in docs if d["metadata"]["name"].endswith("-capacity-reader")]
    # The drivers' own rights are the driver's, not the operator's: still there.
    assert [d for d in docs if d["kind"] == "Role"
            and d["metadata"]["labels"].get("app.kubernetes.io/component") == "csi-node"]


def rbac_section(heading: str) -> list[dict[str, Any]]:
    text = (REPO / "docs" / "rbac.md").read_text()
    block = text[text.index(heading):].split("```yaml\n")[1].split("```")[0]
    return list(yaml.safe_load(block)["rules"])


def test_the_daemonset_runs_the_driver_where_kubelet_looks(tools: Tools) -> None:
    docs = objects(tools, "--set", "nodeTier.mode=csi",
                   "--set", "csiDriver.kubeletDir=/var/lib/k0s/kubelet",
                   "--set", "csiDriver.rootDir=/mnt/nvme/ckptdrain-csi",
                   "--set", "image.tag=1.2.3")
    daemonset = one(docs, "DaemonSet")
    assert daemonset["metadata"]["namespace"] == "ckptdrain"
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    [container] = pod["containers"]
    assert container["args"] == ["csi-node"]
    assert container["image"] == "ghcr.io/ckptdrain/ckptdrain:1.2.3"  # the project image
    assert container["securityContext"]["privileged"] is True
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    hostpaths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    # Each host dir at the same path inside, the pods dir Bidirectional.
    assert {n: m["mountPath"] for n, m in mounts.items()} == hostpaths
    assert mounts["pods"]["mountPath"] == "/var/lib/k0s/kubelet/pods"
    assert mounts["pods"]["mountPropagation"] == "Bidirectional"
    # Its staging mounts under the data dir must not propagate to the host,
    # and HostToContainer would stop the container where the host's mount
    # is private (containerd: "not a shared or slave mount").
    assert "mountPropagation" not in mounts["data"]
    assert hostpaths["registry"] == "/var/lib/k0s/kubelet/plugins_registry"
    assert hostpaths["plugin"] == "/var/lib/k0s/kubelet/plugins/node.ckptdrain.io"
    assert hostpaths["data"] == "/mnt/nvme/ckptdrain-csi"
    # The environment, as the driver loads it (NODE_NAME from the downward API).
    env = env_of(container)
    assert next(e for e in container["env"] if e["name"] == "NODE_NAME")["valueFrom"] == {
        "fieldRef": {"fieldPath": "spec.nodeName"}}
    # Its free space goes to its own namespace, from the downward API.
    assert next(e for e in container["env"] if e["name"] == "CKPTDRAIN_CSI_NAMESPACE")[
        "valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # Its reports are owned by its own Pod (garbage-collected with it).
    assert {e["name"]: e["valueFrom"] for e in container["env"]
            if e["name"] in ("CKPTDRAIN_CSI_POD_NAME", "CKPTDRAIN_CSI_POD_UID")} == {
        "CKPTDRAIN_CSI_POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "CKPTDRAIN_CSI_POD_UID": {"fieldRef": {"fieldPath": "metadata.uid"}}}
    parser = argparse.ArgumentParser()
    pod_uid = "5f0c6d2e-8f3a-4b1e-9c1a-1b2c3d4e5f60"
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {**env, "NODE_NAME": "node-a", "CKPTDRAIN_CSI_POD_NAME": "csi-x",
                           "CKPTDRAIN_CSI_POD_UID": pod_uid,
                           "CKPTDRAIN_CSI_NAMESPACE": "ckptdrain"}.items():
            patch.setenv(key, value)
        csi_config.add_arguments(parser)
        cfg = csi_config.load(parser.parse_args([]))
    assert str(cfg.pods_dir) == mounts["pods"]["mountPath"]
    assert str(cfg.root) == hostpaths["data"]
    assert cfg.csi_socket.parent == cfg.csi_socket.parent.parent / "node.ckptdrain.io"
    assert str(cfg.csi_socket).startswith(hostpaths["plugin"] + "/")
    assert str(cfg.registration_socket.parent) == hostpaths["registry"]
    assert cfg.min_mount_group == 1000
    assert cfg.capacity_namespace == "ckptdrain"
    assert cfg.pod == ("csi-x", pod_uid)


def test_csi_mode_reaches_the_operator_as_its_config_reads_it(tools: Tools) -> None:
    docs = objects(tools, "--set", "nodeTier.mode=csi", "--set", "csiDriver.name=nvme.example.com")
    env = env_of(one(docs, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][0])
    cfg = operator_config.from_env(env)
    assert (cfg.csi, cfg.csi_driver) == (True, "nvme.example.com")
    assert cfg.csi_min_mount_group == 1000
    raised = objects(tools, "--set", "nodeTier.mode=csi", "--set", "csiDriver.minMountGroup=2000")
    env = env_of(one(raised, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][0])
    assert operator_config.from_env(env).csi_min_mount_group == 2000
    assert next(d for d in docs if d["kind"] == "CSIDriver")["metadata"]["name"] == \
        "nvme.example.com"


@pytest.mark.parametrize(("args", "says"), [
    (["--set", "nodeTier.mode=CSI"], "/nodeTier/mode"),
    (["--set", "csiDriver.minMountGroup=0"], "/csiDriver/minMountGroup"),
    (["--set", "csiDriver.kubeletDir=relative"], "/csiDriver/kubeletDir"),
    (["--set", "nodeTier.mode=csi", "--set", "csiDriver.reclaim.policy=delete"],
     "/csiDriver/reclaim/policy"),
    (["--set", "nodeTier.mode=csi", "--set", "csiDriver.reclaim.gracePeriod=soon"],
     "/csiDriver/reclaim/gracePeriod"),
    (["--set", "nodeTier.mode=csi", "--set", "csiDriver.reclaim.gracePeriod=0h"],
     "csiDriver.reclaim.gracePeriod: expected a duration of more than zero"),
    (["--set", "nodeTier.mode=csi", "--set", "csiDriver.scanInterval=0s"],
     "csiDriver.scanInterval: expected a duration of more than zero"),
    (["--set", "nodeTier.mode=csi", "--set", "csiDriver.metrics.port=70000"],
     "/csiDriver/metrics/port"),
    (["--set", "nodeTier.mode=csi", "--set", "csiDriver.rootDir=/mnt/ckptdrain"],
     "csiDriver.rootDir (/mnt/ckptdrain) and localTier.allowedRoot (/mnt/ckptdrain): "
     "expected two separate directories"),
    (["--set", "nodeTier.mode=csi", "--set", "csiDriver.rootDir=/mnt/ckptdrain/csi"],
     "csiDriver.rootDir (/mnt/ckptdrain/csi) and localTier.allowedRoot (/mnt/ckptdrain)"),
    (["--set", "nodeTier.mode=csi", "--set", "localTier.allowedRoot=/var/lib/ckptdrain/csi/x"],
     "csiDriver.rootDir (/var/lib/ckptdrain/csi) and localTier.allowedRoot "
     "(/var/lib/ckptdrain/csi/x)"),
    (["--set", "nodeTier.mode=csi", "--set", "csiDriver.rootDir=/mnt/./ckptdrain"],
     "csiDriver.rootDir (/mnt/./ckptdrain) and localTier.allowedRoot (/mnt/ckptdrain)"),
])
def test_the_values_schema_refuses_bad_csi_settings(tools: Tools, args: list[str],
                                                     says: str) -> None:
    result = tools.run("helm", "template", "ckptdrain", str(CHART), *args, check=False)
    assert result.returncode != 0
    assert says in result.stderr, result.stderr


def test_a_driver_root_beside_the_allowed_root_renders(tools: Tools) -> None:
    # A shared name prefix is not one directory inside the other.
    daemonset = one(objects(tools, "--set", "nodeTier.mode=csi",
                            "--set", "csiDriver.rootDir=/mnt/ckptdrain-csi"), "DaemonSet")
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    assert driver_config(container).root == Path("/mnt/ckptdrain-csi")


def test_a_scan_interval_of_an_hour_still_renders_and_loads(tools: Tools) -> None:
    """An interval that worked before the free-space reports still does: the
    driver's refresh period grows to cover it instead (capacity_report.py)."""
    daemonset = one(objects(tools, "--set", "nodeTier.mode=csi",
                            "--set", "csiDriver.scanInterval=1h"), "DaemonSet")
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    assert driver_config(container).scan_interval_s == 3600.0


def driver_config(container: dict[str, Any]) -> csi_config.DriverConfig:
    """The driver's config as it loads it from the container's environment."""
    parser = argparse.ArgumentParser()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {**env_of(container), "NODE_NAME": "node-a"}.items():
            patch.setenv(key, value)
        csi_config.add_arguments(parser)
        return csi_config.load(parser.parse_args([]))


def test_collection_and_metrics_settings_reach_the_driver(tools: Tools) -> None:
    daemonset = one(objects(tools, "--set", "nodeTier.mode=csi"), "DaemonSet")
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    cfg = driver_config(container)
    # The defaults docs/csi-driver.md states: Delete after an hour, scans every minute.
    assert cfg.reclaim == Reclaim("Delete", 3600.0)
    assert cfg.scan_interval_s == 60.0
    assert container["ports"] == [{"name": "metrics", "containerPort": cfg.metrics_port}]
    assert cfg.metrics_port == 9110
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}

    docs = objects(tools, "--set", "nodeTier.mode=csi", "--set", "csiDriver.reclaim.policy=Retain",
                   "--set", "csiDriver.reclaim.gracePeriod=2h30m",
                   "--set", "csiDriver.scanInterval=5m", "--set", "csiDriver.metrics.port=0")
    [container] = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    cfg = driver_config(container)
    assert (cfg.reclaim, cfg.scan_interval_s) == (Reclaim("Retain", 9000.0), 300.0)
    assert cfg.metrics_port == 0 and "ports" not in container and "livenessProbe" not in container
    # RBAC as the page lists it: the same `get` on policies, `list` on classes.
    assert one(docs, "ClusterRole")["rules"] == page_object("ClusterRole")["rules"]


def test_the_pod_monitor_scrapes_the_driver_pods(tools: Tools) -> None:
    docs = objects(tools, "--set", "nodeTier.mode=csi", "--set", "metrics.podMonitor.enabled=true")
    monitor = one(docs, "PodMonitor")
    daemonset = one(docs, "DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert monitor["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"] == daemonset["spec"]["selector"][
        "matchLabels"]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    assert not [d for d in objects(tools, "--set", "metrics.podMonitor.enabled=true",
                                   "--set", "nodeTier.mode=hostPath")
                if d["kind"] == "PodMonitor" and d["metadata"]["name"].endswith("csi-node")]
