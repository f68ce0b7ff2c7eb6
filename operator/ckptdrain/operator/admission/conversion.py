"""The CRD conversion webhook's answer: an apiextensions.k8s.io/v1
ConversionReview in, its response out. Pure; the admission server serves
it at /convert, and the conversion itself is contract/policy_versions.

A Failure makes the apiserver fail the read or write that needed it, so it
is kept for a review that is not what the CRD sends: not a ConversionReview
of v1, or an object that is not a CheckpointPolicy of a known version. Its
message names the field and what was expected, never a stack trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptdrain.contract import policy_versions
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.admission.review_shape import kind_of

REVIEW_API_VERSION = "apiextensions.k8s.io/v1"
REVIEW_KIND = "ConversionReview"


def _converted(request: Mapping[str, Any], consume: bool) -> list[dict[str, Any]]:
    """Each object converted; with `consume`, each original is dropped from
    request.objects as soon as its copy is made, so a large list is never
    held twice."""
    desired = request.get("desiredAPIVersion")
    if not isinstance(desired, str):
        raise InvalidInput("request.desiredAPIVersion", "an apiVersion of CheckpointPolicy",
                           _Seen(desired))
    objects = request.get("objects")
    if not isinstance(objects, list):
        raise InvalidInput("request.objects", "a list of objects", _Seen(objects))
    converted = []
    for index, obj in enumerate(objects):
        if not isinstance(obj, Mapping):
            raise InvalidInput(f"request.objects[{index}]", "a CheckpointPolicy object",
                               _Seen(obj))
        try:
            converted.append(policy_versions.convert(obj, desired))
            if consume:
                objects[index] = None
        except InvalidInput as error:
            where = "request" if error.field == "desiredAPIVersion" else \
                f"request.objects[{index}]"
            raise InvalidInput(f"{where}.{error.field}", error.expected,
                               _said(error.seen)) from None
    return converted


class _Seen(str):
    """A value seen, said as its JSON type ("an object", "a boolean"), as
    review_shape says it for admission, never its value."""

    def __new__(cls, value: Any) -> _Seen:
        return super().__new__(cls, kind_of(value))

    def __repr__(self) -> str:
        return str(self)


def _said(seen: Any) -> Any:
    """What a Failure quotes of a value seen: a short string (an apiVersion,
    a kind) as it was, else its type alone: the objects are a tenant's, and
    a long or structured value may hold what only they should read."""
    if seen is None or isinstance(seen, _Seen) or (isinstance(seen, str) and len(seen) <= 100):
        return seen
    return _Seen(seen)


def review_response(review: Mapping[str, Any], *, consume: bool = False) -> dict[str, Any]:
    """The ConversionReview answering `review`: request.uid echoed, every
    object in request.desiredAPIVersion and status Success, or status
    Failure with a message saying what was wrong (request.uid echoed only
    when it is a string). `consume`: the review is
    the caller's to spend (the server parsed it for this answer alone), and
    its objects are dropped as they are converted."""
    request = review.get("request")
    uid = request.get("uid") if isinstance(request, Mapping) else None
    response: dict[str, Any] = {"uid": uid if isinstance(uid, str) else ""}
    try:
        if review.get("apiVersion") != REVIEW_API_VERSION or review.get("kind") != REVIEW_KIND:
            raise InvalidInput("apiVersion, kind", f"{REVIEW_API_VERSION}, {REVIEW_KIND}",
                               f"{review.get('apiVersion')}, {review.get('kind')}")
        if not isinstance(request, Mapping):
            raise InvalidInput("request", "a conversion request", None if request is None
                               else _Seen(request))
        if not isinstance(uid, str):
            raise InvalidInput("request.uid", "a string", None if uid is None else _Seen(uid))
        response["convertedObjects"] = _converted(request, consume)
        response["result"] = {"status": "Success"}
    except InvalidInput as error:
        response["convertedObjects"] = []
        response["result"] = {"status": "Failure", "message": str(error)}
    return {"apiVersion": REVIEW_API_VERSION, "kind": REVIEW_KIND, "response": response}
