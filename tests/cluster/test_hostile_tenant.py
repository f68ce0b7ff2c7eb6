"""Tenant B, with its own namespace, ServiceAccount token, policies and
pods, tries each path to tenant A's data against the real apiserver, the
real operator and its webhooks, and the real CSI node driver (its policy
lookup as the driver's own ServiceAccount), and the real peer server.
Each attempt is recorded in the ledger (hostile_record.py) with what
refused it, where that can be read, and what of A's reached B: the last
test prints the table docs/security.md shows and asserts that every
attempt but the open ones (hostile_record.OPEN) was refused, logged, and
leaked nothing."""

from __future__ import annotations

import base64
import json
import logging
import ssl
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import hostile_record as attempts_of
import pytest
from cluster_helpers import INJECT, POLICIES, create, policy, wait_for
from cluster_helpers import pod as pod_of
from hostile_record import ATTEMPTS, OPEN, Attempt, write_table
from hostile_tenants import Tenant, forged_review, peer_credentials
from kubernetes import client
from operator_process import ALLOWED_ROOT, WEBHOOK_NAME, OperatorProcess

from ckptdrain.csi.policies import apiserver_resolver
from ckptdrain.node.localtier import LocalTier
from ckptdrain.operator.admission.rules import MUTATE_ID
from ckptdrain.peer.area import PartnerArea
from ckptdrain.peer.client import PeerClient, PeerUnavailable
from ckptdrain.peer.server import PeerServer
from support.apiserver import Cluster
from support.csi_driver import AS_ROOT_ON_LINUX, Harness, new_pod_uid, refused, running_driver

#: What tenant A keeps; any copy of it on B's side is a leak.
A_SECRET = f"tenant-a-{uuid.uuid4().hex}"
LEDGER: list[Attempt] = []
CLASSES = "checkpointclasses.ckptdrain.io"
CLASS_ROOT = "/mnt/class-nvme"
ADMISSION_LOG = "the refusal the apiserver returns to B (the apiserver's audit log on a cluster)"
RBAC_LOG = "403 returned to B (the apiserver's audit log on a cluster)"
DRIVER_LOG = "CSI driver log; kubelet's FailedMount event on B's pod (on a cluster)"


def record(name: str, refused_by: str, logged: str, leaked: int) -> None:
    assert name in ATTEMPTS, name
    LEDGER.append(Attempt(name, refused_by, logged, leaked))


@pytest.fixture
def tenant_b(cluster: Cluster, operator: OperatorProcess, namespace: str) -> Iterator[Tenant]:
    """Tenant B beside tenant A (the `namespace` fixture), A holding a Secret,
    a ConfigMap and a policy `ckpt`."""
    name = f"b-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("create", "secret", "generic", "s3-creds", "-n", namespace,
                    f"--from-literal=AWS_SECRET_ACCESS_KEY={A_SECRET}")
    cluster.kubectl("create", "configmap", "settings", "-n", namespace,
                    f"--from-literal=token={A_SECRET}")
    made = create(cluster, namespace, policy("ckpt"))
    assert made.returncode == 0, made.stderr
    try:
        yield Tenant(cluster, name)
    finally:
        cluster.kubectl("delete", "-n", name, f"pods,secrets,{POLICIES}", "--all",
                        "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def refused_policy(tenant: Tenant, name: str, body: dict[str, Any], field: str,
                   refused_by: str) -> str:
    made = tenant.create(body)
    stored = made.returncode == 0
    record(name, "" if stored else refused_by, ADMISSION_LOG, 0)
    assert not stored, f"accepted: {body['spec']}"
    assert field in made.stderr, made.stderr
    return made.stderr


def test_local_paths_above_or_into_a_node_directory_are_refused(
        namespace: str, tenant_b: Tenant) -> None:
    refused_policy(tenant_b, attempts_of.LOCAL_ROOT, policy("root", localTier={"path": "/"}),
                   "spec.localTier.path", "policy admission: spec.localTier.path")
    # Written out, it is A's node directory (then B's would nest in it).
    climbing = f"{ALLOWED_ROOT}/nvme/{tenant_b.namespace}/../{namespace}/ckpt"
    refused_policy(tenant_b, attempts_of.LOCAL_CLIMB, policy("climb", localTier={"path": climbing}),
                   "spec.localTier.path", "policy admission: spec.localTier.path")
    # The same tenant's policy under the root is admitted: the token is not the refusal.
    admitted = tenant_b.create(policy("own"))
    assert admitted.returncode == 0, admitted.stderr


def still_open(name: str, refused: bool) -> None:
    """An attempt OPEN lists is still not refused; once it is, the list and
    docs/security.md must say so."""
    assert not refused, f"{name!r} is refused now: take it out of OPEN and docs/security.md"


