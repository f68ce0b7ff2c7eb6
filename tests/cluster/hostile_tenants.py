"""Tenant B as the hostile-tenant suite (test_hostile_tenant.py) plays it:
kubectl with its own ServiceAccount token, peer credentials of its own, and
an AdmissionReview of its own making."""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cluster_helpers import INJECT
from cluster_helpers import pod as pod_of

from ckptdrain.operator.peers import certs as peer_certs
from ckptdrain.peer.tls import PeerCredentials
from support.apiserver import Cluster

#: What B's Role grants in B's own namespace: a tenant who runs its jobs.
TENANT_RULES = [
    {"apiGroups": [""], "resources": ["secrets", "configmaps", "pods"], "verbs": ["*"]},
    {"apiGroups": ["ckptdrain.io"], "resources": ["checkpointpolicies", "checkpoints"],
     "verbs": ["*"]},
]


class Tenant:
    """kubectl as tenant B's ServiceAccount, bound to TENANT_RULES in its namespace."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        cluster.kubectl("create", "serviceaccount", "trainer", "-n", namespace)
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "tenant", "namespace": namespace}, "rules": TENANT_RULES}
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "tenant", "namespace": namespace},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                               "name": "tenant"},
                   "subjects": [{"kind": "ServiceAccount", "name": "trainer",
                                 "namespace": namespace}]}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [role, binding]}))
        self.kubeconfig = cluster.kubeconfig_for(namespace, "trainer")

    def kubectl(self, *args: str, body: dict[str, Any] | None = None
                ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.cluster.binaries.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            input=None if body is None else json.dumps(body), text=True,
            capture_output=True, timeout=60, check=False)

    def create(self, body: dict[str, Any], namespace: str | None = None
               ) -> subprocess.CompletedProcess[str]:
        return self.kubectl("create", "-n", namespace or self.namespace, "-f", "-", body=body)


def peer_credentials(directory: Path, policy_key: str) -> PeerCredentials:
    """A policy's peer CA and certificate, as the operator makes them."""
    peer_certs.write_material(directory, peer_certs.new_material(policy_key, datetime.now(UTC)))
    return PeerCredentials(directory, policy_key)


def forged_review(namespace: str) -> dict[str, Any]:
    """What the apiserver would send for a pod of A's policy `ckpt`, made by B."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "operation": "CREATE", "namespace": namespace,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "object": {**pod_of("forged", {"app": "ckpt", **INJECT}), "metadata": {
            "name": "forged", "namespace": namespace, "labels": {"app": "ckpt", **INJECT}}}}}
