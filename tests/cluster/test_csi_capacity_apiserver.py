"""The CSI driver's free space on a real apiserver (docs/csi-driver.md,
"Free space for admission"): the driver, as its own ServiceAccount with
exactly the documented Role, creates and then updates its node's
CSIStorageCapacity (refused before the Role is bound, it logs that and
goes on scanning); the operator's documented rules list the reports; and
a policy whose writer's need exceeds every report is admitted with a
warning, one that fits without, on both serving paths."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import csi_driver_rules, page_object, policy, wait_for
from documented_rbac import operator_section_rules
from kubernetes import client, config
from operator_process import OperatorProcess, repo_root

from ckptdrain.csi import capacity_report
from ckptdrain.csi.policies import apiserver_resolver
from ckptdrain.csi.usage import Capacity
from ckptdrain.operator.admission import node_room
from support.apiserver import Cluster
from support.csi_driver import AS_ROOT_ON_LINUX, running_driver

GB = 10**9
DRIVER = "node.ckptdrain.io"
KIND = "csistoragecapacities"


def _role_objects(namespace: str, account: str, kind: str,
                  rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`kind` (Role or ClusterRole) of `rules`, bound to `account`."""
    meta = {"name": account, **({"namespace": namespace} if kind == "Role" else {})}
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
             "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": f"{kind}Binding",
             "metadata": meta, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                           "kind": kind, "name": account},
             "subjects": [{"kind": "ServiceAccount", "name": account,
                           "namespace": namespace}]}]


def _apply_all(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": objects}))


def _report(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    found = cluster.kubectl("get", "-n", namespace, KIND, name, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


@pytest.fixture
def driver_account(cluster: Cluster, crds: None, namespace: str) -> Iterator[tuple[str, Path]]:
    """The driver's ServiceAccount with its documented ClusterRole (its
    reads) and no Role yet; its name and kubeconfig."""
    name = f"csi-driver-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", name, "-n", namespace)
    _apply_all(cluster, _role_objects(namespace, name, "ClusterRole", csi_driver_rules()))
    try:
        yield name, cluster.kubeconfig_for(namespace, name)
    finally:
        cluster.kubectl("delete", "clusterrolebinding,clusterrole", name, check=False)


@AS_ROOT_ON_LINUX
def test_the_driver_creates_then_updates_its_nodes_report_with_exactly_its_role(
        cluster: Cluster, namespace: str, driver_account: tuple[str, Path],
        caplog: pytest.LogCaptureFixture) -> None:
    account, kubeconfig = driver_account
    api = config.new_client_from_config(str(kubeconfig))
    name = capacity_report.object_name("node-a", DRIVER)
    with caplog.at_level(logging.INFO, "ckptdrain.csi.capacity_publisher"), running_driver(
            apiserver_resolver(client.CustomObjectsApi(api)),
            storage_api=client.StorageV1Api(api), capacity_namespace=namespace,
            scan_interval_s=0.5):
        # Without the Role: refused, said once, and the scans go on.
        wait_for(lambda: "HTTP 403" in caplog.text, what="the refused write logged")
        assert _report(cluster, namespace, name) is None
        role = page_object(repo_root() / "docs" / "csi-driver.md", "Role")
        _apply_all(cluster, _role_objects(namespace, account, "Role", role["rules"]))
        created = wait_for(lambda: _report(cluster, namespace, name), what="report created")
        assert "published as CSIStorageCapacity" in caplog.text
        assert caplog.text.count("HTTP 403") == 1
        assert created["storageClassName"] == "ckptdrain-node-tier"
        assert created["nodeTopology"] == {"matchLabels": {"kubernetes.io/hostname": "node-a"}}
        annotations = created["metadata"]["annotations"]
        assert annotations["ckptdrain.io/node"] == "node-a"
        assert annotations["ckptdrain.io/refresh-seconds"] == "5"  # ten 0.5 s scans
        report = node_room.report_of(created)
        assert report is not None and report.available_bytes > 0
        # Written once more at the next scan (a report the garbage collector
        # took with a previous driver Pod comes back), then a refresh period
        # later: the same object, measured later (measured-at is in seconds).
        updated = wait_for(lambda: (r := _report(cluster, namespace, name)) and r["metadata"][
            "annotations"]["ckptdrain.io/measured-at"] > annotations[
            "ckptdrain.io/measured-at"] and r, what="report updated")
        assert updated["metadata"]["uid"] == created["metadata"]["uid"]


def _reports(cluster: Cluster, namespace: str, free: dict[str, int]) -> None:
    """Reports as the drivers of nodes `free` would write them, just measured."""
    _apply_all(cluster, [capacity_report.build(
        node, DRIVER, namespace, Capacity(available, 100 * available, 1, 1), time.time(), 600)
        for node, available in free.items()])


def test_the_operators_documented_rules_list_the_reports_and_write_none(
        cluster: Cluster, namespace: str) -> None:
    account = f"reader-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    _apply_all(cluster, _role_objects(namespace, account, "Role", operator_section_rules(
        "## The CSI drivers' free space")))
    _reports(cluster, namespace, {"gpu-1": 20 * GB})
    kubeconfig = str(cluster.kubeconfig_for(namespace, account))
    listed = wait_for(lambda: (r := cluster.kubectl(
        "--kubeconfig", kubeconfig, "get", "-n", namespace, KIND, "-l",
        f"ckptdrain.io/csi-driver={DRIVER}", "-o", "json", check=False)).returncode == 0
        and json.loads(r.stdout), what="the reports listed as the operator")
    [report] = [node_room.report_of(item) for item in listed["items"]]
    assert report is not None and (report.node, report.available_bytes) == ("gpu-1", 20 * GB)
    denied = cluster.kubectl("--kubeconfig", kubeconfig, "auth", "can-i", "create", KIND,
                             "-n", namespace, check=False)
    assert denied.stdout.strip() == "no"


