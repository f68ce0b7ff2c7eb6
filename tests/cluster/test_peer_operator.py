"""The peer tier's operator side against a real apiserver: a policy with
`peerTier.enabled` gets its CA kept in the operator's namespace and its pods'
Secret (without the CA key), renewed with the same CA near its end, its
pods the peer sidecar before restore, and the operator publishes the peers
ConfigMap, `status.peer` and `recoveryPointOnNodeLoss`; a writer whose
partner goes away is re-paired. No kubelet runs here: nodes are bare Node
objects with a zone label, and pod IPs are written as the kubelet would."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from kubernetes import client, config
from operator_process import OperatorProcess

from ckptdrain.agent.kube import PodReport
from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.contract import api
from ckptdrain.contract.record import State
from ckptdrain.operator.peers import certs as peer_certs
from support.apiserver import Cluster

ZONE = "topology.kubernetes.io/zone"
#: Where the test operator keeps the policies' CAs (operator_process.py).
CA_NAMESPACE = "default"


@pytest.fixture
def nodes(cluster: Cluster, namespace: str) -> Iterator[list[str]]:
    """Two nodes in two zones, named after the test's namespace."""
    names = [f"{namespace}-a", f"{namespace}-b"]
    for name, zone in zip(names, ("a", "b"), strict=True):
        cluster.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {ZONE: zone}}}))
    yield names
    # No kubelet confirms a deletion here: pods on these nodes go by force.
    cluster.kubectl("delete", "-n", namespace, "pods", "--all", "--force", "--grace-period=0",
                    "--wait=false", check=False)
    cluster.kubectl("delete", "node", *names, "--wait=false", check=False)


