"""docs/rbac.md (the operator's) and docs/rbac-agent.md (the agent's) are the
one source of the RBAC rules: the operator and an agent run here with exactly
those rules (read from the docs, documented_rbac.py) and still work."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import INJECT, POLICIES, get, pod, policy, render_chart, wait_for
from documented_rbac import agent_rules, operator_rules, operator_section_rules
from kubernetes import client, config
from operator_process import OperatorProcess

from ckptdrain.agent.kube import PodReport
from ckptdrain.agent.refusals import event_body
from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.agent.share_channel import ShareChannel
from ckptdrain.contract.api import ANNOTATION_GOODPUT, ANNOTATION_RESTORED
from ckptdrain.contract.goodput import AgentView
from ckptdrain.contract.record import State
from ckptdrain.node.kube import annotate_own_pod, annotate_own_pod_with
from ckptdrain.restore.annotations import pod_annotations
from ckptdrain.restore.result import RestoreResult
from support.apiserver import Cluster

SYSTEM_NS = "ckptdrain-system"


def _bind(cluster: Cluster, kind: str, name: str, namespace: str,
          rules: list[dict[str, Any]]) -> Path:
    meta: dict[str, Any] = {"name": name}
    if kind == "Role":
        meta["namespace"] = namespace
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": f"{kind}Binding",
         "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": objects}))
    return cluster.kubeconfig_for(namespace, name)


@pytest.fixture
def least_privileged_operator(cluster: Cluster, operator: OperatorProcess,
                              tmp_path: Path) -> Iterator[OperatorProcess]:
    """The session operator swapped for one running with only the documented rules."""
    cluster.kubectl("create", "namespace", SYSTEM_NS, check=False)
    kubeconfig = _bind(cluster, "ClusterRole", "ckptdrain-operator", SYSTEM_NS,
                       operator_rules(dev_mode=True))
    # The record of agent images, by its own Role in the operator's namespace.
    _bind(cluster, "Role", "ckptdrain-operator", SYSTEM_NS,
          operator_section_rules("## The record of agent images"))
    # Rendered empty by the chart (templates/agent-images.yaml): never created.
    cluster.kubectl("create", "-n", SYSTEM_NS, "configmap", "ckptdrain-agent-images",
                    check=False)
    operator.stop()
    limited = OperatorProcess(cluster, tmp_path, KUBECONFIG=str(kubeconfig),
                              CKPTDRAIN_AGENT_IMAGES=f"{SYSTEM_NS}/ckptdrain-agent-images")
    try:
        limited.start()
        yield limited
    finally:
        limited.stop()
        cluster.kubectl("delete", "-n", SYSTEM_NS, "configmap", "ckptdrain-agent-images",
                        "--ignore-not-found", check=False)
        operator.start()


def test_documented_rules_are_enough(cluster: Cluster, namespace: str,
                                     least_privileged_operator: OperatorProcess,
                                     apply: Callable[..., Any]) -> None:
    agent_kubeconfig = _bind(cluster, "Role", "ckptdrain-agent", namespace,
                             agent_rules())
    apply(policy("llama", writers=2, storage={"uri": "s3://bucket/runs", "keep": 1}))
    status = wait_for(lambda: get(cluster, namespace, POLICIES, "llama").get("status", {})
                      .get("phase") and get(cluster, namespace, POLICIES, "llama")["status"])
    assert status["requiredBandwidthBytes"] == 63_000_000_000
    for i in range(2):
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
            pod(f"w-{i}", {"app": "llama", **INJECT}, i, terminationGracePeriodSeconds=3600)))
    wait_for(lambda: {get(cluster, namespace, "pod", f"w-{i}")["metadata"]["annotations"]
                      ["ckptdrain.io/bandwidth"] for i in range(2)} == {"31500000000"})

    # The agent's own identity: records, its claims, its pod's annotations.
    api = client.CustomObjectsApi(config.new_client_from_config(str(agent_kubeconfig)))
    core = client.CoreV1Api(config.new_client_from_config(str(agent_kubeconfig)))
    writers = [PodReport(namespace, f"w-{rank}", rank, 2, api=core) for rank in range(2)]
    for step in (1, 2):
        for w in writers:
            w.report(CheckpointEvent(step, State.GLOBAL, 10))
            assert w.publish(0)
    core.patch_namespaced_pod("w-0", namespace, {"metadata": {"annotations": {
        "ckptdrain.io/pending-bytes": "5", "ckptdrain.io/restored-from": "step=2 tier=local"}}},
        _content_type="application/merge-patch+json")
    # The share channel: the operator publishes it, the agent watches it.
    channel = ShareChannel(namespace, "llama", rank=0, pod="w-0", pending=lambda: 5,
                           reported=lambda: 0.0, api=api)
    channel.start()
    try:
        wait_for(lambda: (view := channel.view()).established and view.allocation is not None
                 and view.allocation.admits(0, "w-0"),
                 what="the agent admitted through its share channel")
    finally:
        channel.stop()
    wait_for(lambda: [r["metadata"]["name"] for r in get(cluster, namespace, "ckpt")["items"]]
             == ["llama-s2"], what="retention with the documented rules")
    wait_for(lambda: get(cluster, namespace, POLICIES, "llama")["status"].get("restores"))
    with pytest.raises(client.exceptions.ApiException) as denied:
        core.read_namespaced_secret("s3-creds", namespace)
    assert denied.value.status == 403

    # The operator recorded its image with the documented rules (and read it
    # back for admission: no refusal in its log below).
    wait_for(lambda: "ckptdrain:test" in cluster.kubectl(
        "get", "-n", SYSTEM_NS, "configmap", "ckptdrain-agent-images", "-o", "json",
        check=False).stdout, what="the agent image recorded")

    log = least_privileged_operator.tail(200_000)
    # A refusal reads "(403) Reason: Forbidden" or "403 Forbidden"; a bare "403"
    # also turns up inside resource versions and byte counts.
    assert not re.search(r"(?i)forbidden|\(403\)|\b403\b\s*forbidden", log), log[-3000:]


# -- the agent's pod patches, narrowed by the chart's ValidatingAdmissionPolicy ---------

AGENT_SA = "ckptdrain-agent"


def _render(template: str, *values: str) -> str:
    """One chart template, rendered as `helm install` and `helm template`
    render it (the policies follow their values alone)."""
    return render_chart("ckptdrain", SYSTEM_NS, [template], *values)


def _pod_patch_policy() -> str:
    """The chart's policy on the agent's pod patches."""
    return _render("agent-pod-policy.yaml")


@pytest.fixture
def pod_patch_policy(cluster: Cluster) -> Iterator[None]:
    text = _pod_patch_policy()
    cluster.kubectl("apply", "-f", "-", input=text)
    try:
        yield
    finally:
        cluster.kubectl("delete", "-f", "-", input=text, check=False)


def _refused(core: client.CoreV1Api, name: str, namespace: str, body: dict[str, Any],
             *, dry_run: bool = False) -> str:
    """The API server's refusal of this patch ('' if it was accepted)."""
    try:
        if dry_run:  # admission runs in full, nothing is stored
            core.patch_namespaced_pod(name, namespace, body, dry_run="All")
        else:
            core.patch_namespaced_pod(name, namespace, body)
    except client.exceptions.ApiException as err:
        assert err.status in (403, 422), err
        return str(err.body)
    return ""


