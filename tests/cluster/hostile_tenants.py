"""Tenant B as the hostile-tenant suite (test_hostile_tenant.py) plays it:
kubectl with its own ServiceAccount token, peer credentials of its own, and
an AdmissionReview of its own making, a peer client of its own; what A
keeps, and how the suite reads what refused B and what of A's B got."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import socket
import ssl
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import hostile_audit
import hostile_record
import pytest
from cluster_helpers import INJECT
from cluster_helpers import pod as pod_of
from operator_process import OperatorProcess

from ckptdrain.node.localtier import LocalTier
from ckptdrain.operator.peers import certs as peer_certs
from ckptdrain.peer.area import PartnerArea
from ckptdrain.peer.client import PeerClient
from ckptdrain.peer.server import PeerServer
from ckptdrain.peer.tls import PeerCredentials
from support.apiserver import Cluster
from support.csi_driver import Harness, new_pod_uid, refused

#: What tenant A keeps; any copy of it on B's side is a leak.
A_SECRET = f"tenant-a-{uuid.uuid4().hex}"

CLASS_ROOT = "/mnt/class-nvme"

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


def raw_peer_get(port: int, credentials: Path, path: str) -> bytes | None:
    """A GET to a peer server on loopback as B's own client: B's certificate
    and key, trusting whatever certificate the server shows, so that a
    refusal can only come from the server. The answer's bytes, or None when
    the connection was refused."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.load_cert_chain(str(credentials / "tls.crt"), str(credentials / "tls.key"))
    request = f"GET {path} HTTP/1.1\r\nHost: peer\r\nConnection: close\r\n\r\n".encode()
    answer = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw) as tls:
            tls.sendall(request)
            while chunk := tls.recv(1 << 16):
                answer += chunk
    except (ssl.SSLError, OSError):
        return None
    return answer or None


def refuser(stderr: str, webhook_says: str) -> str:
    """What refused a write, read from the apiserver's answer: the policy
    webhook's denial, or the CRD's own validation rule."""
    if 'admission webhook "' in stderr and "denied the request" in stderr:
        return f"policy admission: {webhook_says}"
    if "Invalid value" in stderr:
        return "CRD schema: validation rule on spec.localTier.path"
    return ""


def operator_log_lines(operator: OperatorProcess, *says: str) -> int:
    """How many lines of the operator's log say all of `says`: a refusal
    logged again after a dry-run probe logged the same one is told apart."""
    return sum(all(s in line for s in says) for line in
               operator.log.read_text(errors="replace").splitlines())


def secret_refs(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """Every secretKeyRef in a pod's containers' env."""
    return [e["valueFrom"]["secretKeyRef"]
            for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
            for e in c.get("env", []) if "secretKeyRef" in (e.get("valueFrom") or {})]


def leaked_files(target: Path) -> int:
    """Files under `target` holding A's bytes (0 when nothing is mounted there)."""
    if not target.exists():
        return 0
    return sum(1 for f in target.rglob("*") if f.is_file() and A_SECRET.encode() in
               f.read_bytes())


def publish_as_a(h: Harness, namespace: str) -> None:
    pod = new_pod_uid()
    target = h.target(pod)
    h.publish(target, namespace, pod)
    (target / "step-1.bin").write_text(A_SECRET)
    h.unpublish(target, pod)


@contextlib.contextmanager
def a_peer_server(tmp_path: Path, credentials: PeerCredentials) -> Iterator[int]:
    """A's peer server on loopback holding a copy of A's step 7 (A_SECRET
    in it), pushed by A's own client; yields its port."""
    area = PartnerArea(tmp_path / "partner", writers=1, keep=2)
    server = PeerServer(("127.0.0.1", 0), area, credentials)
    server.start()
    try:
        source = tmp_path / "capture"
        source.mkdir()
        (source / "model.bin").write_text(A_SECRET)
        tier = LocalTier(tmp_path / "node-a")
        tier.capture(source, 7, writer=0, writers=1)
        PeerClient(f"127.0.0.1:{server.port}", credentials).send_step(tier, 7, 0)
        assert area.steps(0) == [7]  # A's copy is there to be taken
        yield server.port
    finally:
        server.shutdown()
        server.server_close()


def post_review(port: int, path: str, review: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """An AdmissionReview posted to the webhook's port on loopback, trusting
    any certificate: its response and decoded patch ("" when refused at the
    connection)."""
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(f"https://127.0.0.1:{port}/{path}",
                                     json.dumps(review).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        answer = json.loads(urllib.request.urlopen(request, context=insecure,
                                                   timeout=10).read())["response"]
    except OSError:
        return {"allowed": False}, ""
    return answer, base64.b64decode(answer.get("patch") or "").decode()


def refused_policy(tenant: Tenant, name: str, body: dict[str, Any], field: str,
                   webhook_says: str) -> str:
    """B's policy `body`, refused naming `field`: recorded with what refused
    it and where the apiserver's audit log has the refusal."""
    made = tenant.create(body)
    refused_by = refuser(made.stderr, webhook_says) if made.returncode else ""
    logged = hostile_audit.written_refusal(tenant, "checkpointpolicies",
                                           body["metadata"]["name"], refused_by)
    hostile_record.record(name, refused_by, logged, 0)
    assert made.returncode != 0, f"accepted: {body['spec']}"
    assert field in made.stderr, made.stderr
    assert logged, f"{name}: the refusal is not in the apiserver's audit log"
    return made.stderr


def refused_publish(h: Harness, caplog: pytest.LogCaptureFixture, name: str,
                    target: Path, namespace: str, pod: str, **kwargs: Any) -> grpc.RpcError:
    """A NodePublishVolume the driver refuses, recorded with its code and log line."""
    with caplog.at_level(logging.WARNING, logger="ckptdrain.csi.services"):
        caplog.clear()
        err = refused(h.publish, target, namespace, pod, **kwargs)
    logged = any("NodePublishVolume refused" in r.getMessage() for r in caplog.records)
    hostile_record.record(name, f"CSI driver: {err.code().name}",
                          hostile_record.DRIVER_LOG if logged else "", leaked_files(target))
    assert logged and leaked_files(target) == 0, err.details()
    return err


def class_objects(default: str, loose: str) -> dict[str, Any]:
    """Two CheckpointClasses: `default` (the default one) with a {namespace}
    store prefix, and `loose`, any tenant may name, with no stores listed."""
    return {"apiVersion": "v1", "kind": "List", "items": [{
        "apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
        "metadata": {"name": default, "annotations": {"ckptdrain.io/is-default-class": "true"}},
        "spec": {"nodeTier": {"root": CLASS_ROOT}, "stores": [
            {"uriPrefix": "s3://ckpt-bucket/{namespace}",
             "endpoint": "http://minio.storage:9000"}]}}, {
        "apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
        "metadata": {"name": loose}, "spec": {"nodeTier": {"root": CLASS_ROOT}}}]}
