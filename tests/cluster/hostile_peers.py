"""Tenant B towards tenant A's peer tier, for the hostile-tenant suite
(test_hostile_tenant.py runs these tests in the ledger's order): A's peer
server, with B's certificates; and the operator, with B's token and B's
policies, as a deputy for A's peer-tier ConfigMap and Secrets."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hostile_audit
import hostile_record as ledger
import pytest
from cluster_helpers import INJECT, POLICIES, create, policy, wait_for
from cluster_helpers import pod as pod_of
from hostile_tenants import A_SECRET, Tenant, a_peer_server, peer_credentials, raw_peer_get
from operator_process import OperatorProcess

from ckptdrain.contract.api import ANNOTATION_INJECTED
from ckptdrain.operator.policy.peer_tier import (
    PEER_PORT,
    PEERS_KEY,
    peer_secret_name,
    peers_configmap_name,
)
from ckptdrain.peer import protocol
from support.apiserver import Cluster

#: The names the operator gives a policy `ckpt`'s peer objects, in its namespace.
SECRET, CONFIGMAP = peer_secret_name("ckpt"), peers_configmap_name("ckpt")
#: The IPs the kubelet would give A's writer (then again, after a restart) and B's.
A_IP, A_NEW_IP, B_IP = "10.9.0.1", "10.9.0.2", "10.9.1.1"


@ledger.makes(ledger.PEER_CERT, ledger.PEER_FORGED_ID)
def test_bs_peer_certificate_reads_none_of_as_copies(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The peer server in-process over real TLS on loopback
    (tests/integration/test_peer_wire.py); each policy has a CA of its own.
    B's client trusts any server certificate, so the refusal is the server's."""
    a_creds = peer_credentials(tmp_path / "a", "team-a/ckpt")
    b_dirs = {ledger.PEER_CERT: (tmp_path / "b", "team-b/ckpt"),
              # B's own CA, issuing a certificate that names A's policy.
              ledger.PEER_FORGED_ID: (tmp_path / "b-forged", "team-a/ckpt")}
    with a_peer_server(tmp_path, a_creds) as port:
        for name, (directory, policy_id) in b_dirs.items():
            peer_credentials(directory, policy_id)
            with caplog.at_level(logging.WARNING, logger="ckptdrain.peer.server"):
                caplog.clear()
                answer = raw_peer_get(port, directory, protocol.target_path(0))
                logged = wait_for(lambda: any(
                    "refused" in r.getMessage() and "CERTIFICATE_VERIFY_FAILED" in r.getMessage()
                    for r in caplog.records), what="the server's log of its own refusal")
            leaked = int(answer is not None and (b'"steps"' in answer
                                                 or A_SECRET.encode() in answer))
            ledger.record(name, "peer server: mutual TLS, the policy's own CA" if answer is None
                          else "", ledger.PEER_LOG if logged else "", leaked)
            assert answer is None and leaked == 0, answer


def peer_objects(cluster: Cluster, ca_namespace: str, namespace: str) -> dict[str, Any]:
    """The peer tier's objects of a policy `ckpt` in `namespace` (its pods'
    Secret, its peers ConfigMap, its CA in the operator's namespace), each
    as (resourceVersion, data); None for one not there."""
    def found(ns: str, kind: str, name: str) -> tuple[str, dict[str, str]] | None:
        out = cluster.kubectl("get", "-n", ns, kind, name, "-o", "json", check=False)
        if out.returncode:
            return None
        body = json.loads(out.stdout)
        return body["metadata"]["resourceVersion"], body.get("data") or {}
    secret = found(namespace, "secret", SECRET)
    uid = json.loads(cluster.kubectl("get", "-n", namespace, POLICIES, "ckpt", "-o",
                                     "json").stdout)["metadata"]["uid"]
    return {"secret": secret, "configmap": found(namespace, "configmap", CONFIGMAP),
            "ca": found(ca_namespace, "secret", f"ckptdrain-peer-ca-{uid}"), "uid": uid}