def test_the_agent_may_patch_only_its_own_pods_ckptdrain_annotations(
        cluster: Cluster, crds: None, namespace: str, pod_patch_policy: None) -> None:
    _bind(cluster, "Role", AGENT_SA, namespace, agent_rules())
    for name in ("w-0", "other"):
        body = pod(name, {"app": "llama"}, serviceAccountName=AGENT_SA)
        body["metadata"]["annotations"] = {"team": "a"}
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))
    uid = get(cluster, namespace, "pod", "w-0")["metadata"]["uid"]
    own = client.CoreV1Api(config.new_client_from_config(str(
        cluster.kubeconfig_for(namespace, AGENT_SA, bound_pod=("w-0", uid)))))
    pending = {"metadata": {"annotations": {"ckptdrain.io/pending-bytes": "7"}}}
    # A new policy takes effect within moments: wait until it refuses. The probe is a
    # dry run, so a patch accepted before the policy is in force changes nothing.
    wait_for(lambda: _refused(own, "other", namespace, pending, dry_run=True),
             what="the policy in force")

    # What the agent does, through its own code, is allowed.
    report = PodReport(namespace, "w-0", 0, 1, api=own)
    report.report(CheckpointEvent(1, State.LOCAL, 10))
    assert report.publish(5)
    assert annotate_own_pod(namespace, "w-0", ANNOTATION_RESTORED, "step=2 tier=local",
                            api=own)
    restored = RestoreResult(False, 0, 1, 1.0, outcome="restored", step=2, tier="local")
    assert annotate_own_pod_with(namespace, "w-0", pod_annotations(restored, 0, 2.0), api=own)
    assert annotate_own_pod(namespace, "w-0", ANNOTATION_GOODPUT,
                            AgentView(training_at=3.0).to_json(), api=own)
    own.create_namespaced_event(namespace, event_body(
        namespace, "w-0", uid, 3, "step 3 refused: the local tier cannot hold it",
        datetime.now(UTC)))
    assert any(e["reason"] == "CaptureRefused" and e["involvedObject"]["name"] == "w-0"
               for e in get(cluster, namespace, "events")["items"])
    assert "ckptdrain.io/progress" in get(cluster, namespace, "pod", "w-0")["metadata"][
        "annotations"]

    # Anything else with the same token (the trainer shares it) is refused.
    for target, body in [
        ("other", pending),                                                  # another pod
        ("w-0", {"metadata": {"labels": {"app": "evil"}}}),                  # labels
        ("w-0", {"metadata": {"annotations": {"team": "b"}}}),               # other annotations
        ("w-0", {"metadata": {"annotations": {"team": None}}}),              # removing one
        ("w-0", {"metadata": {"annotations": {"ckptdrain.io/bandwidth": "1"}}}),  # the share
        ("w-0", {"spec": {"activeDeadlineSeconds": 5}}),                     # the spec
    ]:
        assert "ckptdrain agent" in _refused(own, target, namespace, body), (target, body)
    unbound = client.CoreV1Api(config.new_client_from_config(str(
        cluster.kubeconfig_for(namespace, AGENT_SA))))
    assert "bound to" in _refused(unbound, "w-0", namespace, pending)

    w0, other = (get(cluster, namespace, "pod", n)["metadata"] for n in ("w-0", "other"))
    assert w0["labels"] == {"app": "llama"} and {
        k: v for k, v in w0["annotations"].items()
        if k not in ("ckptdrain.io/restore-result", "ckptdrain.io/goodput",
                     "ckptdrain.io/progress")} == {
        "team": "a", "ckptdrain.io/pending-bytes": "5",
        "ckptdrain.io/share-scale": "true",
        "ckptdrain.io/restored-from": "step=2 tier=local"}
    assert json.loads(w0["annotations"]["ckptdrain.io/restore-result"])["step"] == 2
    assert json.loads(w0["annotations"]["ckptdrain.io/goodput"])["trainingAt"] == 3.0
    assert json.loads(w0["annotations"]["ckptdrain.io/progress"])["steps"]["1"]["state"] \
        == "Local"
    assert other["annotations"] == {"team": "a"}
    # Nobody else is narrowed: the operator (here the admin) still sets shares.
    cluster.kubectl("annotate", "-n", namespace, "pod", "other", "ckptdrain.io/bandwidth=1")


