"""Tenant B, with its own namespace, ServiceAccount token, policies and pods, tries each path
to tenant A's data against the real apiserver, the real operator and its webhooks, and the
real CSI node driver (its policy lookup as the driver's own ServiceAccount), and the real peer
server. Each attempt is recorded in the ledger (hostile_record.py) with what refused it, where
that can be read, and what of A's reached B: the last test prints the table docs/security.md
shows and asserts that each attempt of the tests that ran met what hostile_record.EXPECTED
says, and that none but the open ones (hostile_record.OPEN) leaked anything."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import hostile_audit
import hostile_peers
import hostile_record as ledger
import hostile_store
import hostile_subresources
import pytest
from cluster_helpers import CLASSES, INJECT, POLICIES, admission_answers, create, policy, wait_for
from cluster_helpers import pod as pod_of
from hostile_tenants import (
    A_SECRET,
    CLASS_ROOT,
    Tenant,
    class_objects,
    forged_review,
    leaked_files,
    operator_log_lines,
    post_review,
    publish_as_a,
    refused_policy,
    refused_publish,
    refuser,
    secret_refs,
)
from kubernetes import client
from operator_process import ALLOWED_ROOT, WEBHOOK_NAME, OperatorProcess

from ckptdrain.csi.policies import apiserver_resolver
from ckptdrain.operator.admission.rules import MUTATE_ID
from support import audit_log
from support.apiserver import Cluster
from support.csi_driver import AS_ROOT_ON_LINUX, Harness, new_pod_uid, refused, running_driver


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

NESTS = "spec.localTier.path (node directories nest)"


@ledger.makes(ledger.LOCAL_OUTSIDE, ledger.LOCAL_CLIMB, ledger.LOCAL_A_DIR, ledger.LOCAL_ROOT)
def test_local_paths_above_or_into_a_node_directory_are_refused(
        operator: OperatorProcess, namespace: str, tenant_b: Tenant) -> None:
    refused_policy(tenant_b, ledger.LOCAL_OUTSIDE, policy("root", localTier={"path": "/"}),
                   "spec.localTier.path", "spec.localTier.path (outside the allowed root)")
    # Written out, it is inside A's node directory (B's would nest in it).
    climbing = f"{ALLOWED_ROOT}/nvme/{tenant_b.namespace}/../{namespace}/ckpt"
    refused_policy(tenant_b, ledger.LOCAL_CLIMB, policy("climb", localTier={"path": climbing}),
                   "spec.localTier.path", "spec.localTier.path")
    # A's node directory itself: B's <path>/<B> would lie inside it.
    a_dir = f"{ALLOWED_ROOT}/nvme/{namespace}"
    made = tenant_b.create(policy("a-dir", localTier={"path": a_dir}))
    logged = wait_for(lambda: operator_log_lines(operator, f"policy {tenant_b.namespace}/a-dir "
                                                 "refused", f"{namespace}/ckpt") > 0,
                      what="the operator's log of the refusal") if made.returncode else False
    refused_by = refuser(made.stderr, NESTS) if made.returncode else ""
    ledger.record(ledger.LOCAL_A_DIR, refused_by, ledger.logged_in(
        ledger.OPERATOR_LOG if logged else "",
        hostile_audit.written_refusal(tenant_b, "checkpointpolicies", "a-dir", refused_by)), 0)
    assert made.returncode != 0 and "another namespace's node directory" in made.stderr, \
        made.stderr
    # The allowed root, above A's node directory: B's own is <root>/<B>,
    # beside A's <root>/nvme/<A>, and B's pods are given that, not A's.
    above = tenant_b.create(policy("above", localTier={"path": ALLOWED_ROOT}))
    assert above.returncode == 0, above.stderr
    made = tenant_b.kubectl("create", "-n", tenant_b.namespace, "-f", "-", "-o", "json",
                            body=pod_of("above-0", {"app": "above", **INJECT}))
    assert made.returncode == 0, made.stderr
    paths = [v["hostPath"]["path"] for v in json.loads(made.stdout)["spec"].get("volumes", [])
             if "hostPath" in v]
    assert paths == [f"{ALLOWED_ROOT}/{tenant_b.namespace}/above"], paths
    ledger.record(ledger.LOCAL_ROOT, "", ledger.ADMITTED, 0)


@ledger.makes(ledger.LOCAL_NESTED)
def test_a_local_path_nesting_with_as_node_directory_is_refused(
        cluster: Cluster, operator: OperatorProcess, namespace: str, tenant_b: Tenant) -> None:
    """hostPath mode (the session operator's): A's node directory is
    <allowed root>/nvme/<A's namespace>; B asks for its own inside it. Stored
    past the policy webhook (its configuration deleted, as an outage or a
    policy older than the rule lets one in), B's pods are refused too."""
    inside = f"{ALLOWED_ROOT}/nvme/{namespace}/ckpt"
    nest = policy("nest", localTier={"path": inside})
    made = tenant_b.create(nest)
    message = made.stderr
    assert made.returncode != 0, made.stdout
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
    cluster.kubectl("delete", "validatingwebhookconfiguration", WEBHOOK_NAME, "--ignore-not-found")
    try:
        admission_answers(tenant_b.kubectl, tenant_b.namespace, nest, admitted=True)
        stored = tenant_b.create(nest)
        assert stored.returncode == 0, stored.stderr
    finally:
        # The operator registers its webhooks again when it starts.
        operator.stop()
        operator.start()
    pod = pod_of("nest-0", {"app": "nest", **INJECT}, terminationGracePeriodSeconds=600)
    admission_answers(tenant_b.kubectl, tenant_b.namespace, pod, admitted=False,
                      says="another namespace's node directory")
    # The refusal names A's policy in the operator's log; the probe logged one too.
    says = (f"pod of policy {tenant_b.namespace}/nest refused", f"{namespace}/ckpt")
    probed = operator_log_lines(operator, *says)
    made = tenant_b.kubectl("create", "-n", tenant_b.namespace, "-f", "-", "-o", "json", body=pod)
    assert made.returncode != 0, made.stdout[:500]
    assert "CheckpointPolicy nest spec.localTier.path" in made.stderr, made.stderr
    assert "another namespace's node directory" in made.stderr, made.stderr
    logged = wait_for(lambda: operator_log_lines(operator, *says) > probed,
                      what="the operator's log of the pod refusal")
    # Both denials, the policy's and the pod's, in the apiserver's audit log.
    audited = hostile_audit.written_refusal(tenant_b, "checkpointpolicies", "nest",
                                            refuser(message, NESTS)) and \
        hostile_audit.written_refusal(tenant_b, "pods", "nest-0", "pod admission")
    ledger.record(ledger.LOCAL_NESTED, refuser(message, NESTS) + "; pod admission, for a policy "
                  "stored past it", ledger.logged_in(ledger.OPERATOR_LOG if logged else "",
                                                     audited), 0)


@ledger.makes(ledger.WRITE_IN_A, ledger.READ_SECRETS, ledger.READ_CONFIGMAPS,
              ledger.READ_POLICIES, ledger.READ_CHECKPOINTS)
def test_b_cannot_write_or_read_in_as_namespace(cluster: Cluster, namespace: str,
                                                tenant_b: Tenant) -> None:
    written = tenant_b.create(policy("ckpt-b"), namespace=namespace)
    audited = hostile_audit.rbac_refused(tenant_b, "create", "checkpointpolicies", namespace)
    ledger.record(ledger.WRITE_IN_A, "" if written.returncode == 0 else "RBAC (apiserver)",
                  ledger.AUDIT_RBAC if audited else "", int(written.returncode == 0))
    assert written.returncode != 0 and "forbidden" in written.stderr and audited, written.stderr
    checkpoint = {"apiVersion": "ckptdrain.io/v1alpha1", "kind": "Checkpoint",
                  "metadata": {"name": "ckpt-step-7", "namespace": namespace},
                  "spec": {"policy": "ckpt", "step": 7, "writers": 1}}
    made = cluster.kubectl("create", "-f", "-", input=json.dumps(checkpoint), check=False)
    assert made.returncode == 0, made.stderr
    # Each of A's objects by its real name, and each kind listed.
    reads = (("secrets", "s3-creds", ledger.READ_SECRETS),
             ("configmaps", "settings", ledger.READ_CONFIGMAPS),
             (POLICIES, "ckpt", ledger.READ_POLICIES),
             ("checkpoints.ckptdrain.io", "ckpt-step-7", ledger.READ_CHECKPOINTS))
    for resource, object_name, name in reads:
        assert cluster.kubectl("get", resource, "-n", namespace, object_name).returncode == 0
        listed = tenant_b.kubectl("get", resource, "-n", namespace, "-o", "json")
        single = tenant_b.kubectl("get", resource, "-n", namespace, object_name, "-o", "json")
        leaked = sum(A_SECRET in r.stdout or r.returncode == 0 for r in (listed, single))
        refused_both = listed.returncode != 0 and single.returncode != 0
        plain = resource.split(".")[0]  # as the audit log names it
        audited = hostile_audit.rbac_refused(tenant_b, "list", plain, namespace) and \
            hostile_audit.rbac_refused(tenant_b, "get", plain, namespace, object_name)
        ledger.record(name, "RBAC (apiserver)" if refused_both else "",
                      ledger.AUDIT_RBAC if audited else "", leaked)
        assert leaked == 0 and refused_both, (listed.stdout, single.stdout)
        assert audited, f"B's refused reads of {plain} not in the apiserver's audit log"
        assert "forbidden" in listed.stderr and "forbidden" in single.stderr
        # The same token reads its own namespace: the refusal is about A's.
        own = tenant_b.kubectl("get", resource, "-n", tenant_b.namespace)
        assert own.returncode == 0, own.stderr
    # A's Secret and ConfigMap, written and read above: their values never in the audit log.
    assert not audit_log.holds(cluster.workdir, A_SECRET)


@ledger.makes(ledger.SECRET_OF_A)
def test_a_policy_cannot_name_as_secret(cluster: Cluster, namespace: str,
                                        tenant_b: Tenant) -> None:
    """The operator as a confused deputy: a reference to another namespace's
    Secret has no field to be written in. Sent past kubectl's check
    (fieldValidation=Ignore), the apiserver prunes it."""
    body = policy("deputy", storage={
        "uri": "s3://ckpt-bucket/runs", "endpoint": "http://minio.storage:9000",
        "credentialsSecretRef": {"name": "s3-creds", "namespace": namespace}})
    made = tenant_b.kubectl("create", "--validate=false", "-n", tenant_b.namespace, "-f", "-",
                            "-o", "json", body=body)
    assert made.returncode == 0, made.stderr
    stored = json.loads(made.stdout)["spec"]["storage"]["credentialsSecretRef"]

    def injected(index: list[int] = [0]) -> dict[str, Any] | None:  # noqa: B006 -- a counter
        index[0] += 1
        pod = tenant_b.kubectl("create", "-n", tenant_b.namespace, "-f", "-", "-o", "json",
                               body=pod_of(f"deputy-{index[0]}", {"app": "deputy", **INJECT}))
        assert pod.returncode == 0, pod.stderr
        body = json.loads(pod.stdout)
        return body if secret_refs(body) else None
    pod = wait_for(injected, what="a pod of B's policy injected")
    refs = secret_refs(pod)
    pruned = "namespace" not in stored
    ledger.record(ledger.SECRET_OF_A, "CRD schema: field does not exist (pruned)" if pruned
                  else "", ledger.ADMITTED, int(A_SECRET in json.dumps(pod)))
    assert stored["name"] == "s3-creds" and pruned, stored
    # A pod's secretKeyRef has no namespace: it is the pod's own, B's.
    assert pod["metadata"]["namespace"] == tenant_b.namespace
    assert {r["name"] for r in refs} == {"s3-creds"} and all(set(r) == {"name", "key"}
                                                             for r in refs), refs


@pytest.fixture
def namespace_classes(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """The default class, with a {namespace} store prefix, and another
    class any tenant may name, with no stores listed."""
    default, loose = (f"{what}-{uuid.uuid4().hex[:6]}" for what in ("tenants", "loose"))
    cluster.kubectl("apply", "-f", "-", input=json.dumps(class_objects(default, loose)))
    try:
        yield default, loose
    finally:
        cluster.kubectl("delete", CLASSES, default, loose, "--ignore-not-found")


@ledger.makes(ledger.PREFIX_OF_A, ledger.PREFIX_OTHER_CLASS, ledger.ENDPOINT)
def test_store_prefixes_and_endpoints_the_platform_did_not_give_are_refused(
        namespace: str, tenant_b: Tenant, namespace_classes: tuple[str, str]) -> None:
    default, loose = namespace_classes

    def under(name: str, prefix: str, **spec: Any) -> dict[str, Any]:
        return policy(name, localTier={"path": f"{CLASS_ROOT}/{name}"},
                      storage={"uri": f"s3://ckpt-bucket/{prefix}/runs",
                               "endpoint": "http://minio.storage:9000",
                               "credentialsSecretRef": {"name": "s3-creds"}}, **spec)
    # B names no class: the default class's is written in, and judges the URI.
    message = refused_policy(tenant_b, ledger.PREFIX_OF_A, under("into-a", namespace),
                             "spec.storage.uri", "the default class's stores")
    assert f"CheckpointClass {default}" in message, message
    admitted = tenant_b.create(under("own-prefix", tenant_b.namespace))
    assert admitted.returncode == 0, admitted.stderr
    # B names another class, which lists no stores: nothing checks the prefix.
    other = tenant_b.create(under("other-class", namespace, checkpointClassName=loose))
    ledger.record(ledger.PREFIX_OTHER_CLASS, "" if other.returncode == 0 else
                  refuser(other.stderr, "the class's stores"), ledger.ADMITTED, 0)
    ledger.still_open(ledger.PREFIX_OTHER_CLASS, other.returncode != 0)
    # Ambient identity (no Secret): signed requests only to the listed hosts.
    redirected = policy("redirect", checkpointClassName=loose,
                        localTier={"path": f"{CLASS_ROOT}/redirect"},
                        storage={"uri": "s3://ckpt-bucket/runs",
                                 "endpoint": "https://collector.example"})
    message = refused_policy(tenant_b, ledger.ENDPOINT, redirected, "spec.storage.endpoint",
                             "CKPTDRAIN_AMBIENT_ENDPOINTS")
    assert "CKPTDRAIN_AMBIENT_ENDPOINTS" in message


test_bs_store_user_reaches_none_of_as_prefix = \
    hostile_store.test_bs_store_user_reaches_none_of_as_prefix


@pytest.fixture
def node(driver_api: client.CustomObjectsApi) -> Iterator[Harness]:
    with running_driver(apiserver_resolver(driver_api)) as h:
        yield h


@AS_ROOT_ON_LINUX
@ledger.makes(ledger.CSI_POLICY_OF_A, ledger.CSI_OWN_SAME_NAME, ledger.CSI_NAMESPACE_OF_A,
              ledger.CSI_FORGED_POD)
def test_csi_volumes_naming_as_policy_are_refused(
        cluster: Cluster, namespace: str, tenant_b: Tenant, node: Harness,
        caplog: pytest.LogCaptureFixture) -> None:
    publish_as_a(node, namespace)
    pod = new_pod_uid()
    err = refused_publish(node, caplog, ledger.CSI_POLICY_OF_A, node.target(pod),
                          tenant_b.namespace, pod, policy="ckpt")
    assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
    assert f"namespace '{tenant_b.namespace}'" in (err.details() or "")
    # B's own policy of A's policy's name: its own UID, its own empty directory.
    made = tenant_b.kubectl("create", "-n", tenant_b.namespace, "-f", "-", "-o", "json",
                            body=policy("ckpt"))
    assert made.returncode == 0, made.stderr
    b_uid = json.loads(made.stdout)["metadata"]["uid"]
    pod = new_pod_uid()
    target = node.target(pod)
    wait_for(lambda: node.publish(target, tenant_b.namespace, pod, policy="ckpt"),
             what="the driver to see B's policy")
    own = (node.cfg.root / tenant_b.namespace / b_uid).is_dir()
    empty = list(target.iterdir()) == []
    ledger.record(ledger.CSI_OWN_SAME_NAME, "CSI driver: B's policy UID, a directory of its own"
                  if own and empty else "", ledger.ADMITTED, leaked_files(target))
    node.unpublish(target, pod)
    assert own and empty
    pod = new_pod_uid()
    err = refused_publish(node, caplog, ledger.CSI_NAMESPACE_OF_A, node.target(pod),
                          tenant_b.namespace, pod, policy="ckpt", extra={"namespace": namespace})
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "'namespace'" in (err.details() or "")
    # The pod attributes say A's namespace and another pod's UID than the
    # target path's (B's pod): the UID ties the namespace to the pod.
    pod = new_pod_uid()
    err = refused_publish(node, caplog, ledger.CSI_FORGED_POD, node.target(pod),
                          namespace, new_pod_uid(), policy="ckpt")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "target_path" in (err.details() or "")


@AS_ROOT_ON_LINUX
@ledger.makes(ledger.CSI_RECREATED)
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
    ledger.record(ledger.CSI_RECREATED, f"CSI driver owner marker: {err.code().name}",
                  ledger.DRIVER_LOG if logged else "", leaked_files(target))
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


# The attempts through subresources, the peer server's, and the store's
# (hostile_subresources.py, hostile_peers.py, hostile_store.py): run here, in the ledger's order.
test_bs_exec_and_token_in_a_refused = hostile_subresources.test_bs_exec_and_token_in_a_refused
test_bs_peer_certificate_reads_none_of_as_copies = \
    hostile_peers.test_bs_peer_certificate_reads_none_of_as_copies
test_the_operator_hands_b_none_of_as_peer_objects = \
    hostile_peers.test_the_operator_hands_b_none_of_as_peer_objects


@ledger.makes(ledger.FORGED_REVIEW)
def test_open_a_review_forged_for_as_namespace(operator: OperatorProcess, namespace: str,
                                               tenant_b: Tenant) -> None:
    """B's pod, which can reach the webhook's Service as the apiserver does,
    sends the review itself (here to the webhook's port on loopback). B need
    not trust the webhook's certificate."""
    answer, patch = post_review(int(operator.env["CKPTDRAIN_WEBHOOK_PORT"]), MUTATE_ID,
                                forged_review(namespace))
    # A's settings, which B may not read through RBAC (READ_POLICIES): its
    # bucket and the name of its credentials Secret.
    leaked = int("ckpt-bucket" in patch or "s3-creds" in patch)
    refused = not answer.get("allowed") and not leaked
    ledger.record(ledger.FORGED_REVIEW, "the webhook server" if refused else "", "", leaked)
    assert A_SECRET not in patch  # the Secret's value is never in a patch
    ledger.still_open(ledger.FORGED_REVIEW, refused)
    assert leaked == 1, patch[:500]


def test_the_ledger_lists_every_attempt_and_nothing_leaked() -> None:
    """Runs last. The attempts of the tests that ran are all recorded, each
    as hostile_record.EXPECTED says; a skipped test's are "not run" in the
    table, never a failure, and a run with none is a skip, not a pass."""
    marked = [n for name, t in globals().items() if name.startswith("test_")
              for n in getattr(t, "makes", ())]
    assert sorted(marked) == sorted(ledger.ATTEMPTS), "each attempt is made by exactly one test"
    if not ledger.RAN:
        pytest.skip("no test of the suite ran")
    text = ledger.write_table(ledger.rows_of_run())
    print("\n" + text)
    assert ledger.problems() == [], text
