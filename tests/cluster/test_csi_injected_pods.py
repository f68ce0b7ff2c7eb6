"""The pod the webhook injects with CKPTDRAIN_NODE_TIER=csi, judged by a real
apiserver's Pod Security admission: admitted in a namespace enforcing
`restricted`; the same tenant pod injected in hostPath mode is refused. The
patch is build_pod_patch's own, applied as the webhook's response would be."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import Any

import jsonpatch
import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import injection
from ckptdrain.operator.policy import spec as policy
from support.apiserver import Cluster

HOSTPATH = config.OperatorConfig(image="ckptdrain:1.0")
CSI = config.OperatorConfig(image="ckptdrain:1.0", node_tier="csi")


@pytest.fixture
def restricted(cluster: Cluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
    yield name
    cluster.kubectl("delete", "-n", name, "pods", "--all", "--wait=false", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def injected(namespace: str, cfg: config.OperatorConfig) -> dict[str, Any]:
    pol = policy.parse(namespace, "llama", {
        "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "8GB"},
        "interval": "15m", "writers": 1,
        "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
        "storage": {"uri": "s3://bucket/runs"}}, cfg)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "trainer-0", "namespace": namespace, "labels": {"app": "t"}},
           "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "trainer", "image": "t:1", "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]}}}]}}
    ops = injection.build_pod_patch(pod, pol, cfg, default_rate=1e9)
    return jsonpatch.apply_patch(copy.deepcopy(pod), ops)


def create(cluster: Cluster, pod: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "-f", "-", input=json.dumps(pod), check=False)


def test_the_csi_injected_pod_is_admitted_under_restricted(cluster: Cluster,
                                                           restricted: str) -> None:
    made = create(cluster, injected(restricted, CSI))
    assert made.returncode == 0, made.stderr


def test_the_host_path_injected_pod_is_refused_under_restricted(cluster: Cluster,
                                                                restricted: str) -> None:
    made = create(cluster, injected(restricted, HOSTPATH))
    assert made.returncode != 0
    assert "violates PodSecurity \"restricted" in made.stderr
    assert "hostPath" in made.stderr and injection.PREPARE in made.stderr
