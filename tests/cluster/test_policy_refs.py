"""What the operator writes about a policy names it at v1beta1, against a
real apiserver (docs/api-versions.md, "What names a policy"): the owner
references of the records and share channel it makes, the Events it
posts (its own and Kopf's). A record owned at v1alpha1, as 0.2.0 made it,
resolves by the apiserver's lookup the garbage collector uses for an owner
(the reference's apiVersion and kind mapped through discovery, the owner
read there, uids compared): no controller-manager runs here, so the
cascade itself is not exercised (docs/api-versions.md says where it is
read from); the operator folds the record and keeps it as its policy's.
The policy webhooks Kopf registers here name every version, so a
v1alpha1 refusal shows the value as written.

The agents are played by `agent.kube.PodReport` on pods admitted through
the operator's webhook, as in test_records.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from kubernetes import client, config
from operator_process import WEBHOOK_NAME, OperatorProcess

from ckptdrain.agent.kube import PodReport
from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.contract import record as fmt
from ckptdrain.contract.record import State
from support.apiserver import Cluster

V1ALPHA1, V1BETA1 = "ckptdrain.io/v1alpha1", "ckptdrain.io/v1beta1"
GRACE = {"terminationGracePeriodSeconds": 3600}


@pytest.fixture
def core_api(cluster: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))


def _ready(cluster: Cluster, namespace: str, name: str) -> str:
    """The policy's uid once the operator has sized it."""
    wait_for(lambda: (get(cluster, namespace, POLICIES, name).get("status") or {})
             .get("phase") == "Ready", what=f"policy {name} Ready")
    return str(get(cluster, namespace, POLICIES, name)["metadata"]["uid"])


def _writer(cluster: Cluster, core_api: client.CoreV1Api, namespace: str,
            policy_name: str) -> PodReport:
    """The policy's one writer pod (rank 0), and its agent's report."""
    name = f"{policy_name}-w0"
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
        pod(name, {"app": policy_name, **INJECT}, 0, **GRACE)))
    return PodReport(namespace, name, 0, 1, api=core_api)


def _global(writer: PodReport, step: int) -> None:
    writer.report(CheckpointEvent(step, State.GLOBAL, 1_000))
    assert writer.publish(0)


def _named(cluster: Cluster, namespace: str, plural: str, name: str) -> dict[str, Any]:
    """The object of `plural` called `name`; {} while there is none."""
    items = get(cluster, namespace, plural)["items"]
    return next((i for i in items if i["metadata"]["name"] == name), {})


def _record(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return _named(cluster, namespace, "checkpoints", name)


def _events_about(cluster: Cluster, namespace: str, uid: str) -> dict[str, str]:
    """Each Event reason about the object of `uid`, with the apiVersion it names."""
    items = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o",
                                       "json").stdout)["items"]
    return {e["reason"]: e["involvedObject"].get("apiVersion") for e in items
            if e["involvedObject"].get("uid") == uid}


def test_what_the_operator_makes_and_posts_about_a_policy_names_it_at_v1beta1(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Any, core_api: client.CoreV1Api) -> None:
    # Written at v1alpha1, as most manifests of the 0.2.0 era: what names it
    # is the storage version all the same. Global every 4 s, so a drain that
    # has not completed is stalled within seconds (the watchdog's Event).
    apply(policy("llama", interval="4s"))
    uid = _ready(cluster, namespace, "llama")
    writer = _writer(cluster, core_api, namespace, "llama")
    # Kopf's kopf.info (Sized) and the operator's own post (DrainStalled).
    events = wait_for(lambda: (lambda got: got if {"Sized", "DrainStalled"} <= set(got)
                               else None)(_events_about(cluster, namespace, uid)),
                      timeout_s=40, what="the Sized and DrainStalled Events")
    assert events["Sized"] == events["DrainStalled"] == V1BETA1, events

    _global(writer, 100)
    owner = {"apiVersion": V1BETA1, "kind": "CheckpointPolicy", "name": "llama", "uid": uid}
    wait_for(lambda: _record(cluster, namespace, "llama-s100")["metadata"]
             .get("ownerReferences") == [owner], what="the record owned at v1beta1")
    assert _record(cluster, namespace, "llama-s100")["apiVersion"] == V1ALPHA1

    cluster.kubectl("annotate", "--overwrite", "-n", namespace, "pod", "llama-w0",
                    "ckptdrain.io/pending-bytes=100")
    channel = wait_for(lambda: _named(cluster, namespace, "checkpointshares", "llama"),
                       what="the share channel")
    assert channel["metadata"]["ownerReferences"] == [
        {**owner, "controller": True, "blockOwnerDeletion": False}]


