"""Tenant B towards tenant A's peer tier, for the hostile-tenant suite
(test_hostile_tenant.py runs these tests in the ledger's order): A's peer
server, with B's certificates; and the operator, with B's token and B's
policies, as a deputy for A's peer-tier ConfigMap and Secrets."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hostile_record as ledger
import pytest
from cluster_helpers import INJECT, POLICIES, policy, wait_for
from cluster_helpers import pod as pod_of
from hostile_tenants import A_SECRET, Tenant, a_peer_server, peer_credentials, raw_peer_get
from operator_process import OperatorProcess

from ckptdrain.operator.policy.peer_tier import (
    PEERS_KEY,
    peer_secret_name,
    peers_configmap_name,
)
from ckptdrain.peer import protocol
from support.apiserver import Cluster

#: The names the operator gives a policy `ckpt`'s peer objects, in its namespace.
SECRET, CONFIGMAP = peer_secret_name("ckpt"), peers_configmap_name("ckpt")


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


def peers_listed(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """The writers a policy `ckpt`'s peers ConfigMap lists ({} when none is there)."""
    out = cluster.kubectl("get", "-n", namespace, "configmap", CONFIGMAP, "-o", "json",
                          check=False)
    data = json.loads(out.stdout).get("data", {}) if out.returncode == 0 else {}
    return dict(json.loads(data.get(PEERS_KEY, "{}")).get("writers") or {})


@ledger.makes(ledger.PEER_SAME_NAME, ledger.PEER_NAMED, ledger.PEER_POD, ledger.PEER_READ)
def test_the_operator_hands_b_none_of_as_peer_objects(
        cluster: Cluster, operator: OperatorProcess, namespace: str, tenant_b: Tenant) -> None:
    """A's policy `ckpt` with the peer tier on; B's policies and pods ask the
    operator for A's peer Secret, ConfigMap and pairing: by the same policy
    name, by naming them, by a running writer. The operator writes only in
    a policy's own namespace, keeps its CA by the policy's UID, which B
    cannot choose, and pairs pods within their own namespace's policy."""
    ca_namespace = operator.env["CKPTDRAIN_PEER_CA_NAMESPACE"]
    cluster.kubectl("patch", "-n", namespace, POLICIES, "ckpt", "--type=merge", "-p",
                    json.dumps({"spec": {"peerTier": {"enabled": True}}}))
    a_before = wait_for(lambda: (o := peer_objects(cluster, ca_namespace, namespace))
                        ["secret"] and o["ca"] and o, what="A's peer Secret and CA")

    def a_changed() -> int:
        return int(peer_objects(cluster, ca_namespace, namespace) != a_before)
    made = tenant_b.create(policy("ckpt", peerTier={"enabled": True}))
    assert made.returncode == 0, made.stderr
    b = wait_for(lambda: (o := peer_objects(cluster, ca_namespace, tenant_b.namespace))
                 ["secret"] and o["ca"] and o, what="B's peer Secret and CA")
    status = wait_for(lambda: json.loads(tenant_b.kubectl(
        "get", "-n", tenant_b.namespace, POLICIES, "ckpt", "-o", "json").stdout).get(
        "status", {}).get("peer", {}).get("secret"), what="B's status.peer.secret")
    b_ca = b["secret"][1]["ca.crt"]
    own = status == SECRET and b["uid"] != a_before["uid"] and b_ca == b["ca"][1]["ca.crt"]
    leaked = int(b_ca == a_before["ca"][1]["ca.crt"]) + a_changed()
    ledger.record(ledger.PEER_SAME_NAME, ledger.EXPECTED[ledger.PEER_SAME_NAME][0] if own
                  else "", ledger.ADMITTED, leaked)
    assert own and leaked == 0, status
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
    ledger.record(ledger.PEER_NAMED, ledger.EXPECTED[ledger.PEER_NAMED][0] if pruned else "",
                  ledger.ADMITTED, a_changed())
    assert pruned and not a_changed(), made.stdout[:500]
    # A writer of B's `ckpt`, running on a node with an IP (set as the kubelet would).
    made = tenant_b.create(pod_of("w-0", {"app": "ckpt", **INJECT}, nodeName="node-b"))
    assert made.returncode == 0, made.stderr
    cluster.kubectl("patch", "-n", tenant_b.namespace, "pod", "w-0", "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"podIP": "10.9.1.1"}}))
    paired = wait_for(lambda: peers_listed(cluster, tenant_b.namespace),
                      what="B's writer in B's peers ConfigMap")
    own = [w["address"] for w in paired.values()] == ["10.9.1.1:9109"]
    in_a = "10.9.1.1" in json.dumps(peers_listed(cluster, namespace))
    ledger.record(ledger.PEER_POD, ledger.EXPECTED[ledger.PEER_POD][0] if own and not in_a
                  else "", ledger.ADMITTED, int(in_a) + a_changed())
    # No kubelet confirms a deletion here: the pod goes by force.
    cluster.kubectl("delete", "-n", tenant_b.namespace, "pod", "w-0", "--force",
                    "--grace-period=0")
    assert own and not in_a and not a_changed(), paired
    # B's token on A's peer Secret (A's namespace) and A's CA (the operator's).
    reads = [tenant_b.kubectl("get", "secret", "-n", ns, name, "-o", "json") for ns, name in
             ((namespace, SECRET), (ca_namespace, f"ckptdrain-peer-ca-{a_before['uid']}"))]
    refused = all(r.returncode != 0 and "forbidden" in r.stderr for r in reads)
    ledger.record(ledger.PEER_READ, "RBAC (apiserver)" if refused else "", ledger.RBAC,
                  sum(r.returncode == 0 for r in reads))
    assert refused, [r.stderr for r in reads]