def owner_uids(cluster: Cluster, namespace: str, kind: str, name: str) -> list[str]:
    """The UIDs an object's ownerReferences name (what the garbage collector
    deletes it with)."""
    meta = json.loads(cluster.kubectl("get", "-n", namespace, kind, name, "-o",
                                      "json").stdout)["metadata"]
    return [o["uid"] for o in meta.get("ownerReferences") or []]


def peers_listed(cluster: Cluster, namespace: str) -> list[str]:
    """The addresses of the writers a policy `ckpt`'s peers ConfigMap lists
    ([] when none is there): where the policy's agents send their copies."""
    out = cluster.kubectl("get", "-n", namespace, "configmap", CONFIGMAP, "-o", "json",
                          check=False)
    data = json.loads(out.stdout).get("data", {}) if out.returncode == 0 else {}
    writers = json.loads(data.get(PEERS_KEY, "{}")).get("writers") or {}
    return sorted(w["address"] for w in writers.values() if w.get("address"))


def give_ip(cluster: Cluster, namespace: str, ip: str) -> None:
    """The pod `w-0` in `namespace` given `ip`, as the kubelet would (none runs here)."""
    cluster.kubectl("patch", "-n", namespace, "pod", "w-0", "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"podIP": ip}}))


@ledger.makes(ledger.PEER_SAME_NAME, ledger.PEER_NAMED, ledger.PEER_POD, ledger.PEER_READ)
def test_the_operator_hands_b_none_of_as_peer_objects(
        cluster: Cluster, operator: OperatorProcess, namespace: str, tenant_b: Tenant) -> None:
    """A's policy `ckpt` with the peer tier on and a running writer; B's
    policies and pods ask the operator for A's peer Secret, ConfigMap and
    pairing: by the same policy name, by naming them, by a running writer.
    The operator writes only in a policy's own namespace, keeps its CA by
    the policy's UID, which B cannot choose, and pairs pods within their
    own namespace's policy."""
    ca_namespace = operator.env["CKPTDRAIN_PEER_CA_NAMESPACE"]
    cluster.kubectl("patch", "-n", namespace, POLICIES, "ckpt", "--type=merge", "-p",
                    json.dumps({"spec": {"peerTier": {"enabled": True}}}))
    wait_for(lambda: (o := peer_objects(cluster, ca_namespace, namespace))["secret"]
             and o["ca"], what="A's peer Secret and CA")
    made = create(cluster, namespace, pod_of("w-0", {"app": "ckpt", **INJECT},
                                             nodeName="node-a"))
    assert made.returncode == 0, made.stderr
    assert ANNOTATION_INJECTED in json.loads(made.stdout)["metadata"]["annotations"]
    give_ip(cluster, namespace, A_IP)
    wait_for(lambda: peers_listed(cluster, namespace) == [f"{A_IP}:{PEER_PORT}"],
             what="A's writer in A's peers ConfigMap")
    a_before = peer_objects(cluster, ca_namespace, namespace)

    def a_changed(*kept: str) -> int:
        """How many of A's peer objects differ from before (`kept`: those
        not compared)."""
        now = peer_objects(cluster, ca_namespace, namespace)
        return sum(now[k] != a_before[k] for k in ("secret", "configmap", "ca", "uid")
                   if k not in kept)
    made = tenant_b.create(policy("ckpt", peerTier={"enabled": True}))
    assert made.returncode == 0, made.stderr
    b = wait_for(lambda: (o := peer_objects(cluster, ca_namespace, tenant_b.namespace))
                 ["secret"] and o["ca"] and o, what="B's peer Secret and CA")
    # B's pods' Secret is B's policy's (it goes with it) and holds the CA kept
    # under B's policy UID, not A's CA.
    b_ca = b["secret"][1]["ca.crt"]
    owners = owner_uids(cluster, tenant_b.namespace, "secret", SECRET)
    own = owners == [b["uid"]] and b_ca == b["ca"][1]["ca.crt"]
    changed = a_changed()
    leaked = int(b_ca == a_before["ca"][1]["ca.crt"]) + changed
    ledger.record(ledger.PEER_SAME_NAME, ledger.EXPECTED[ledger.PEER_SAME_NAME][0] if own
                  else "", ledger.ADMITTED, leaked)
    assert own and leaked == 0, (owners, b["uid"], changed)
    # Naming A's objects and namespace: no such fields (sent past kubectl's check).
    named = policy("named", peerTier={"enabled": True, "secretName": SECRET,
                                      "configMapName": CONFIGMAP, "namespace": namespace})
    made = tenant_b.kubectl("create", "--validate=false", "-n", tenant_b.namespace, "-f", "-",
                            "-o", "json", body=named)
    assert made.returncode == 0, made.stderr
    pruned = set(json.loads(made.stdout)["spec"]["peerTier"]) <= {"enabled", "keep"}
    wait_for(lambda: cluster.kubectl("get", "-n", tenant_b.namespace, "secret",
                                     peer_secret_name("named"), check=False).returncode == 0,
             what="the peer Secret of B's `named`, in B's namespace")
    changed = a_changed()
    ledger.record(ledger.PEER_NAMED, ledger.EXPECTED[ledger.PEER_NAMED][0] if pruned else "",
                  ledger.ADMITTED, changed)
    assert pruned and not changed, made.stdout[:500]
    # A writer of B's `ckpt` on another node, newer than A's: a rank two pods
    # hold goes to the newer (peers/placement.members), so a pass that took
    # B's writer for one of A's policy would list B's address, not A's.
    made = tenant_b.create(pod_of("w-0", {"app": "ckpt", **INJECT}, nodeName="node-b"))
    assert made.returncode == 0, made.stderr
    give_ip(cluster, tenant_b.namespace, B_IP)
    paired = wait_for(lambda: peers_listed(cluster, tenant_b.namespace),
                      what="B's writer in B's peers ConfigMap")
    # A pass of A's policy now, with B's writer in the operator's pod index:
    # A's writer's sandbox comes back with a new IP (as after a node
    # restart), which A's pass must publish. Only a pass that ran after B's
    # writer can show whether it was paired into A's list.
    give_ip(cluster, namespace, A_NEW_IP)
    in_a = wait_for(lambda: (listed := peers_listed(cluster, namespace))
                    != [f"{A_IP}:{PEER_PORT}"] and listed, what="a new pass of A's peers")
    own = paired == [f"{B_IP}:{PEER_PORT}"] and in_a == [f"{A_NEW_IP}:{PEER_PORT}"]
    changed = a_changed("configmap")  # A's list changed by A's own writer
    leaked = int(f"{B_IP}:" in json.dumps(in_a)) + changed
    ledger.record(ledger.PEER_POD, ledger.EXPECTED[ledger.PEER_POD][0] if own else "",
                  ledger.ADMITTED, leaked)
    # No kubelet confirms a deletion here: the pods go by force.
    for ns in (tenant_b.namespace, namespace):
        cluster.kubectl("delete", "-n", ns, "pod", "w-0", "--force", "--grace-period=0")
    assert own and leaked == 0, (paired, in_a, changed)
    # B's token on A's peer Secret (A's namespace) and A's CA (the operator's).
    reads = [tenant_b.kubectl("get", "secret", "-n", ns, name, "-o", "json") for ns, name in
             ((namespace, SECRET), (ca_namespace, f"ckptdrain-peer-ca-{a_before['uid']}"))]
    refused = all(r.returncode != 0 and "forbidden" in r.stderr for r in reads)
    audited = hostile_audit.rbac_refused(tenant_b, "get", "secrets", namespace, SECRET) and \
        hostile_audit.rbac_refused(tenant_b, "get", "secrets", ca_namespace,
                                   f"ckptdrain-peer-ca-{a_before['uid']}")
    ledger.record(ledger.PEER_READ, "RBAC (apiserver)" if refused else "",
                  ledger.AUDIT_RBAC if audited else "", sum(r.returncode == 0 for r in reads))
    assert refused, [r.stderr for r in reads]
    assert audited, "B's refused reads of A's peer Secret and CA not in the apiserver's audit log"
