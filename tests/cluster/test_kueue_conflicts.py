"""Conflicts with Kueue's settings, against a real apiserver: the operator,
running with exactly the rules of docs/rbac.md (and the Role on Kueue's
ConfigMap that section "Kueue's configuration" gives), reads Kueue's
waitForPodsReady, a Workload's flavour and pod sets, and says each conflict
in the policy's KueueCompatible condition, in Warning Events on the
Workload and in a gauge; once all are fixed, the condition turns True.
No Kueue controller runs: its APIs are served from minimal CRDs and its
ConfigMap is written as Kueue's chart writes it."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cluster_helpers import POLICIES, create, get, jobset_over_a_job, policy, wait_for
from documented_rbac import operator_rules, operator_section_rules
from kubernetes import client, config
from operator_process import OperatorProcess
from test_rbac import _bind
from test_recency import (
    OPERATOR_SA,
    STUBS,
    SYSTEM_NS,
    _checkpoint,
    _crd,
    _writers,
)

from ckptdrain.contract.record import State
from support.apiserver import Cluster

KUEUE_NS, KUEUE_CONFIG = "kq-system", "kueue-manager-config"
#: ResourceFlavors are cluster-scoped.
FLAVORS = _crd("kueue.x-k8s.io", "v1beta1", "ResourceFlavor", "resourceflavors")
FLAVORS["spec"]["scope"] = "Cluster"
NVME = "example.com/nvme"


def _kueue_configuration(timeout: str) -> dict[str, Any]:
    text = ("apiVersion: config.kueue.x-k8s.io/v1beta1\nkind: Configuration\n"
            f"waitForPodsReady:\n  enable: true\n  timeout: {timeout}\n")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": KUEUE_CONFIG, "namespace": KUEUE_NS},
            "data": {"controller_manager_config.yaml": text}}


@pytest.fixture(scope="module")
def kueue_operator(cluster: Cluster, operator: OperatorProcess,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator as the chart's ServiceAccount with the documented rules,
    told where Kueue's ConfigMap is, after Kueue's APIs are served."""
    cluster.kubectl("create", "namespace", SYSTEM_NS, check=False)
    cluster.kubectl("create", "namespace", KUEUE_NS, check=False)
    stubs = json.dumps({"apiVersion": "v1", "kind": "List", "items": [*STUBS, FLAVORS]})
    cluster.kubectl("apply", "-f", "-", input=stubs)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/jobsets.jobset.x-k8s.io", "crd/workloads.kueue.x-k8s.io",
                    "crd/resourceflavors.kueue.x-k8s.io")
    kubeconfig = _bind(cluster, "ClusterRole", OPERATOR_SA, SYSTEM_NS,
                       operator_rules(dev_mode=True))
    # The Role the chart renders in Kueue's namespace, bound to the same account.
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "ckptdrain-kueue-config", "namespace": KUEUE_NS},
            "rules": operator_section_rules("## Kueue's configuration")}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "ckptdrain-kueue-config", "namespace": KUEUE_NS},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                           "name": "ckptdrain-kueue-config"},
               "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA,
                             "namespace": SYSTEM_NS}]}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List",
         "items": [role, binding, _kueue_configuration("5m")]}))
    operator.stop()
    limited = OperatorProcess(cluster, tmp_path_factory.mktemp("kueue"),
                              KUBECONFIG=str(kubeconfig),
                              CKPTDRAIN_KUEUE_CONFIGMAP=f"{KUEUE_NS}/{KUEUE_CONFIG}")
    try:
        limited.start()
        yield limited
    finally:
        limited.stop()
        cluster.kubectl("delete", "-f", "-", input=stubs, check=False)
        cluster.kubectl("delete", "namespace", KUEUE_NS, "--wait=false", check=False)
        operator.start()


def _condition(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    found = get(cluster, namespace, POLICIES, name).get("status", {}).get("conditions") or []
    return next((c for c in found if c["type"] == "KueueCompatible"), {})


def _events(cluster: Cluster, namespace: str, workload: str) -> dict[str, list[str]]:
    listed = json.loads(cluster.kubectl(
        "get", "events", "-n", namespace, "-o", "json",
        "--field-selector", f"involvedObject.name={workload}").stdout)["items"]
    out: dict[str, list[str]] = {}
    for e in listed:
        if e["type"] == "Warning" and e["involvedObject"]["kind"] == "Workload":
            out.setdefault(e["reason"], []).append(e["message"])
    return out


def _flavor(cluster: Cluster, name: str, labels: dict[str, str]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
        "metadata": {"name": name}, "spec": {"nodeLabels": labels}}))