def _maybe(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    """The object, or None while it does not exist."""
    out = cluster.kubectl("get", "-n", namespace, kind, name, "-o", "json", check=False)
    return dict(json.loads(out.stdout)) if out.returncode == 0 else None


def _peers(cluster: Cluster, namespace: str) -> dict[str, Any]:
    found = _maybe(cluster, namespace, "configmap", "llama-ckptdrain-peers") or {}
    return dict(json.loads(found["data"]["peers.json"])) if found else {"writers": {}}


def _status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return dict(get(cluster, namespace, POLICIES, "llama").get("status") or {})


def _signed_by(secret: dict[str, Any], ca: dict[str, Any]) -> bool:
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    issuer = x509.load_pem_x509_certificate(base64.b64decode(ca["data"]["ca.crt"]))
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def test_a_certificate_near_its_end_is_renewed_and_its_ca_goes_with_the_policy(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """An operator that was down for months comes back with a third of the
    certificate's life left: it renews the pods' Secret with the same CA (the
    pods still holding the old certificate keep trusting the new one)."""
    apply(policy("llama", writers=2, peerTier={"enabled": True}))
    first = wait_for(lambda: _maybe(cluster, namespace, "secret", "llama-ckptdrain-peer"),
                     what="the pods' peer Secret")
    uid = first["metadata"]["ownerReferences"][0]["uid"]
    ca_name = f"ckptdrain-peer-ca-{uid}"
    ends = wait_for(lambda: _status(cluster, namespace).get("peer", {}).get(
        "certificateNotAfter"), what="status.peer.certificateNotAfter")
    assert ends == api.timestamp(peer_certs.not_after(base64.b64decode(
        first["data"]["tls.crt"])))

    operator.stop()
    try:
        soon = datetime.now(UTC) + peer_certs.RENEW_BEFORE - timedelta(days=1)
        cluster.kubectl("patch", "-n", namespace, POLICIES, "llama", "--subresource=status",
                        "--type=merge", "-p", json.dumps(
                            {"status": {"peer": {"certificateNotAfter": api.timestamp(soon)}}}))
    finally:
        operator.start()
    renewed = wait_for(lambda: (s := _maybe(cluster, namespace, "secret",
                                            "llama-ckptdrain-peer"))
                       and s["data"]["tls.crt"] != first["data"]["tls.crt"] and s,
                       what="the renewed certificate")
    assert renewed["data"]["ca.crt"] == first["data"]["ca.crt"]
    ca = _maybe(cluster, CA_NAMESPACE, "secret", ca_name)
    assert ca is not None and _signed_by(renewed, ca) and _signed_by(first, ca)
    assert renewed["metadata"]["ownerReferences"][0]["uid"] == uid
    wait_for(lambda: _status(cluster, namespace).get("peer", {}).get("certificateNotAfter")
             == api.timestamp(peer_certs.not_after(base64.b64decode(
                 renewed["data"]["tls.crt"]))), what="the new end in the status")
    events = cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    assert "PeerCredentialsRenewed" in events

    cluster.kubectl("delete", "-n", namespace, POLICIES, "llama")
    wait_for(lambda: _maybe(cluster, CA_NAMESPACE, "secret", ca_name) is None,
             what="the policy's CA deleted with it")


def test_a_peer_policy_gets_secrets_sidecar_peers_and_status(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], nodes: list[str]) -> None:
    apply(policy("llama", writers=2, peerTier={"enabled": True, "keep": 2}))

    # The Secrets: the pods' holds no CA key and belongs to the policy; the
    # CA is kept in the operator's namespace, by the policy's uid.
    secret = wait_for(lambda: _maybe(cluster, namespace, "secret", "llama-ckptdrain-peer"),
                      what="the pods' peer Secret")
    assert sorted(secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("CheckpointPolicy", "llama")
    ca = _maybe(cluster, CA_NAMESPACE, "secret", f"ckptdrain-peer-ca-{owner['uid']}")
    assert ca is not None and b"PRIVATE KEY" in base64.b64decode(ca["data"]["ca.key"])
    assert _signed_by(secret, ca)
    assert _maybe(cluster, namespace, "secret", "llama-ckptdrain-peer-ca") is None
    # The webhook gives pods the tier once the status names the Secret.
    wait_for(lambda: _status(cluster, namespace).get("peer", {}).get("secret")
             == "llama-ckptdrain-peer", what="status.peer.secret")

    # The pods: the peer sidecar runs before restore, with the Secret by reference.
    for rank, node in enumerate(nodes):
        created = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-",
                                  input=json.dumps(pod(
                                      f"w-{rank}", {"app": "llama", **INJECT}, rank,
                                      nodeName=node, terminationGracePeriodSeconds=3600)))
        body = json.loads(created.stdout)
        names = [c["name"] for c in body["spec"]["initContainers"]]
        assert names.index("ckptdrain-peer") < names.index("ckptdrain-restore"), names
        peer = next(c for c in body["spec"]["initContainers"] if c["name"] == "ckptdrain-peer")
        assert peer["restartPolicy"] == "Always"
        assert peer["command"] == ["ckptdrain", "peer"]
        volumes = {v["name"]: v for v in body["spec"]["volumes"]}
        assert volumes["ckptdrain-peer-tls"]["secret"]["secretName"] == "llama-ckptdrain-peer"
        assert body["metadata"]["labels"]["ckptdrain.io/policy"] == "llama"
        ip = f"10.9.0.{rank + 1}"
        cluster.kubectl("patch", "-n", namespace, "pod", f"w-{rank}", "--subresource=status",
                        "--type=merge", "-p", json.dumps(
                            {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}}))

    # The pairing: across the two zones, in the ConfigMap and the status.
    doc = wait_for(lambda: len(_peers(cluster, namespace)["writers"]) == 2
                   and _peers(cluster, namespace), what="both writers in the peers document")
    assert doc["policy"] == f"{namespace}/llama"
    assert {r: (e["holder"], e["zone"], e["address"]) for r, e in doc["writers"].items()} == {
        "0": (1, "a", "10.9.0.1:9109"), "1": (0, "b", "10.9.0.2:9109")}
    status = wait_for(lambda: _status(cluster, namespace).get("peer", {}).get("reason")
                      == "Paired" and _status(cluster, namespace), what="status.peer Paired")
    assert status["peer"]["pairs"] == [{"writer": 0, "holder": 1}, {"writer": 1, "holder": 0}]

    # Claims: step 20 held locally and by each partner survives the loss of
    # either node; step 30, whose copies no partner holds yet, does not.
    core = client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
    for rank in range(2):
        # As an agent claims, on its pod (on its node), naming the holder and its node.
        w = PodReport(namespace, f"w-{rank}", rank, 2, api=core,
                      peer_holder=lambda step, r=rank: (1 - r, nodes[1 - r]) if step == 20
                      else None)
        w.report(CheckpointEvent(20, State.LOCAL, 10))
        w.report(CheckpointEvent(30, State.LOCAL, 10))
        assert w.publish(0)
    wait_for(lambda: _status(cluster, namespace).get("recoveryPointOnNodeLoss") == 20,
             what="the recovery point on node loss")

    # Writer 1's pod goes: writer 0 has no partner left, and remembers the old
    # one; writer 1 keeps its holder (writer 0's node has its copies) for its
    # replacement's restore, without a node or an address of its own.
    cluster.kubectl("delete", "-n", namespace, "pod", "w-1", "--wait=false")
    doc = wait_for(lambda: (d := _peers(cluster, namespace))["writers"]["1"]["address"] is None
                   and d, what="writer 1 gone from the peers")
    assert doc["writers"]["0"]["holder"] is None
    assert doc["writers"]["0"]["previousHolder"] == 1
    assert (doc["writers"]["1"]["node"], doc["writers"]["1"]["holder"]) == (None, 0)
    status = wait_for(lambda: _status(cluster, namespace).get("peer", {}).get("reason")
                      == "NoPartner" and _status(cluster, namespace), what="NoPartner")
    # Writer 1 runs nowhere: only a complete global step would survive now.
    assert status.get("recoveryPointOnNodeLoss") is None