# -- the operator's Secret updates (peer tier), narrowed by the chart's policy ----------

OPERATOR_SA = "ckptdrain"  # the chart's name for it, release "ckptdrain"
CA_NS = "ckptdrain-system-peer-ca"  # the chart's default for that release namespace


def _secret_update_policy() -> str:
    """The chart's policy on the operator's Secret updates (with the peer tier)."""
    return _render("operator-secret-policy.yaml", "--set", "operator.peerTier=true")


def _tls_secret(name: str, labels: dict[str, str], type_: str = "kubernetes.io/tls"
                ) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": type_,
            "metadata": {"name": name, "labels": labels},
            "data": {"tls.crt": "YQ==", "tls.key": "Yg=="} if type_ == "kubernetes.io/tls"
            else {"token": "c2VjcmV0"}}


def _replace(core: client.CoreV1Api, namespace: str, body: dict[str, Any],
             dry_run: bool = False) -> str:
    """The API server's refusal of this PUT ('' if it was accepted)."""
    try:
        core.replace_namespaced_secret(body["metadata"]["name"], namespace, body,
                                       **({"dry_run": "All"} if dry_run else {}))
    except client.exceptions.ApiException as err:
        assert err.status in (403, 422), err
        return str(err.body)
    return ""


def test_the_operator_may_replace_only_the_peer_tiers_secrets(
        cluster: Cluster, namespace: str) -> None:
    text = _secret_update_policy()
    for ns in (SYSTEM_NS, CA_NS):
        cluster.kubectl("create", "namespace", ns, check=False)
    # RBAC as wide as it gets for updates: the policy is what narrows it.
    rules = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["update"]}]
    kubeconfig = _bind(cluster, "ClusterRole", OPERATOR_SA, SYSTEM_NS, rules)
    core = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    peer = _tls_secret("llama-ckptdrain-peer", {"ckptdrain.io/policy": "llama"})
    theirs = _tls_secret("app-tls", {"team": "a"})
    token = _tls_secret("llama-ckptdrain-peer-x", {}, type_="Opaque")
    ca = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
          "metadata": {"name": "ckptdrain-peer-ca-u1",
                       "labels": {"ckptdrain.io/peer-ca-for": "u1"}},
          "data": {"ca.crt": "YQ==", "ca.key": "Yg=="}}
    unlabelled_ca = {**ca, "metadata": {"name": "ckptdrain-peer-ca-u2"}}
    for ns, body in [(namespace, peer), (namespace, theirs), (namespace, token),
                     (CA_NS, ca), (CA_NS, unlabelled_ca), (namespace, ca)]:
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
    webhook = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": "ckptdrain-webhook-cert"}, "data": {"ca.crt": "YQ=="}}
    cluster.kubectl("apply", "-n", SYSTEM_NS, "-f", "-", input=json.dumps(webhook))
    cluster.kubectl("apply", "-f", "-", input=text)
    try:
        renewed = {**theirs, "data": {"tls.crt": "Yw==", "tls.key": "ZA=="}}
        # A dry run (admission in full, nothing stored) until it refuses.
        wait_for(lambda: _replace(core, namespace, renewed, dry_run=True),
                 what="the policy in force")
        # What the operator does: a renewal of the peer Secret, the CA, its webhook's.
        assert _replace(core, namespace, {**peer, "data": {"tls.crt": "Yw==",
                                                            "tls.key": "ZA=="}}) == ""
        assert _replace(core, CA_NS, {**ca, "data": {"ca.crt": "Yw==", "ca.key": "ZA=="}}) \
            == ""
        assert _replace(core, SYSTEM_NS, {**webhook, "data": {"ca.crt": "Yw=="}}) == ""
        # Anything else is refused, whatever RBAC says.
        for ns, body in [
            (namespace, renewed),                                          # a user's Secret
            (namespace, {**token, "data": {"token": "eA=="}}),             # not a TLS Secret
            (namespace, {**peer, "metadata": {"name": peer["metadata"]["name"]}}),  # label off
            (CA_NS, {**unlabelled_ca, "data": {"ca.key": "eA=="}}),        # not one of ours
            (namespace, {**ca, "data": {"ca.key": "eA=="}}),               # CA name elsewhere
        ]:
            refusal = _replace(core, ns, body)
            assert "ckptdrain operator" in refusal, (ns, body["metadata"], refusal)
        assert get(cluster, namespace, "secret", "app-tls")["data"]["tls.crt"] == "YQ=="
    finally:
        cluster.kubectl("delete", "-f", "-", input=text, check=False)
        cluster.kubectl("delete", "-n", CA_NS, "secret", "ckptdrain-peer-ca-u1",
                        "ckptdrain-peer-ca-u2", check=False)