def test_each_conflict_is_said_and_fixing_them_turns_the_condition_true(
        cluster: Cluster, kueue_operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    apply(policy("kq", writers=2, storage={"uri": "s3://bucket/runs", "keep": 3},
                 placement={"nodeAffinity": {"matchExpressions": [
                     {"key": NVME, "operator": "In", "values": ["true"]}]}}))
    wait_for(lambda: get(cluster, namespace, POLICIES, "kq").get("status", {}).get("phase"))
    spot, nvme = f"spot-{namespace}", f"nvme-{namespace}"
    _flavor(cluster, spot, {NVME: "false", "zone": "a"})
    _flavor(cluster, nvme, {NVME: "true"})
    owner, job = jobset_over_a_job(cluster, namespace, "kq", 2)
    template = {"metadata": {"labels": {"app": "kq", "ckptdrain.io/inject": "true"}},
                "spec": {"containers": [{"name": "trainer", "image": "trainer:1",
                                         "resources": {"requests": {"cpu": "50m"}}}]}}
    # As Kueue makes it: its job's pod template and count, admitted to `spot`.
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
        "metadata": {"name": "jobset-kq-1", "ownerReferences": [owner],
                     "labels": {"kueue.x-k8s.io/job-uid": owner["uid"]}},
        "spec": {"queueName": "q", "podSets": [
            {"name": "workers", "count": 2, "template": template}]},
        "status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "workers", "flavors": {"cpu": spot}, "count": 2}]}}}
    made = create(cluster, namespace, workload)
    assert made.returncode == 0, made.stderr
    writers = _writers(cluster, core_api, namespace, "kq", job, 2)
    _checkpoint(writers, 1, State.GLOBAL)

    # Kueue's 5m against the default retryDeadline (10m) plus a restore; the
    # flavour's nodes outside the placement; the agent not in the quota.
    found = wait_for(lambda: (c := _condition(cluster, namespace, "kq"))
                     and c["status"] == "False" and c, timeout_s=60, what="KueueCompatible")
    assert found["reason"] == "WaitForPodsReadyTooShort", found
    text = found["message"]
    assert "waitForPodsReady.timeout (5m) is not above spec.restore.retryDeadline (10m)" \
        in text, text
    assert f"ResourceFlavor {spot}" in text and f"{NVME}=false" in text, text
    assert f"{NVME} In [true]" in text, text
    assert "workers: cpu 100m, memory 256Mi per pod × 2" in text, text
    assert "cpu 200m, memory 512Mi in all" in text, text
    events = wait_for(lambda: (e := _events(cluster, namespace, "jobset-kq-1"))
                      and len(e) == 3 and e, what="the Workload's Events")
    assert sorted(events) == ["FlavorOutsidePlacement", "QuotaExcludesInjected",
                              "WaitForPodsReadyTooShort"]
    assert all(len(m) == 1 for m in events.values()), events  # once each, not per pass
    gauges = dict(re.findall(r'ckptdrain_kueue_conflicts\{namespace="' + namespace
                             + r'",policy="kq",reason="(\w+)"\} (\S+)',
                             kueue_operator.metrics()))
    assert gauges == {"WaitForPodsReadyTooShort": "1.0", "FlavorOutsidePlacement": "1.0",
                      "QuotaExcludesInjected": "1.0"}

    # Kueue evicts it for PodsReadyTimeout: said first.
    cluster.kubectl("patch", "-n", namespace, "workloads.kueue.x-k8s.io", "jobset-kq-1",
                    "--type=merge", "-p", json.dumps({"status": {"conditions": [
                        {"type": "Evicted", "status": "True", "reason": "PodsReadyTimeout",
                         "message": "x", "lastTransitionTime": "2026-11-30T00:00:00Z"}]}}))
    _checkpoint(writers, 2, State.GLOBAL)
    wait_for(lambda: _condition(cluster, namespace, "kq").get("reason")
             == "EvictedWhileRestoring", timeout_s=60, what="EvictedWhileRestoring")
    wait_for(lambda: "EvictedWhileRestoring" in _events(cluster, namespace, "jobset-kq-1"),
             what="its Event")

    # Fixed: a longer timeout, a flavour of NVMe nodes, an overhead for the
    # agent (a RuntimeClass's, as Kueue copies it), readmitted: True (Kueue's
    # ConfigMap is read again within 30 s). Readmitted, Kueue keeps the
    # requeueState it set at the eviction: no conflict for it.
    cluster.kubectl("apply", "-f", "-", input=json.dumps(_kueue_configuration("30m")))
    template["spec"]["overhead"] = {"cpu": "100m", "memory": "256Mi"}
    cluster.kubectl("patch", "-n", namespace, "workloads.kueue.x-k8s.io", "jobset-kq-1",
                    "--type=merge", "-p", json.dumps({
                        "spec": {"podSets": [{"name": "workers", "count": 2,
                                              "template": template}]},
                        "status": {"requeueState": {"count": 1}, "conditions": [
                            {"type": "Evicted", "status": "False", "reason": "QuotaReserved",
                             "message": "x", "lastTransitionTime": "2026-11-30T00:05:00Z"},
                            {"type": "Requeued", "status": "True",
                             "reason": "BackoffFinished", "message": "x",
                             "lastTransitionTime": "2026-11-30T00:05:00Z"}], "admission": {
                            "clusterQueue": "cq", "podSetAssignments": [
                                {"name": "workers", "flavors": {"cpu": nvme}, "count": 2}]}}}))

    # A pass runs on each checkpoint (the status moves); one every 5 s until
    # the cached configuration has been read again.
    done: dict[str, Any] = {}
    for step in range(3, 21):
        _checkpoint(writers, step, State.GLOBAL)
        done = wait_for(lambda: _condition(cluster, namespace, "kq"), what="the condition")
        if done.get("status") == "True":
            break
        time.sleep(5)
    assert done["reason"] == "NoConflictKnown", done
    assert done["message"] == "no conflict with Kueue's settings known", done
    assert "ckptdrain_kueue_conflicts{namespace=\"" + namespace not in kueue_operator.metrics()

    # Kueue lets the Workload go: nothing of the policy's is queued, the
    # condition goes on the next pass.
    cluster.kubectl("delete", "-n", namespace, "workloads.kueue.x-k8s.io", "jobset-kq-1")
    for step in range(21, 40):
        _checkpoint(writers, step, State.GLOBAL)
        if not _condition(cluster, namespace, "kq"):
            break
        time.sleep(2)
    assert _condition(cluster, namespace, "kq") == {}
    log = kueue_operator.tail(200_000)
    assert not re.search(r"(?i)forbidden|not known|not written", log), log[-3000:]


@pytest.fixture
def core_api(cluster: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
