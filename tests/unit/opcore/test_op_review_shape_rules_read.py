"""Pod fields the injection reads beyond the ones review_shape.py first
checked (resources, volume mounts, the grace period, fsGroup, tolerations,
required node affinity), each of the wrong JSON type, in a review of a pod
a policy with placement selects: an HTTP 400 (BadReview) naming the field
and the type seen, never a failed admission (a 500) or a patch that cannot
apply. Every field of a real pod, through the real process:
tests/cluster/test_webhook_payloads.py (webhook_unread.py)."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.admission.server import BadReview
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.policy import classes

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
SECRET = "hunter2-value"
POLICY = {"metadata": {"name": "llama", "namespace": "ml", "resourceVersion": "1"},
          "spec": {"selector": {"matchLabels": {"app": "a"}}, "model": {"parameters": "7B"},
                   "interval": "10m", "localTier": {"path": "/mnt/ckptdrain/n"},
                   "storage": {"uri": "s3://bucket/p"},
                   "placement": {"tolerations": [{"key": "ckpt", "operator": "Exists"}],
                                 "nodeAffinity": {"matchExpressions": [
                                     {"key": "gpu", "operator": "In", "values": ["h100"]}]}}}}


def pod() -> dict[str, Any]:
    """A selected pod with every field these checks read, well-formed."""
    return {"metadata": {"name": "w-0", "namespace": "ml",
                         "labels": {"app": "a", "ckptdrain.io/inject": "true"}},
            "spec": {"containers": [{
                "name": "trainer", "image": "t", "env": [{"name": "P", "value": SECRET}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "resources": {"limits": {"cpu": 2, "memory": "8Gi"},
                              "requests": {"cpu": "1"}}}],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "terminationGracePeriodSeconds": 120,
                "securityContext": {"fsGroup": 1000},
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule",
                                 "tolerationSeconds": 30}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}}


@pytest.fixture
def reviewer(monkeypatch: pytest.MonkeyPatch) -> admission_process.Reviewer:
    """A reviewer whose view holds POLICY; no apiserver behind it."""
    async def no_classes(timeout: float = 0) -> classes.Catalogue:
        return classes.catalogue([])

    monkeypatch.setattr(admission, "class_catalogue", no_classes)
    monkeypatch.setattr(apiserver_reads, "first_injected_pod", lambda *_: None)
    monkeypatch.setattr(apiserver_reads, "live_writers", lambda *_, **__: [])
    mirror = PolicyMirror()
    mirror.replace([copy.deepcopy(POLICY)], "1")
    return admission_process.Reviewer(CFG, mirror)


def review(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": "CREATE", "namespace": "ml",
                        "object": obj}}


def test_the_well_formed_pod_is_injected_with_a_patch_that_applies(
        reviewer: admission_process.Reviewer) -> None:
    sent = pod()
    answered = asyncio.run(reviewer(review(sent), admission.MUTATE_ID))["response"]
    assert answered["allowed"] is True, answered
    patched = jsonpatch.apply_patch(sent, json.loads(base64.b64decode(answered["patch"])))
    terms = patched["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {e["key"] for e in terms[0]["matchExpressions"]} == {"zone", "gpu"}
    assert {"key": "ckpt", "operator": "Exists"} in patched["spec"]["tolerations"]


SPEC = ("request", "object", "spec")
CONTAINER = (*SPEC, "containers", 0)
AFFINITY = (*SPEC, "affinity", "nodeAffinity")
REQUIRED = (*AFFINITY, "requiredDuringSchedulingIgnoredDuringExecution")


@pytest.mark.parametrize(("path", "value", "message"), [
    ((*CONTAINER, "resources", "limits"), "8Gi",
     "spec.containers[0].resources.limits: expected an object of quantities, got a string"),
    ((*CONTAINER, "resources", "requests"), [1],
     "spec.containers[0].resources.requests: expected an object of quantities, got a list"),
    ((*SPEC, "resources"), {"limits": 3},
     "spec.resources.limits: expected an object of quantities, got a number"),
    ((*CONTAINER, "volumeMounts", 0, "name"), ["data"],
     "spec.containers[0].volumeMounts[0].name: expected a string, got a list"),
    ((*CONTAINER, "volumeMounts", 0, "mountPath"), None,
     "spec.containers[0].volumeMounts[0].mountPath: expected a string, got null"),
    ((*SPEC, "terminationGracePeriodSeconds"), "120",
     "spec.terminationGracePeriodSeconds: expected a whole number of seconds, got a string"),
    ((*SPEC, "terminationGracePeriodSeconds"), True,
     "spec.terminationGracePeriodSeconds: expected a whole number of seconds, got a boolean"),
    ((*SPEC, "securityContext", "fsGroup"), {"gid": 1},
     "spec.securityContext.fsGroup: expected a whole number (a group id), got an object"),
    ((*SPEC, "tolerations"), "gpu",
     "spec.tolerations: expected a list of objects, got a string"),
    ((*SPEC, "tolerations", 0), "gpu",
     "spec.tolerations[0]: expected an object, got a string"),
    ((*SPEC, "tolerations", 0, "key"), ["gpu"],
     "spec.tolerations[0].key: expected a string, got a list"),
    ((*SPEC, "tolerations", 0, "tolerationSeconds"), [30],
     "spec.tolerations[0].tolerationSeconds: expected a whole number of seconds, got a list"),
    (AFFINITY, "wrong", "spec.affinity.nodeAffinity: expected an object, got a string"),
    (REQUIRED, ["x"], "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnored"
                      "DuringExecution: expected an object, got a list"),
    ((*REQUIRED, "nodeSelectorTerms"), {"a": 1}, "nodeSelectorTerms: expected a list of "
                                                 "objects, got an object"),
    ((*REQUIRED, "nodeSelectorTerms", 0, "matchExpressions"), "zone",
     "nodeSelectorTerms[0].matchExpressions: expected a list of objects, got a string"),
    ((*SPEC, "nodeSelector"), "gpu", "spec.nodeSelector: expected an object, got a string"),
])
def test_a_field_the_injection_reads_of_the_wrong_type_is_a_400_naming_it(
        reviewer: admission_process.Reviewer, path: tuple[Any, ...], value: Any,
        message: str) -> None:
    sent = review(pod())
    node: Any = sent
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    with pytest.raises(BadReview) as raised:
        answered = asyncio.run(reviewer(sent, admission.MUTATE_ID))
        pytest.fail(f"answered {answered['response']}")
    assert message in str(raised.value), str(raised.value)
    assert SECRET not in str(raised.value)
