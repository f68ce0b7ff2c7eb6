"""What admission reads of an AdmissionReview, checked before the rules
read it. The apiserver sends only reviews of objects its schemas admitted,
but anything that reaches the webhook's port may post one of its own
making: a field of the wrong type would otherwise fail deep in the rules as
a bare error (a 500, its message quoting the value). Each problem is
refused naming the field and what was expected, and saying only the type
of what was seen, never its value (an env value or an annotation may be a
secret). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ckptdrain.errors import InvalidInput

ADMISSION_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
REVIEW_KIND = "AdmissionReview"
#: Metadata a rule reads, and the type each must have when present.
_META_STRINGS = ("name", "namespace", "generateName", "uid", "resourceVersion",
                 "deletionTimestamp", "creationTimestamp")
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
_CONTAINER_OBJECT_LISTS = ("env", "envFrom", "volumeMounts", "ports", "volumeDevices")
_CONTAINER_OBJECTS = ("resources", "securityContext", "lifecycle")


#: A namespace's name (an RFC 1123 label), as the apiserver allows it:
#: admission puts it in the paths of its reads.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


class MalformedReview(InvalidInput):
    """A review no apiserver sends: refused (400) naming the field; `seen`
    is what kind_of() says, never the value."""

    def __init__(self, field: str, expected: str, seen: str) -> None:
        super().__init__(field, expected, seen)
        self.args = (f"{field}: expected {expected}, got {seen}",)


def kind_of(value: Any) -> str:
    """What a refusal says was seen: the JSON type, never the value."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value), "?")


def _expect(value: Any, kind: type | tuple[type, ...], field: str, expected: str) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedReview(field, expected, kind_of(value))


def request_of(review: Mapping[str, Any]) -> dict[str, Any]:
    """The review's request, once the envelope is an AdmissionReview whose
    request is an object with a string uid; else MalformedReview."""
    version, kind = review.get("apiVersion"), review.get("kind")
    if version not in ADMISSION_VERSIONS or kind != REVIEW_KIND:
        raise MalformedReview("apiVersion, kind", f"one of {', '.join(ADMISSION_VERSIONS)}, "
                              f"{REVIEW_KIND}", "another kind of review")
    request = review.get("request")
    _expect(request, dict, "request", "an object")
    _expect(request.get("uid"), str, "request.uid", "a string")
    for name in ("operation", "namespace", "name"):
        if request.get(name) is not None:
            _expect(request[name], str, f"request.{name}", "a string")
    for name in ("object", "oldObject", "requestKind", "kind", "resource", "userInfo"):
        if request.get(name) is not None:
            _expect(request[name], dict, f"request.{name}", "an object")
    if request.get("dryRun") is not None:
        _expect(request["dryRun"], bool, "request.dryRun", "a boolean")
    _names(request, "request")
    return request


def _names(holder: Mapping[str, Any], where: str) -> None:
    """`holder`'s namespace and name, when given, fit in an API path as one
    segment each: neither climbs out of it (`../..`) nor adds a segment."""
    namespace, name = holder.get("namespace"), holder.get("name")
    if namespace and not _NAMESPACE.match(namespace):
        raise MalformedReview(f"{where}.namespace", "a namespace's name (an RFC 1123 label)",
                              "another string")
    if name and ("/" in name or name in (".", "..")):
        raise MalformedReview(f"{where}.name", "a name with no '/' (one path segment)",
                              "a path")


def refusal(review: Mapping[str, Any], error: MalformedReview) -> dict[str, Any]:
    """The AdmissionReview answering `review`, which `error` refused: a 400
    naming the field; the uid echoed only when it is a string, nothing else
    of the review."""
    request = review.get("request")
    uid = request.get("uid") if isinstance(request, Mapping) else None
    version = review.get("apiVersion")
    return {"apiVersion": version if version in ADMISSION_VERSIONS else ADMISSION_VERSIONS[0],
            "kind": REVIEW_KIND,
            "response": {"uid": uid if isinstance(uid, str) else "", "allowed": False,
                         "status": {"message": f"ckptdrain admission: {error}"
                                               + (f" (request uid {uid[:64]!r})"
                                                  if isinstance(uid, str) else ""),
                                    "code": 400}}}


def check_request(request: Mapping[str, Any], pod: bool) -> None:
    """The objects of a request whose envelope request_of() checked: their
    metadata (and a pod's containers and volumes, with `pod`) of the
    types the rules read; no string that is not text."""
    for name, value in request.items():
        if name != "uid":  # echoed as it came, never encoded otherwise
            _text(value, f"request.{name}")
    for name in ("object", "oldObject"):
        obj = request.get(name)
        if obj is None:
            continue
        where = f"request.{name}"
        # Present means an object: the rules read `obj.get("spec", {})`.
        if "metadata" in obj:
            _metadata(obj["metadata"], f"{where}.metadata")
        if "spec" in obj:
            _expect(obj["spec"], dict, f"{where}.spec", "an object")
            if pod:
                _pod_spec(obj["spec"], f"{where}.spec")