def test_a_local_path_nesting_with_as_node_directory_is_refused(
        cluster: Cluster, operator: OperatorProcess, namespace: str, tenant_b: Tenant) -> None:
    """hostPath mode (the session operator's): A's node directory is
    <allowed root>/nvme/<A's namespace>; B asks for its own inside it. Stored
    past the policy webhook (its configuration deleted, as an outage or a
    policy older than the rule lets one in), B's pods are refused too."""
    inside = f"{ALLOWED_ROOT}/nvme/{namespace}/ckpt"
    nest = policy("nest", localTier={"path": inside})
    message = refused_policy(tenant_b, attempts_of.LOCAL_NESTED, nest, "spec.localTier.path",
                             "policy admission: spec.localTier.path; pod admission, for a "
                             "policy stored past it")
    assert "another namespace's node directory" in message, message
    assert f"{inside}/{tenant_b.namespace}" in message, message  # B's own directory
    # A's namespace is said only as B wrote it in its path; A's policy is not named.
    assert "CheckpointPolicy ckpt" not in message, message
    # Around A's too: A keeps a policy under a directory named like B's
    # namespace, and B's own directory would hold it (and A's data).
    deep = create(cluster, namespace, policy(
        "deep", localTier={"path": f"{ALLOWED_ROOT}/scratch/{tenant_b.namespace}/deep"}))
    assert deep.returncode == 0, deep.stderr
    around = tenant_b.create(policy("around", localTier={"path": f"{ALLOWED_ROOT}/scratch"}))
    assert around.returncode != 0 and "another namespace's node directory" in around.stderr, \
        around.stderr
    cluster.kubectl("delete", "validatingwebhookconfiguration", WEBHOOK_NAME,
                    "--ignore-not-found")
    try:
        stored = tenant_b.create(nest)
        assert stored.returncode == 0, stored.stderr
    finally:
        # The operator registers its webhooks again when it starts.
        operator.stop()
        operator.start()
    made = tenant_b.kubectl("create", "-n", tenant_b.namespace, "-f", "-", "-o", "json",
                            body=pod_of("nest-0", {"app": "nest", **INJECT},
                                        terminationGracePeriodSeconds=600))
    assert made.returncode != 0, made.stdout[:500]
    assert "CheckpointPolicy nest spec.localTier.path" in made.stderr, made.stderr
    assert "another namespace's node directory" in made.stderr, made.stderr


def test_b_cannot_write_or_read_in_as_namespace(cluster: Cluster, namespace: str,
                                                tenant_b: Tenant) -> None:
    written = tenant_b.create(policy("ckpt-b"), namespace=namespace)
    record(attempts_of.WRITE_IN_A, "" if written.returncode == 0 else "RBAC (apiserver)", RBAC_LOG,
           int(written.returncode == 0))
    assert written.returncode != 0 and "forbidden" in written.stderr, written.stderr
    reads = (("secrets", attempts_of.READ_SECRETS),
             ("configmaps", attempts_of.READ_CONFIGMAPS),
             (POLICIES, attempts_of.READ_POLICIES),
             ("checkpoints.ckptdrain.io", attempts_of.READ_CHECKPOINTS))
    for resource, name in reads:
        listed = tenant_b.kubectl("get", resource, "-n", namespace, "-o", "json")
        single = tenant_b.kubectl("get", resource, "-n", namespace, "s3-creds", "-o", "json")
        leaked = sum(A_SECRET in r.stdout or r.returncode == 0 for r in (listed, single))
        refused_both = listed.returncode != 0 and single.returncode != 0
        record(name, "RBAC (apiserver)" if refused_both else "", RBAC_LOG, leaked)
        assert leaked == 0 and refused_both, (listed.stdout, single.stdout)
        assert "forbidden" in listed.stderr and "forbidden" in single.stderr
        # The same token reads its own namespace: the refusal is about A's.
        own = tenant_b.kubectl("get", resource, "-n", tenant_b.namespace)
        assert own.returncode == 0, own.stderr


def test_a_policy_cannot_name_as_secret(cluster: Cluster, namespace: str,
                                        tenant_b: Tenant) -> None:
    """The operator as a confused deputy: a reference to another namespace's
    Secret has no field to be written in."""
    body = policy("deputy", storage={
        "uri": "s3://ckpt-bucket/runs", "endpoint": "http://minio.storage:9000",
        "credentialsSecretRef": {"name": "s3-creds", "namespace": namespace}})
    made = tenant_b.create(body)
    stored = made.returncode == 0
    record(attempts_of.SECRET_OF_A, "" if stored else "CRD schema (strict field validation)",
           ADMISSION_LOG, 0)
    assert not stored, made.stdout
    assert 'unknown field "spec.storage.credentialsSecretRef.namespace"' in made.stderr, \
        made.stderr