def _sized(name: str, capacity: str) -> dict[str, Any]:
    # 80 GB over 8 writers: 10 GB shards; keep 2 needs 30 GB, under either capacity.
    return policy(name, model={"checkpointBytes": "80GB"}, writers=8,
                  localTier={"path": "/mnt/ckptdrain/nvme", "keep": 2, "capacity": capacity})


@pytest.fixture(params=["process", "kopf"])
def csi_operator(request: pytest.FixtureRequest, cluster: Cluster, operator: OperatorProcess,
                 namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The session operator swapped for one in CSI mode reading the reports
    in the test's namespace, admitting in its own process or on Kopf's server."""
    operator.stop()
    inline = {"CKPTDRAIN_WEBHOOK_PROCESS": "false"} if request.param == "kopf" else {}
    csi = OperatorProcess(cluster, tmp_path, CKPTDRAIN_NODE_TIER="csi",
                          CKPTDRAIN_CSI_CAPACITY_NAMESPACE=namespace, **inline)
    try:
        csi.start()
        yield csi
    finally:
        csi.stop()
        operator.start()


def test_a_policy_no_node_has_room_for_is_admitted_with_a_warning(
        cluster: Cluster, namespace: str, csi_operator: OperatorProcess,
        apply: Callable[..., Any]) -> None:
    _reports(cluster, namespace, {"gpu-1": 20 * GB, "gpu-2": 44 * GB})
    wait_for(lambda: apply(_sized("probe", "31GB"), check=False).returncode == 0,
             what="the webhook answering")
    tight = apply(_sized("tight", "45GB"), check=False)
    assert tight.returncode == 0, tight.stderr  # warned, never refused
    assert "Warning: ckptdrain: spec.localTier.capacity" in tight.stderr, tight.stderr
    assert "2 nodes report at most 44.0 GB free (gpu-2)" in tight.stderr
    fits = apply(_sized("fits", "40GB"), check=False)
    assert fits.returncode == 0, fits.stderr
    assert "Warning" not in fits.stderr, fits.stderr
    # An update that leaves the need alone says nothing again.
    again = apply({**_sized("tight", "45GB"), "spec": {**_sized("tight", "45GB")["spec"],
                                                       "interval": "20m"}}, check=False)
    assert again.returncode == 0 and "Warning" not in again.stderr, again.stderr
