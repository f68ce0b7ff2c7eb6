"""docs/rbac.md is the one source of the RBAC rules: the operator and an agent
run here with exactly those rules (read from the doc) and still work."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import INJECT, get, pod, policy, wait_for
from kubernetes import client, config
from operator_process import OperatorProcess, repo_root

from ckptdrain.node.kube import RecordWriter
from support.apiserver import Cluster

SYSTEM_NS = "ckptdrain-system"


def _rules(section: int, dev_mode: bool) -> list[dict[str, Any]]:
    text = (repo_root() / "docs" / "rbac.md").read_text()
    block = re.findall(r"```yaml\n(.*?)```", text, re.S)[section]
    if dev_mode:  # the managed-webhook rule the doc keeps commented out
        block = re.sub(r"^  # (- apiGroups: \[admissionregistration|  (resources|verbs): )",
                       r"  \1", block, flags=re.M)
    return list(yaml.safe_load(block)["rules"])


def _bind(cluster: Cluster, kind: str, name: str, namespace: str,
          rules: list[dict[str, Any]]) -> Path:
    meta: dict[str, Any] = {"name": name}
    if kind == "Role":
        meta["namespace"] = namespace
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": f"{kind}Binding",
         "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": objects}))
    return cluster.kubeconfig_for(namespace, name)


@pytest.fixture
def least_privileged_operator(cluster: Cluster, operator: OperatorProcess,
                              tmp_path: Path) -> Iterator[OperatorProcess]:
    """The session operator swapped for one running with only the documented rules."""
    cluster.kubectl("create", "namespace", SYSTEM_NS, check=False)
    kubeconfig = _bind(cluster, "ClusterRole", "ckptdrain-operator", SYSTEM_NS,
                       _rules(0, dev_mode=True))
    operator.stop()
    limited = OperatorProcess(cluster, tmp_path, KUBECONFIG=str(kubeconfig))
    try:
        limited.start()
        yield limited
    finally:
        limited.stop()
        operator.start()


def test_documented_rules_are_enough(cluster: Cluster, namespace: str,
                                     least_privileged_operator: OperatorProcess,
                                     apply: Callable[..., Any]) -> None:
    agent_kubeconfig = _bind(cluster, "Role", "ckptdrain-agent", namespace,
                             _rules(1, dev_mode=False))
    apply(policy("llama", writers=2, storage={"uri": "s3://bucket/runs", "keep": 1}))
    status = wait_for(lambda: get(cluster, namespace, "ckpol", "llama").get("status", {})
                      .get("phase") and get(cluster, namespace, "ckpol", "llama")["status"])
    assert status["requiredBandwidthBytes"] == 63_000_000_000
    for i in range(2):
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
            pod(f"w-{i}", {"app": "llama", **INJECT}, terminationGracePeriodSeconds=3600)))
    wait_for(lambda: {get(cluster, namespace, "pod", f"w-{i}")["metadata"]["annotations"]
                      ["ckptdrain.io/bandwidth"] for i in range(2)} == {"31500000000"})

    # The agent's own identity: records, its claims, its pod's annotations.
    api = client.CustomObjectsApi(config.new_client_from_config(str(agent_kubeconfig)))
    core = client.CoreV1Api(config.new_client_from_config(str(agent_kubeconfig)))
    writers = [RecordWriter(namespace, "llama", 2, w, api=api) for w in ("0", "1")]
    for step in (1, 2):
        for w in writers:
            w.report(step, "Global", 10, ["local", "global"], datetime.now(UTC))
    core.patch_namespaced_pod("w-0", namespace, {"metadata": {"annotations": {
        "ckptdrain.io/pending-bytes": "5", "ckptdrain.io/restored-from": "step=2 tier=local"}}},
        _content_type="application/merge-patch+json")
    wait_for(lambda: [r["metadata"]["name"] for r in get(cluster, namespace, "ckpt")["items"]]
             == ["llama-s2"], what="retention with the documented rules")
    wait_for(lambda: get(cluster, namespace, "ckpol", "llama")["status"].get("restores"))
    with pytest.raises(client.exceptions.ApiException) as denied:
        core.read_namespaced_secret("s3-creds", namespace)
    assert denied.value.status == 403

    log = least_privileged_operator.tail(200_000)
    assert "Forbidden" not in log and "403" not in log, log[-3000:]