def test_a_record_owned_at_v1alpha1_is_still_its_policys(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Any, core_api: client.CoreV1Api) -> None:
    apply(policy("old"))
    uid = _ready(cluster, namespace, "old")
    # As 0.2.0's operator made it: owned by the policy at v1alpha1.
    legacy = {"apiVersion": V1ALPHA1, "kind": "CheckpointPolicy", "name": "old", "uid": uid}
    made = fmt.build_record(namespace, "old", 100, 1)
    made["metadata"]["ownerReferences"] = [legacy]
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(made))
    assert _record(cluster, namespace, "old-s100")["metadata"]["ownerReferences"] == [legacy]

    # The garbage collector's lookup of that owner: the reference's version
    # and kind through discovery, then the owner read there, by uid.
    group = json.loads(cluster.kubectl("get", "--raw", "/apis/ckptdrain.io/v1alpha1").stdout)
    assert {"name": "checkpointpolicies", "kind": "CheckpointPolicy", "namespaced": True} in [
        {k: r.get(k) for k in ("name", "kind", "namespaced")} for r in group["resources"]]
    found = json.loads(cluster.kubectl(
        "get", "--raw", f"/apis/ckptdrain.io/v1alpha1/namespaces/{namespace}"
        "/checkpointpolicies/old").stdout)
    assert found["metadata"]["uid"] == uid

    # The operator folds the writer's report into it, and owns it as it is:
    # no second reference to the same policy, no rewrite.
    _global(_writer(cluster, core_api, namespace, "old"), 100)
    wait_for(lambda: (get(cluster, namespace, POLICIES, "old").get("status") or {})
             .get("lastGlobalStep") == 100, what="the old record folded and counted")
    record = _record(cluster, namespace, "old-s100")
    assert record["status"]["state"] == "Global"
    assert record["metadata"]["ownerReferences"] == [legacy]


def test_a_capped_policy_is_said_constrained_at_v1beta1(
        cluster: Cluster, operator: OperatorProcess, namespace: str, apply: Any) -> None:
    # 5.67 TB per 15 min over 21 GB/s: Kopf's kopf.warn (BandwidthConstrained).
    apply(policy("capped", caps={"bandwidth": "21GB/s"}))
    uid = str(wait_for(lambda: get(cluster, namespace, POLICIES, "capped")["metadata"]
                       .get("uid"), what="the capped policy"))
    events = wait_for(lambda: (lambda got: got if "BandwidthConstrained" in got else None)(
        _events_about(cluster, namespace, uid)), timeout_s=40,
        what="the BandwidthConstrained Event")
    assert events["BandwidthConstrained"] == V1BETA1, events


def test_kopfs_policy_webhooks_take_each_version_as_written(
        cluster: Cluster, operator: OperatorProcess, namespace: str, apply: Any) -> None:
    configuration = json.loads(cluster.kubectl(
        "get", "validatingwebhookconfiguration", WEBHOOK_NAME, "-o", "json").stdout)
    versions = {v for w in configuration["webhooks"] for r in w["rules"]
                if r["resources"] == ["checkpointpolicies"] for v in r["apiVersions"]}
    assert versions == {"v1alpha1", "v1beta1"}, configuration["webhooks"]
    # Sent converted to v1beta1, "2GB/s" came back as '2G'.
    refused = apply(policy("fast", caps={"bandwidth": "1GB/s", "perDrainer": "2GB/s"}),
                    check=False)
    assert refused.returncode != 0
    assert ("spec.caps.perDrainer: expected at most caps.bandwidth (1.00 GB/s), "
            "got '2GB/s'") in refused.stderr, refused.stderr