@pytest.fixture
def namespace_class(cluster: Cluster) -> Iterator[str]:
    name = f"tenants-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
        "metadata": {"name": name},
        "spec": {"nodeTier": {"root": CLASS_ROOT}, "stores": [
            {"uriPrefix": "s3://ckpt-bucket/{namespace}",
             "endpoint": "http://minio.storage:9000"}]}}))
    yield name
    cluster.kubectl("delete", CLASSES, name, "--ignore-not-found")


def test_store_prefixes_and_endpoints_the_platform_did_not_give_are_refused(
        namespace: str, tenant_b: Tenant, namespace_class: str) -> None:
    def classed(name: str, prefix: str) -> dict[str, Any]:
        return policy(name, checkpointClassName=namespace_class,
                      localTier={"path": f"{CLASS_ROOT}/{name}"},
                      storage={"uri": f"s3://ckpt-bucket/{prefix}/runs",
                               "endpoint": "http://minio.storage:9000",
                               "credentialsSecretRef": {"name": "s3-creds"}})
    message = refused_policy(tenant_b, attempts_of.PREFIX_OF_A, classed("into-a", namespace),
                             "spec.storage.uri", "policy admission: class stores")
    assert f"CheckpointClass {namespace_class}" in message
    admitted = tenant_b.create(classed("own-prefix", tenant_b.namespace))
    assert admitted.returncode == 0, admitted.stderr
    # Ambient identity (no Secret): signed requests only to the listed hosts.
    redirected = policy("redirect", storage={"uri": "s3://ckpt-bucket/runs",
                                             "endpoint": "https://collector.example"})
    message = refused_policy(tenant_b, attempts_of.ENDPOINT, redirected, "spec.storage.endpoint",
                             "policy admission: CKPTDRAIN_AMBIENT_ENDPOINTS")
    assert "CKPTDRAIN_AMBIENT_ENDPOINTS" in message


def leaked_files(target: Path) -> int:
    """Files under `target` holding A's bytes (0 when nothing is mounted there)."""
    if not target.exists():
        return 0
    return sum(1 for f in target.rglob("*") if f.is_file() and A_SECRET.encode() in
               f.read_bytes())


@pytest.fixture
def node(driver_api: client.CustomObjectsApi) -> Iterator[Harness]:
    with running_driver(apiserver_resolver(driver_api)) as h:
        yield h


def publish_as_a(h: Harness, namespace: str) -> None:
    pod = new_pod_uid()
    target = h.target(pod)
    h.publish(target, namespace, pod)
    (target / "step-1.bin").write_text(A_SECRET)
    h.unpublish(target, pod)


@AS_ROOT_ON_LINUX
def test_csi_volumes_naming_as_policy_are_refused(
        namespace: str, tenant_b: Tenant, node: Harness,
        caplog: pytest.LogCaptureFixture) -> None:
    publish_as_a(node, namespace)
    attempts = ((attempts_of.CSI_POLICY_OF_A, {}, grpc.StatusCode.NOT_FOUND,
                 f"namespace '{tenant_b.namespace}'"),
                (attempts_of.CSI_NAMESPACE_OF_A, {"namespace": namespace},
                 grpc.StatusCode.INVALID_ARGUMENT, "'namespace'"))
    for name, extra, code, says in attempts:
        pod = new_pod_uid()
        target = node.target(pod)
        with caplog.at_level(logging.WARNING, logger="ckptdrain.csi.services"):
            caplog.clear()
            err = refused(node.publish, target, tenant_b.namespace, pod, policy="ckpt",
                          extra=extra)
        logged = any("NodePublishVolume refused" in r.getMessage() for r in caplog.records)
        record(name, f"CSI driver: {err.code().name}", DRIVER_LOG if logged else "",
               leaked_files(target))
        assert (err.code(), logged, leaked_files(target)) == (code, True, 0), err.details()
        assert says in (err.details() or "")
    assert not (node.cfg.root / tenant_b.namespace).exists()


