"""The peer tier under least privilege, as the chart installs it: the
operator's ServiceAccount with the chart's rendered RBAC and admission
policies (agent.namespaces listing the training namespace) still writes,
through the operator's own code, everything the peer tier and the record of
agent images need, and is refused anything else: another Secret or
ConfigMap, or any ConfigMap outside the listed namespaces."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_helpers import get, render_chart, wait_for
from kubernetes import client, config

from ckptdrain.contract.peers import Member
from ckptdrain.contract.record import owner_reference
from ckptdrain.operator import config as operator_config
from ckptdrain.operator.admission import agent_images
from ckptdrain.operator.apiserver import kube as operator_kube
from ckptdrain.operator.peers import kube as peer_kube
from ckptdrain.operator.peers import placement
from support.apiserver import Cluster

RELEASE = "ckptdrain-least"  # its own release: no clash with test_rbac.py's objects
SYSTEM_NS = "ckptdrain-system"
CA_NS = f"{SYSTEM_NS}-peer-ca"  # the chart's default CA namespace for SYSTEM_NS
TEMPLATES = ["rbac.yaml", "peer-tier-rbac.yaml", "agent-images.yaml",
             "operator-secret-policy.yaml", "operator-write-policy.yaml"]


@pytest.fixture
def unlisted(cluster: Cluster) -> Iterator[str]:
    """A namespace that runs no training pods: not in agent.namespaces."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "-n", name, "configmaps,secrets", "--all", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def operator_api(cluster: Cluster, namespace: str,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[client.CoreV1Api]:
    """The chart installed as far as these rights go (peer tier on, `namespace`
    listed in agent.namespaces); the operator's code acting as its
    ServiceAccount."""
    text = render_chart(RELEASE, SYSTEM_NS, TEMPLATES, "--set", "operator.peerTier=true",
                        "--set", f"agent.namespaces={{{namespace}}}")
    for ns in (SYSTEM_NS, CA_NS, "kube-node-lease"):
        cluster.kubectl("create", "namespace", ns, check=False)
    cluster.kubectl("create", "serviceaccount", RELEASE, "-n", SYSTEM_NS, check=False)
    cluster.kubectl("apply", "-f", "-", input=text)
    core = client.CoreV1Api(config.new_client_from_config(str(
        cluster.kubeconfig_for(SYSTEM_NS, RELEASE))))
    monkeypatch.setattr(peer_kube, "_clients", lambda: (core, None))
    monkeypatch.setattr(operator_kube, "_clients", lambda: (core, None))
    try:
        # A new policy takes effect within moments: a dry run (admission in
        # full, nothing stored) until it refuses.
        wait_for(lambda: _refused(lambda **dry: core.create_namespaced_config_map(
            namespace, _configmap("probe"), **dry), dry_run=True), what="the policies in force")
        yield core
    finally:
        cluster.kubectl("delete", "-f", "-", input=text, check=False)
        cluster.kubectl("delete", "serviceaccount", RELEASE, "-n", SYSTEM_NS, check=False)
        cluster.kubectl("delete", "-n", CA_NS, "secret", "-l", "ckptdrain.io/peer-ca-for=u1",
                        check=False)


def _refused(call: Any, dry_run: bool = False) -> str:
    """The API server's refusal of `call` ('' when it was accepted)."""
    try:
        call(**({"dry_run": "All"} if dry_run else {}))
    except client.exceptions.ApiException as err:
        assert err.status in (403, 422), err
        return str(err.body)
    return ""


def _configmap(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, **({"labels": labels} if labels else {})},
            "data": {"k": "v"}}


def _material(cert: bytes) -> dict[str, bytes]:
    return {"ca.crt": b"ca", "tls.crt": cert, "tls.key": b"key"}


