"""The conversion webhook's envelope: a ConversionReview (apiextensions.k8s.io/v1)
answered with the request's uid, every object converted, Success; or Failure
with a message naming what was wrong, for a review the CRD would not send."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ckptdrain.operator.admission.conversion import review_response

UID = "705ab4f5-6393-11e8-b7cc-42010a800002"


def policy(api_version: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "CheckpointPolicy",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                         "labels": {"a": "b"}},
            "spec": spec}


def review(desired: object, *objects: object, **request: Any) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": UID, "desiredAPIVersion": desired, "objects": list(objects),
                        **request}}


def test_every_object_is_converted_and_the_uid_echoed() -> None:
    objects = [policy("ckptdrain.io/v1alpha1", interval="1d", model={"parameters": "405B"}),
               policy("ckptdrain.io/v1beta1", interval="15m", overlap="5%"),
               policy("ckptdrain.io/v1alpha1", overlap="0.1")]
    asked = review("ckptdrain.io/v1beta1", *objects)
    before = copy.deepcopy(asked)
    answer = review_response(asked)
    assert asked == before
    assert answer["apiVersion"] == "apiextensions.k8s.io/v1"
    assert answer["kind"] == "ConversionReview"
    response = answer["response"]
    assert response["uid"] == UID and response["result"] == {"status": "Success"}
    converted = response["convertedObjects"]
    assert [o["apiVersion"] for o in converted] == ["ckptdrain.io/v1beta1"] * 3
    assert [o["metadata"] for o in converted] == [o["metadata"] for o in objects]
    assert [o["spec"] for o in converted] == [
        {"interval": "24h", "model": {"parameters": "405G"}},
        {"interval": "15m", "overlap": "5%"}, {"overlap": "10%"}]
    json.dumps(answer)  # what the server sends


def test_back_to_the_stored_version() -> None:
    answer = review_response(review("ckptdrain.io/v1alpha1", policy(
        "ckptdrain.io/v1beta1", model={"parameters": 405000000000, "bytesPerParameter": "12.5"})))
    (converted,) = answer["response"]["convertedObjects"]
    assert converted["apiVersion"] == "ckptdrain.io/v1alpha1"
    assert converted["spec"] == {"model": {"parameters": "405000000000",
                                           "bytesPerParameter": 12.5}}


def test_no_objects_is_an_empty_success() -> None:
    response = review_response(review("ckptdrain.io/v1beta1"))["response"]
    assert response == {"uid": UID, "convertedObjects": [], "result": {"status": "Success"}}


def test_a_value_that_does_not_read_converts_unchanged_rather_than_failing() -> None:
    answer = review_response(review("ckptdrain.io/v1beta1", policy(
        "ckptdrain.io/v1alpha1", interval="a while", caps={"bandwidth": "1kiB/s"})))
    assert answer["response"]["result"] == {"status": "Success"}
    assert answer["response"]["convertedObjects"][0]["spec"] == {
        "interval": "a while", "caps": {"bandwidth": "1kiB/s"}}


@pytest.mark.parametrize(("asked", "message"), [
    (review("ckptdrain.io/v1beta1", policy("ckptdrain.io/v1alpha1"), {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}),
     "request.objects[1].kind: expected CheckpointPolicy, got 'Pod'"),
    (review("ckptdrain.io/v1beta1", policy("ckptdrain.io/v2")),
     "request.objects[0].apiVersion: expected ckptdrain.io/v1alpha1 or ckptdrain.io/v1beta1,"
     " got 'ckptdrain.io/v2'"),
    (review("ckptdrain.io/v1beta1", "a string"),
     "request.objects[0]: expected a CheckpointPolicy object, got a string"),
    (review("ckptdrain.io/v2", policy("ckptdrain.io/v1alpha1")),
     "request.desiredAPIVersion: expected ckptdrain.io/v1alpha1 or ckptdrain.io/v1beta1, "
     "got 'ckptdrain.io/v2'"),
    (review("ckptdrain.io/v1beta1", objects={"a": 1}),
     "request.objects: expected a list of objects, got an object"),
    ({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview"},
     "request: expected a conversion request, nothing was given"),
    ({**review("ckptdrain.io/v1beta1"), "apiVersion": "apiextensions.k8s.io/v1beta1"},
     "apiVersion, kind: expected apiextensions.k8s.io/v1, ConversionReview, "
     "got 'apiextensions.k8s.io/v1beta1, ConversionReview'"),
    ({**review("ckptdrain.io/v1beta1"), "kind": "AdmissionReview"},
     "apiVersion, kind: expected apiextensions.k8s.io/v1, ConversionReview, "
     "got 'apiextensions.k8s.io/v1, AdmissionReview'"),
])
def test_a_review_the_crd_would_not_send_fails_naming_what_was_wrong(
        asked: dict[str, Any], message: str) -> None:
    response = review_response(asked)["response"]
    assert response["result"] == {"status": "Failure", "message": message}
    assert response["convertedObjects"] == []
    assert response["uid"] == (UID if isinstance(asked.get("request"), dict) else "")
    assert "Traceback" not in message