@AS_ROOT_ON_LINUX
def test_a_recreated_policy_is_not_handed_the_old_uids_data(
        cluster: Cluster, namespace: str, tenant_b: Tenant, node: Harness,
        caplog: pytest.LogCaptureFixture) -> None:
    old = json.loads(cluster.kubectl("get", "-n", namespace, POLICIES, "ckpt", "-o",
                                     "json").stdout)["metadata"]["uid"]
    publish_as_a(node, namespace)
    cluster.kubectl("delete", "-n", namespace, POLICIES, "ckpt")
    again = create(cluster, namespace, policy("ckpt"))
    new = json.loads(again.stdout)["metadata"]["uid"]
    assert new != old
    # The old run's data where the new UID's would be (a copy, a restore by
    # hand, a planted directory): its owner marker names the old UID.
    (node.cfg.root / namespace / old).rename(node.cfg.root / namespace / new)
    pod = new_pod_uid()
    target = node.target(pod)
    with caplog.at_level(logging.WARNING, logger="ckptdrain.csi"):
        err = refused(node.publish, target, namespace, pod)
    logged = any("names policy uid" in r.getMessage() for r in caplog.records)
    record(attempts_of.CSI_RECREATED, f"CSI driver owner marker: {err.code().name}",
           "CSI driver log (owner.json names another owner)" if logged else "",
           leaked_files(target))
    assert (err.code(), logged, leaked_files(target)) == (
        grpc.StatusCode.PERMISSION_DENIED, True, 0), err.details()
    assert "names another owner" in (err.details() or "")
    # Without the planted directory the new UID starts empty: nothing of the old run.
    (node.cfg.root / namespace / new).rename(node.cfg.root / namespace / f"planted-{old}")
    pod = new_pod_uid()
    target = node.target(pod)
    node.publish(target, namespace, pod)
    assert list(target.iterdir()) == [] and leaked_files(target) == 0
    node.unpublish(target, pod)


def test_bs_peer_certificate_reads_none_of_as_copies(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The peer server and client in-process over real TLS on loopback
    (tests/integration/test_peer_wire.py); each policy has a CA of its own."""
    a_creds, b_creds = (peer_credentials(tmp_path / who, f"team-{who}/ckpt") for who in "ab")
    area = PartnerArea(tmp_path / "partner", writers=1, keep=2)
    server = PeerServer(("127.0.0.1", 0), area, a_creds)
    server.start()
    try:
        source = tmp_path / "capture"
        source.mkdir()
        (source / "model.bin").write_text(A_SECRET)
        tier = LocalTier(tmp_path / "node-a")
        tier.capture(source, 7, writer=0, writers=1)
        PeerClient(f"127.0.0.1:{server.port}", a_creds).send_step(tier, 7, 0)
        assert area.steps(0) == [7]  # A's copy is there to be taken
        with caplog.at_level(logging.WARNING, logger="ckptdrain.peer.server"):
            try:
                seen = PeerClient(f"127.0.0.1:{server.port}", b_creds).steps(0)
            except (PeerUnavailable, ssl.SSLError, ConnectionError):
                seen = None
            logged = wait_for(lambda: any(
                "peer connection from" in r.getMessage() and "refused" in r.getMessage()
                for r in caplog.records), what="the server's log of the refusal")
    finally:
        server.shutdown()
        server.server_close()
    record(attempts_of.PEER_CERT, "peer server: mutual TLS, the policy's own CA"
           if seen is None else "", "peer server log" if logged else "", len(seen or []))
    assert seen is None


def test_open_a_review_forged_for_as_namespace(operator: OperatorProcess, namespace: str,
                                               tenant_b: Tenant) -> None:
    """B's pod, which can reach the webhook's Service as the apiserver does,
    sends the review itself (here to the webhook's port on loopback). B need
    not trust the webhook's certificate."""
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    port = operator.env["CKPTDRAIN_WEBHOOK_PORT"]
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/{MUTATE_ID}", json.dumps(forged_review(namespace)).encode(),
        headers={"Content-Type": "application/json"})
    try:
        answer = json.loads(urllib.request.urlopen(request, context=insecure,
                                                   timeout=10).read())["response"]
        patch = base64.b64decode(answer.get("patch") or "").decode()
    except OSError:  # refused at the connection
        answer, patch = {"allowed": False}, ""
    # A's settings, which B may not read through RBAC (READ_POLICIES): its
    # bucket and the name of its credentials Secret.
    leaked = int("ckpt-bucket" in patch or "s3-creds" in patch)
    refused = not answer.get("allowed") and not leaked
    record(attempts_of.FORGED_REVIEW, "the webhook server" if refused else "",
           "" if not refused else "the webhook server's log", leaked)
    assert A_SECRET not in patch  # the Secret's value is never in a patch
    still_open(attempts_of.FORGED_REVIEW, refused)
    assert leaked == 1, patch[:500]


def test_the_ledger_lists_every_attempt_and_nothing_leaked() -> None:
    text = write_table(LEDGER)
    print("\n" + text)
    assert [a.name for a in LEDGER] == list(ATTEMPTS), text
    closed = [a for a in LEDGER if a.name not in OPEN]
    assert all(a.refused_by and a.logged for a in closed), text
    assert sum(a.leaked for a in closed) == 0, text
