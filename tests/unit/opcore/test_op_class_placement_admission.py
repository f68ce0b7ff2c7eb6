"""A CheckpointClass's placement at pod admission, on both edges that serve
it (Kopf's webhook in the operator's process, and the admission process),
with the apiserver's reads replaced: a selected pod gets the class's
nodeSelector and tolerations; one whose nodeSelector sets a class key to
another value, or whose required node affinity no class node meets, is
refused naming the field, the class and what was expected, before any
read of the apiserver and whatever CKPTDRAIN_UNSELECTED_PODS says."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import jsonpatch
import kopf
import pytest
from tests.support.tenancy_wiring import CFG, LOG, fake_cluster, policy

from ckptdrain.operator import config
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import webhook
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.apiserver import class_view

NVME = {"key": "example.com/nvme", "operator": "Exists", "effect": "NoSchedule"}
PLACED = {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
          "metadata": {"name": "team-a", "creationTimestamp": "2026-11-01T00:00:00Z"},
          "spec": {"nodeTier": {"root": "/mnt/ckptdrain",
                                "nodeSelector": {"example.com/pool": "nvme"},
                                "tolerations": [NVME]}}}


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, no_checkpoint_classes: class_view.ClassView
            ) -> Iterator[dict[str, Any]]:
    for state in fake_cluster(monkeypatch, no_checkpoint_classes):
        no_checkpoint_classes.replace([PLACED], "2")
        state["policies"] = [policy()]
        yield state


def pod(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml",
                         "labels": {"app": "llama", "ckptdrain.io/inject": "true"}},
            "spec": {"containers": [{"name": "trainer", "image": "t"}],
                     "terminationGracePeriodSeconds": 3600, **spec}}


def kopf_edge(given: dict[str, Any], cfg: config.OperatorConfig = CFG) -> dict[str, Any]:
    """The pod as Kopf's webhook (CKPTDRAIN_WEBHOOK_PROCESS=false) leaves it."""
    patch = kopf.Patch()
    asyncio.run(webhook.pod_mutate(body=kopf.Body(given), patch=patch, warnings=[],
                                   memo=kopf.Memo(config=cfg), logger=LOG,
                                   policy_by_label={}, pod_index={}))
    doc = json.loads(json.dumps(given))
    for fn in patch.fns:
        fn(doc)
    return doc


def process_edge(given: dict[str, Any], cfg: config.OperatorConfig = CFG) -> dict[str, Any]:
    """The pod as the admission process leaves it (AdmissionError: its refusal)."""
    reviewer = admission_process.Reviewer(cfg, PolicyMirror(), lambda w, o, s: None)
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u-1", "operation": "CREATE", "namespace": "ml",
                          "object": given}}
    answer = asyncio.run(reviewer(review, admission.MUTATE_ID))["response"]
    if not answer["allowed"]:
        raise kopf.AdmissionError(answer["status"]["message"], code=answer["status"]["code"])
    return jsonpatch.apply_patch(given, json.loads(base64.b64decode(answer["patch"])))


Edge = Callable[..., dict[str, Any]]
EDGES = pytest.mark.parametrize("edge", [kopf_edge, process_edge], ids=["kopf", "process"])


@EDGES
def test_a_selected_pod_gets_the_class_placement(
        cluster: dict[str, Any], edge: Edge) -> None:
    bare = edge(pod())["spec"]
    assert bare["nodeSelector"] == {"example.com/pool": "nvme"}
    assert bare["tolerations"] == [NVME]
    own = edge(pod(nodeSelector={"gpu": "h100"}, tolerations=[NVME]))["spec"]
    assert own["nodeSelector"] == {"gpu": "h100", "example.com/pool": "nvme"}
    assert own["tolerations"] == [NVME]


@EDGES
def test_a_pod_asking_for_other_nodes_is_refused_naming_the_field(
        cluster: dict[str, Any], edge: Edge) -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        edge(pod(nodeSelector={"example.com/pool": "hdd"}))
    message = str(refused.value)
    assert refused.value.code == 422
    assert "spec.nodeSelector.example.com/pool" in message
    assert "CheckpointClass team-a" in message and "example.com/pool=nvme" in message


@EDGES
def test_the_refusal_names_the_policy_and_reads_nothing_more(
        cluster: dict[str, Any], edge: Edge,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The conflict is pure: decided before the pod's role, the nesting
    # check or the agent image are read from the apiserver.
    async def no_read(*_: Any, **__: Any) -> Any:
        raise AssertionError("the apiserver was read before the pure refusal")

    monkeypatch.setattr(admission, "pod_role", no_read)
    monkeypatch.setattr(admission.nesting, "refuse_pod", no_read)
    with pytest.raises(kopf.AdmissionError) as refused:
        edge(pod(nodeSelector={"example.com/pool": "hdd"}))
    assert refused.value.code == 422, refused.value
    assert "selected by CheckpointPolicy llama" in str(refused.value)


AFFINE = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
HDD = {"key": "example.com/pool", "operator": "In", "values": ["hdd"]}


def affine(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}


@EDGES
@pytest.mark.parametrize("unselected", [config.UNSELECTED_REFUSE, config.UNSELECTED_FLAG])
def test_a_pod_whose_node_affinity_excludes_the_class_nodes_is_refused_unread(
        cluster: dict[str, Any], edge: Edge, unselected: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_read(*_: Any, **__: Any) -> Any:
        raise AssertionError("the apiserver was read before the pure refusal")

    monkeypatch.setattr(admission, "pod_role", no_read)
    monkeypatch.setattr(admission.nesting, "refuse_pod", no_read)
    cfg = dataclasses.replace(CFG, unselected_pods=unselected)
    with pytest.raises(kopf.AdmissionError) as refused:
        edge(pod(affinity=affine({"matchExpressions": [HDD]})), cfg)
    message = str(refused.value)
    assert refused.value.code == 422, message
    assert f"{AFFINE}.nodeSelectorTerms[0].matchExpressions[0]" in message
    assert "selected by CheckpointPolicy llama" in message
    assert "CheckpointClass team-a" in message and "example.com/pool=nvme" in message
    assert "example.com/pool In [hdd]" in message


@EDGES
def test_a_pod_whose_node_affinity_a_class_node_may_meet_is_placed(
        cluster: dict[str, Any], edge: Edge) -> None:
    either = affine({"matchExpressions": [HDD]}, {"matchExpressions": [
        {"key": "example.com/pool", "operator": "NotIn", "values": ["hdd"]}]})
    spec = edge(pod(affinity=either))["spec"]
    assert spec["nodeSelector"] == {"example.com/pool": "nvme"}
    assert spec["affinity"] == either
