"""PLACEHOLDER, TO BE REPLACED by the real ConversionReview envelope (the
one that calls ckptdrain.contract.policy_versions.convert). It only sets
each object's apiVersion, so that the server's /convert route and the
CRD's conversion wiring can be built and tested before the converter is.

The contract the real one keeps: `review_response(review) -> dict` takes an
apiextensions.k8s.io/v1 ConversionReview and returns the ConversionReview
to send back (response.uid, convertedObjects, result.status).
"""

from __future__ import annotations

from typing import Any


def review_response(review: dict[str, Any]) -> dict[str, Any]:
    """The ConversionReview answering `review` (placeholder: apiVersion only)."""
    request = review.get("request")
    request = request if isinstance(request, dict) else {}
    desired = request.get("desiredAPIVersion")
    objects = request.get("objects")
    response: dict[str, Any] = {"uid": str(request.get("uid") or "")}
    if not isinstance(desired, str) or not isinstance(objects, list):
        response["result"] = {"status": "Failure",
                              "message": "request: expected desiredAPIVersion and objects"}
    else:
        response["convertedObjects"] = [{**o, "apiVersion": desired} for o in objects
                                        if isinstance(o, dict)]
        response["result"] = {"status": "Success"}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": response}