def test_documented_rules_run_the_peer_tier_and_renew_it(
        cluster: Cluster, namespace: str, operator: OperatorProcess, tmp_path: Path,
        apply: Callable[..., Any]) -> None:
    """The operator with the documented cluster rules, the peer tier's rules
    on Secrets and ConfigMaps (cluster-wide, as without agent.namespaces) and
    the CA Role in its CA namespace: it makes a
    policy's CA and Secret and renews the certificate, and nothing it does is
    refused."""
    cluster.kubectl("create", "namespace", SYSTEM_NS, check=False)
    cluster.kubectl("create", "namespace", CA_NS, check=False)
    kubeconfig = _bind(cluster, "ClusterRole", "ckptdrain-operator", SYSTEM_NS,
                       operator_rules(dev_mode=True)
                       + operator_section_rules("## The peer tier's Secrets and ConfigMaps"))
    ca_rules = operator_section_rules("## The peer tier's CAs")
    meta = {"name": "ckptdrain-peer-ca", "namespace": CA_NS}
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": ca_rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "ckptdrain-peer-ca"},
         "subjects": [{"kind": "ServiceAccount", "name": "ckptdrain-operator",
                       "namespace": SYSTEM_NS}]}]}))
    operator.stop()
    limited = OperatorProcess(cluster, tmp_path, KUBECONFIG=str(kubeconfig),
                              CKPTDRAIN_PEER_CA_NAMESPACE=CA_NS)
    try:
        limited.start()
        apply(policy("llama", writers=2, peerTier={"enabled": True}))

        def peer_status() -> dict[str, Any]:
            return dict((get(cluster, namespace, POLICIES, "llama").get("status") or {})
                        .get("peer") or {})
        wait_for(lambda: peer_status().get("certificateNotAfter"),
                 what="the Secret made and its end in the status")
        first = get(cluster, namespace, "secret", "llama-ckptdrain-peer")["data"]["tls.crt"]
        uid = get(cluster, namespace, POLICIES, "llama")["metadata"]["uid"]
        get(cluster, CA_NS, "secret", f"ckptdrain-peer-ca-{uid}")
        # Months later: a restart with a third of the certificate's life left.
        limited.stop()
        cluster.kubectl("patch", "-n", namespace, POLICIES, "llama", "--subresource=status",
                        "--type=merge", "-p", json.dumps({"status": {"peer": {
                            "certificateNotAfter": "2000-01-01T00:00:00Z"}}}))
        limited.start()
        wait_for(lambda: get(cluster, namespace, "secret", "llama-ckptdrain-peer")["data"][
            "tls.crt"] != first, what="the certificate renewed with the documented rules")
        assert peer_status().get("reason") != "CredentialsFailed", peer_status()
        cluster.kubectl("delete", "-n", namespace, POLICIES, "llama")
        wait_for(lambda: not json.loads(cluster.kubectl(
            "get", "secrets", "-n", CA_NS, "-l", f"ckptdrain.io/peer-ca-for={uid}",
            "-o", "json").stdout)["items"], what="the CA deleted with its policy")
        log = limited.tail(200_000)
        assert not re.search(r"(?i)forbidden|\(403\)|\b403\b\s*forbidden", log), log[-3000:]
    finally:
        limited.stop()
        operator.start()