def test_the_peer_tier_writes_its_own_objects_and_nothing_else(
        cluster: Cluster, namespace: str, unlisted: str,
        operator_api: client.CoreV1Api) -> None:
    core = operator_api
    owner = owner_reference("llama", "u1")
    # What the operator does, through its own code: the peers ConfigMap made,
    # then merge-patched when the pairing changes, and read back.
    pairing = [Member(0, "node-a", None, "10.0.0.1:7070"),
               Member(1, "node-b", None, "10.0.0.2:7070")]
    first = placement.peers_configmap(namespace, "llama", pairing[:1], None, owner, 2)
    peer_kube.write_configmap(namespace, first)
    changed = placement.peers_configmap(namespace, "llama", pairing, None, owner, 2)
    assert changed["data"] != first["data"]
    peer_kube.write_configmap(namespace, changed)
    assert peer_kube.read_configmap_data(namespace, "llama-ckptdrain-peers") \
        == changed["data"]
    # The pods' Secret, made and renewed whole; the policy's CA in its namespace.
    assert peer_kube.create_secret(namespace, placement.pods_secret(
        namespace, "llama", _material(b"one"), owner))
    peer_kube.replace_secret(namespace, placement.pods_secret(
        namespace, "llama", _material(b"two"), owner))
    assert get(cluster, namespace, "secret", "llama-ckptdrain-peer")["data"]["tls.crt"] \
        == "dHdv"
    assert peer_kube.create_secret(CA_NS, placement.ca_store_secret(
        CA_NS, "u1", f"{namespace}/llama", {"ca.crt": b"c", "ca.key": b"k"}, RELEASE))
    # The record of agent images, rendered empty by the chart, updated by name.
    cfg = operator_config.from_env({
        "CKPTDRAIN_AGENT_IMAGES": f"{SYSTEM_NS}/{RELEASE}-agent-images",
        "CKPTDRAIN_IMAGE": "registry.example/ckptdrain:least"})
    assert agent_images.record_once(cfg)
    assert "ckptdrain:least" in get(cluster, SYSTEM_NS, "configmap",
                                    f"{RELEASE}-agent-images")["data"]["images.json"]

    # Anything else is refused by the write policy, though RBAC allows it.
    tls = {"tls.crt": "YQ==", "tls.key": "Yg=="}

    def secret(name: str, labels: dict[str, str], type_: str = "kubernetes.io/tls"
               ) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Secret", "type": type_,
                "metadata": {"name": name, "labels": labels}, "data": tls}

    for ns, body in [
        (namespace, secret("app-tls", {"ckptdrain.io/policy": "llama"})),   # another name
        (namespace, secret("gpt-ckptdrain-peer", {})),                      # no label
        (namespace, secret("gpt-ckptdrain-peer", {"ckptdrain.io/policy": "llama"})),  # not its
        (namespace, secret("gpt-ckptdrain-peer", {"ckptdrain.io/policy": "gpt"}, "Opaque")),
        (namespace, secret("ckptdrain-peer-ca-u2", {"ckptdrain.io/peer-ca-for": "u2"},
                           "Opaque")),                                      # a CA elsewhere
        (CA_NS, secret("keys", {"ckptdrain.io/peer-ca-for": "u2"}, "Opaque")),  # not a CA
    ]:
        refusal = _refused(lambda ns=ns, body=body: core.create_namespaced_secret(ns, body))
        assert "ckptdrain operator" in refusal, (ns, body["metadata"], refusal)
    cluster.kubectl("create", "configmap", "app-config", "-n", namespace)
    cluster.kubectl("create", "configmap", "gpt-ckptdrain-peers", "-n", namespace)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_configmap(
        "opt-ckptdrain-peers", {"ckptdrain.io/policy": "someone-else"})))
    for call in [
        lambda: core.create_namespaced_config_map(namespace, _configmap("app")),
        lambda: core.create_namespaced_config_map(namespace, _configmap(
            "gpt-ckptdrain-peers-x", {"ckptdrain.io/policy": "gpt"})),
        lambda: core.patch_namespaced_config_map("app-config", namespace, {"data": {"k": "x"}}),
        # A user's ConfigMap of that name, unlabelled or labelled for
        # another: never taken over.
        lambda: peer_kube.write_configmap(namespace, placement.peers_configmap(
            namespace, "gpt", pairing, None, owner, 2)),
        lambda: peer_kube.write_configmap(namespace, placement.peers_configmap(
            namespace, "opt", pairing, None, owner, 2)),
    ]:
        assert "ckptdrain operator" in _refused(call)
    assert "data" not in get(cluster, namespace, "configmap", "app-config")

    # Outside the listed namespaces the peer tier's rules do not reach: no
    # ConfigMap read, no Secret made (RBAC, before any policy).
    cluster.kubectl("create", "configmap", "llama-ckptdrain-peers", "-n", unlisted)
    with pytest.raises(client.exceptions.ApiException) as denied:
        peer_kube.read_configmap_data(unlisted, "llama-ckptdrain-peers")
    assert denied.value.status == 403
    for call in [
        lambda: core.create_namespaced_secret(unlisted, placement.pods_secret(
            unlisted, "llama", _material(b"one"), owner)),
        # Nor in the release's namespace, where only the record is granted.
        lambda: core.create_namespaced_config_map(SYSTEM_NS, _configmap("other")),
    ]:
        refusal = _refused(call)
        assert "forbidden" in refusal and "ckptdrain operator" not in refusal, refusal
    assert json.loads(cluster.kubectl("get", "secrets", "-n", unlisted, "-o", "json")
                      .stdout)["items"] == []
