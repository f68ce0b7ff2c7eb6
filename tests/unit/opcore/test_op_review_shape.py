"""Reviews no apiserver sends (admission/review_shape.py), answered by the
reviewer and the converter: refused naming the field and the type seen,
never quoting a value; the uid echoed only when it is a string. The same
cases through the real process: tests/cluster/test_webhook_payloads.py."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import conversion, review_shape
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.admission.server import BadReview

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
SECRET = "hunter2-value"


def pod_review() -> dict[str, Any]:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "labels": {"app": "a"}, "annotations": {"t": SECRET}},
           "spec": {"containers": [{"name": "c", "image": "i",
                                    "env": [{"name": "PASSWORD", "value": SECRET}]}]}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": "CREATE", "namespace": "ml", "object": pod}}


def changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    review = pod_review()
    node = review
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = copy.deepcopy(value)
    return review


@pytest.mark.parametrize(("path", "value", "message"), [
    (("apiVersion",), "admission.k8s.io/v2", "apiVersion, kind: expected one of "
     "admission.k8s.io/v1, admission.k8s.io/v1beta1, AdmissionReview, got another kind "
     "of review"),
    (("kind",), {"k": SECRET}, "apiVersion, kind: expected"),
    (("request",), [SECRET], "request: expected an object, got a list"),
    (("request", "uid"), {"a": SECRET}, "request.uid: expected a string, got an object"),
    (("request", "namespace"), 7, "request.namespace: expected a string, got a number"),
    (("request", "object"), [1], "request.object: expected an object, got a list"),
    (("request", "dryRun"), "yes", "request.dryRun: expected a boolean, got a string"),
    (("request", "object", "spec"), None, "request.object.spec: expected an object, got null"),
    (("request", "object", "metadata", "labels"), [SECRET],
     "request.object.metadata.labels: expected an object of strings, got a list"),
    (("request", "object", "metadata", "annotations", "t"), [SECRET],
     "request.object.metadata.annotations['t']: expected a string, got a list"),
    (("request", "object", "spec", "containers"), {"c": SECRET},
     "request.object.spec.containers: expected a list of objects, got an object"),
    (("request", "object", "spec", "containers", 0, "env", 0, "value"), 12,
     "request.object.spec.containers[0].env[0].value: expected a string, got a number"),
    (("request", "object", "spec", "containers", 0, "env"), [SECRET],
     "request.object.spec.containers[0].env[0]: expected an object, got a string"),
    (("request", "namespace"), "../../api/v1/secrets",
     "request.namespace: expected a namespace's name (an RFC 1123 label), got another string"),
    (("request", "object", "metadata", "namespace"), "Team_A",
     "request.object.metadata.namespace: expected a namespace's name"),
    (("request", "object", "metadata", "name"), "a/../../b",
     "request.object.metadata.name: expected a name with no '/' (one path segment), got a path"),
    (("request", "object", "metadata", "name"), "\ud800",
     "request.object (a string): expected UTF-8 text, got a lone surrogate"),
])
def test_a_malformed_review_is_refused_naming_the_field_never_a_value(
        path: tuple[Any, ...], value: Any, message: str) -> None:
    review = changed(path, value)
    with pytest.raises(review_shape.MalformedReview) as raised:
        review_shape.check_request(review_shape.request_of(review), pod=True)
    assert str(raised.value).startswith(message), str(raised.value)
    assert SECRET not in str(raised.value)


def test_a_well_formed_review_passes() -> None:
    review = pod_review()
    review["request"]["object"]["metadata"]["name"] = "名前\x00"  # text, if odd
    review_shape.check_request(review_shape.request_of(review), pod=True)


def test_what_valid_pods_carry_passes() -> None:
    """A sidecar (an initContainer with restartPolicy Always), env by
    valueFrom alone or with no value, envFrom with a prefix, quantities as
    numbers: all valid, none refused. The same through the real process:
    tests/cluster/webhook_valid.py."""
    review = pod_review()
    spec = review["request"]["object"]["spec"]
    spec["initContainers"] = [{"name": "proxy", "image": "p", "restartPolicy": "Always"}]
    spec["containers"][0]["env"] += [
        {"name": "FROM", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "EMPTY"}]
    spec["containers"][0]["envFrom"] = [{"prefix": "DB_", "secretRef": {"name": "db"}}]
    spec["containers"][0]["resources"] = {"limits": {"cpu": 2, "memory": 8589934592}}
    review_shape.check_request(review_shape.request_of(review), pod=True)


def test_another_kind_sent_to_the_policy_webhook_is_not_judged_as_a_policy() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
              "data": {"password": SECRET}}
    review = pod_review()
    review["request"]["object"] = secret
    reviewer = admission_process.Reviewer(CFG, PolicyMirror())
    answered = asyncio.run(reviewer(review, admission.VALIDATE_ID))
    assert answered["response"] == {"uid": "u-1", "allowed": True}


def answer(review: dict[str, Any], path: str = admission.VALIDATE_ID,
           which: str = "policy") -> dict[str, Any]:
    reports: list[tuple[str, str]] = []
    reviewer = admission_process.Reviewer(CFG, PolicyMirror(),
                                          lambda w, o, s: reports.append((w, o)))
    answered = asyncio.run(reviewer(review, path))
    assert reports == [(which, "error")]
    return answered


def test_the_reviewer_answers_a_malformed_policy_review_as_a_refusal() -> None:
    answered = answer(changed(("request", "uid"), 12))
    assert answered == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                        "response": {"uid": "", "allowed": False, "status": {
                            "code": 400, "message": "ckptdrain admission: request.uid: "
                                                    "expected a string, got a number"}}}
    answered = answer(changed(("apiVersion",), ["x"]))
    assert answered["apiVersion"] == "admission.k8s.io/v1"  # never the review's own
    assert answered["response"]["uid"] == "u-1"
    spec = answer(changed(("request", "object", "metadata", "labels"), [SECRET]))["response"]
    assert spec["uid"] == "u-1" and spec["status"]["code"] == 400
    assert spec["status"]["message"].endswith("(request uid 'u-1')")
    assert SECRET not in str(spec)


def test_a_malformed_pod_review_is_a_webhook_failure_its_policy_decides() -> None:
    """HTTP 400 rather than a review refusing the pod: with the pod
    webhook's failurePolicy Ignore the pod is admitted (uninjected), as it
    would be were the webhook unreachable."""
    with pytest.raises(BadReview) as raised:
        answer(changed(("request", "object", "spec", "volumes"), [SECRET]),
               admission.MUTATE_ID, "pod")
    assert str(raised.value) == (
        "ckptdrain admission: request.object.spec.volumes[0]: expected an object, "
        "got a string (request uid 'u-1')")


def conversion_review(**request: Any) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "c-1", "desiredAPIVersion": "ckptdrain.io/v1beta1",
                        "objects": [], **request}}


@pytest.mark.parametrize(("request_part", "uid", "message"), [
    ({"uid": True}, "", "request.uid: expected a string, got a boolean"),
    ({"uid": {"a": SECRET}}, "", "request.uid: expected a string, got an object"),
    ({"desiredAPIVersion": {"a": SECRET}}, "c-1",
     "request.desiredAPIVersion: expected an apiVersion of CheckpointPolicy, got an object"),
    ({"objects": [{"apiVersion": {"a": SECRET}, "kind": "CheckpointPolicy"}]}, "c-1",
     "request.objects[0].apiVersion: expected ckptdrain.io/v1alpha1 or "
     "ckptdrain.io/v1beta1, got an object"),
    ({"objects": [[SECRET]]}, "c-1",
     "request.objects[0]: expected a CheckpointPolicy object, got a list"),
    ({"objects": "x" * 200}, "c-1", "request.objects: expected a list of objects, got a string"),
    ({"objects": [{"apiVersion": "ckptdrain.io/v1beta1", "kind": True}]}, "c-1",
     "request.objects[0].kind: expected CheckpointPolicy, got a boolean"),
])
def test_a_conversion_failure_echoes_a_string_uid_and_no_value(
        request_part: dict[str, Any], uid: str, message: str) -> None:
    response = conversion.review_response(conversion_review(**request_part))["response"]
    assert response["uid"] == uid
    assert response["result"] == {"status": "Failure", "message": message}