def _metadata(meta: Any, where: str) -> None:
    _expect(meta, dict, where, "an object")
    for name in _META_STRINGS:
        if meta.get(name) is not None:
            _expect(meta[name], str, f"{where}.{name}", "a string")
    _names(meta, where)
    for name in ("labels", "annotations"):
        if meta.get(name) is not None:
            _expect(meta[name], dict, f"{where}.{name}", "an object of strings")
            for key, value in meta[name].items():
                _expect(value, str, f"{where}.{name}[{key[:63]!r}]", "a string")
    for name in ("ownerReferences", "managedFields"):
        _objects(meta.get(name), f"{where}.{name}")
    if meta.get("finalizers") is not None:
        _expect(meta["finalizers"], list, f"{where}.finalizers", "a list of strings")
        for index, item in enumerate(meta["finalizers"]):
            _expect(item, str, f"{where}.finalizers[{index}]", "a string")


def _pod_spec(spec: Mapping[str, Any], where: str) -> None:
    for name in _CONTAINER_LISTS:
        for index, container in enumerate(_objects(spec.get(name), f"{where}.{name}")):
            _container(container, f"{where}.{name}[{index}]")
    for index, volume in enumerate(_objects(spec.get("volumes"), f"{where}.volumes")):
        _expect(volume.get("name"), str, f"{where}.volumes[{index}].name", "a string")
    for name in ("serviceAccountName", "nodeName", "schedulerName"):
        _optional(spec, name, str, where, "a string")
    for name in ("securityContext", "affinity", "nodeSelector"):
        _optional(spec, name, dict, where, "an object")
    # The flush must fit in the grace period (pod_env.py); the work dir is
    # shared through the pod's fsGroup (work_dir.py).
    _optional(spec, "terminationGracePeriodSeconds", int, where, "a whole number of seconds")
    _optional(spec.get("securityContext") or {}, "fsGroup", int, f"{where}.securityContext",
              "a whole number (a group id)")
    _resources(spec, where)
    _placement(spec, where)


def _container(container: Mapping[str, Any], at: str) -> None:
    for field in ("name", "image", "restartPolicy"):
        if container.get(field) is not None or field == "name":
            _expect(container.get(field), str, f"{at}.{field}", "a string")
    for field in _CONTAINER_OBJECT_LISTS:
        _objects(container.get(field), f"{at}.{field}")
    for field in _CONTAINER_OBJECTS:
        _optional(container, field, dict, at, "an object")
    for index, env in enumerate(container.get("env") or []):
        _env(env, f"{at}.env[{index}]")
    # Matched against the mounts injection adds (cloud_identity.py,
    # tenant_identity.py): by name and by path.
    for index, mount in enumerate(container.get("volumeMounts") or []):
        for field in ("name", "mountPath"):
            _expect(mount.get(field), str, f"{at}.volumeMounts[{index}].{field}", "a string")
    _resources(container, at)


def _resources(holder: Mapping[str, Any], where: str) -> None:
    """A container's (or the pod's) requests and limits, which the pod's QoS
    class is read from (resources.py): objects of quantities."""
    _optional(holder, "resources", dict, where, "an object")
    for name in ("requests", "limits"):
        _optional(holder.get("resources") or {}, name, dict, f"{where}.resources",
                  "an object of quantities")


def _placement(spec: Mapping[str, Any], where: str) -> None:
    """The tolerations and required node affinity that a policy's and a
    class's placement are merged into (pod_placement.py, class_placement.py)."""
    for index, toleration in enumerate(_objects(spec.get("tolerations"),
                                                f"{where}.tolerations")):
        at = f"{where}.tolerations[{index}]"
        for name in ("key", "operator", "value", "effect"):
            _optional(toleration, name, str, at, "a string")
        _optional(toleration, "tolerationSeconds", int, at, "a whole number of seconds")
    at = f"{where}.affinity"
    _optional(spec.get("affinity") or {}, "nodeAffinity", dict, at, "an object")
    node = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    _optional(node, required, dict, f"{at}.nodeAffinity", "an object")
    at = f"{at}.nodeAffinity.{required}.nodeSelectorTerms"
    for index, term in enumerate(_objects((node.get(required) or {}).get("nodeSelectorTerms"),
                                          at)):
        for name in ("matchExpressions", "matchFields"):
            _objects(term.get(name), f"{at}[{index}].{name}")


def _optional(holder: Mapping[str, Any], name: str, kind: type, where: str,
              expected: str) -> None:
    """`holder[name]`, when present and not null, is of `kind`."""
    if holder.get(name) is not None:
        _expect(holder[name], kind, f"{where}.{name}", expected)


def _env(env: Mapping[str, Any], where: str) -> None:
    _expect(env.get("name"), str, f"{where}.name", "a string")
    if env.get("value") is not None:
        _expect(env["value"], str, f"{where}.value", "a string")
    if env.get("valueFrom") is not None:
        _expect(env["valueFrom"], dict, f"{where}.valueFrom", "an object")


def _objects(value: Any, where: str) -> list[dict[str, Any]]:
    """`value`, a list of objects (None: an empty one)."""
    if value is None:
        return []
    _expect(value, list, where, "a list of objects")
    for index, item in enumerate(value):
        _expect(item, dict, f"{where}[{index}]", "an object")
    return value


def _text(root: Any, where: str) -> None:
    """No key or string value under `root` holds a lone surrogate (a JSON
    escape no apiserver writes, which no encoder can write back out)."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if not _is_text(key):
                    raise MalformedReview(f"{where} (a key)", "UTF-8 text", "a lone surrogate")
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and not _is_text(node):
            raise MalformedReview(f"{where} (a string)", "UTF-8 text", "a lone surrogate")


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
