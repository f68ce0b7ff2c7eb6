"""The pod the webhook's patch makes, and the policy fields it comes from,
as the real apiserver takes them: sizes written as Kubernetes quantities
(a policy's `64GB` once reached the pod verbatim and was refused), the work
dir's size limit and ephemeral-storage request, placement, and restore's
retry deadline and skip switch."""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import jsonpatch
import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import injection
from ckptdrain.operator.policy import spec as policy
from support import apiserver

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
NVME = {"key": "example.com/nvme", "operator": "In", "values": ["true"]}
TAINT = {"key": "nvme", "operator": "Exists", "effect": "NoSchedule"}


def _spec(size_limit: str | None) -> dict[str, Any]:
    local: dict[str, Any] = {"path": "/mnt/ckptdrain/nvme", "keep": 2, "capacity": "50GB"}
    if size_limit:
        local["memory"] = {"sizeLimit": size_limit}
    return {"selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
            "interval": "15m", "writers": 8, "localTier": local,
            "storage": {"uri": "s3://bucket/runs"},
            "restore": {"retryDeadline": "3m"},
            "placement": {"nodeAffinity": {"matchExpressions": [NVME]},
                          "tolerations": [TAINT]}}


def _pod(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": "t"},
                         "annotations": {"ckptdrain.io/restore": "skip"}},
            "spec": {"containers": [{"name": "trainer", "image": "t:1"}],
                     "affinity": {"nodeAffinity": {
                         "requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [
                                 {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}}


def _create(cluster: apiserver.Cluster, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(obj),
                           check=False)


@pytest.mark.parametrize("size_limit", ["64GB", "64Gi", "12.5GB", None])
def test_the_injected_pod_is_accepted_by_the_apiserver(
        cluster: apiserver.Cluster, crds: None, namespace: str, size_limit: str | None) -> None:
    spec = _spec(size_limit)
    created = _create(cluster, {"apiVersion": "ckptdrain.io/v1alpha1",
                                "kind": "CheckpointPolicy",
                                "metadata": {"name": "p", "namespace": namespace},
                                "spec": spec})
    assert created.returncode == 0, created.stderr  # the CRD's schema takes the new fields
    stored = json.loads(created.stdout)["spec"]
    assert stored["restore"]["retryDeadline"] == "3m" and stored["placement"] == spec["placement"]
    # The operator parses what the apiserver stored, not what we sent.
    p = policy.parse(namespace, "p", stored, CFG)
    pod = _pod(namespace, "w-0")
    # The pod's own value of what the work dir's mount reads is replaced.
    pod["spec"]["containers"][0]["env"] = [{"name": "CKPTDRAIN_WORK_NAME", "value": "mine"}]
    ops = injection.build_pod_patch(pod, p, CFG, default_rate=1e9, rank=0)
    result = _create(cluster, jsonpatch.apply_patch(copy.deepcopy(pod), ops))
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)["spec"]
    agent = next(c for c in got["initContainers"] if c["name"] == injection.AGENT)
    if size_limit is None:
        # The work dir is on the node, in the local tier's volume: the
        # apiserver takes the subPathExpr and the fsGroup added for it.
        assert "ckptdrain-work" not in {v["name"] for v in got["volumes"]}
        assert "ephemeral-storage" not in agent["resources"]["requests"]
        assert {"name": "ckptdrain-local", "mountPath": "/ckptdrain/work",
                "subPathExpr": "$(CKPTDRAIN_WORK_NAME)"} in got["containers"][0]["volumeMounts"]
        # One dir per pod, named from its UID defined just before.
        env = [(e["name"], e.get("value", e.get("valueFrom")))
               for e in got["containers"][0]["env"]]
        assert env[-2:] == [("CKPTDRAIN_POD_UID", {"fieldRef": {
            "apiVersion": "v1", "fieldPath": "metadata.uid"}}),
            ("CKPTDRAIN_WORK_NAME", "work-0-$(CKPTDRAIN_POD_UID)")]
        assert [n for n, _ in env].count("CKPTDRAIN_WORK_NAME") == 1
    else:
        work = next(v for v in got["volumes"] if v["name"] == "ckptdrain-work")["emptyDir"]
        assert work["medium"] == "Memory"
    assert got["securityContext"]["fsGroup"] == 65532
    terms = got["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]}, NVME]}]
    assert TAINT in got["tolerations"]


def test_a_size_in_our_units_copied_verbatim_is_what_the_apiserver_refuses(
        cluster: apiserver.Cluster, namespace: str) -> None:
    """The control: the bug this guards against is real on this apiserver."""
    pod = _pod(namespace, "verbatim")
    pod["spec"]["volumes"] = [{"name": "w", "emptyDir": {"medium": "Memory",
                                                         "sizeLimit": "64GB"}}]
    result = _create(cluster, pod)
    assert result.returncode != 0 and "quantit" in result.stderr.lower(), result.stderr


def test_the_crd_refuses_a_bad_retry_deadline_naming_the_field(
        cluster: apiserver.Cluster, crds: None, namespace: str) -> None:
    spec = _spec(None)
    spec["restore"]["retryDeadline"] = "soon"
    result = _create(cluster, {"apiVersion": "ckptdrain.io/v1alpha1", "kind": "CheckpointPolicy",
                               "metadata": {"name": "bad", "namespace": namespace},
                               "spec": spec})
    assert result.returncode != 0 and "spec.restore.retryDeadline" in result.stderr
