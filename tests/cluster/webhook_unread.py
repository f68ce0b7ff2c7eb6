"""Pod reviews whose fields hold a value of the wrong JSON type, every field
of a real pod in turn (test_webhook_payloads.py): a pod as the apiserver
hands it to admission (a Job's, defaulted), and each field of it, object,
list, item or scalar, whether the rules read it or not, set to a value of
each JSON type it does not have. Pure: the same cases in the same order on
every run.

What an answer to one must be (unread_problems): a 400 naming the field; a
refusal naming it; or an admission whose JSONPatch (RFC 6902) still
applies to the very object that was sent, as the apiserver would apply it.
A pod the apiserver's schema admitted never looks like these, but anything
that reaches the webhook's port may post one."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import jsonpatch
from webhook_payloads import MARKER, POD_PATH, Case, admission, get_at, paths

#: One value of each JSON type; a field is given each that is not its own.
#: No MARKER in them: a patch may carry a field the pod sent back to it
#: (its affinity, merged), which is no leak; the pod's secrets stay planted.
VALUES: tuple[tuple[str, Any], ...] = (
    ("null", None), ("a boolean", True), ("a number", 7), ("a string", "wrong"),
    ("a list", ["wrong"]), ("an object", {"wrong": "x"}))
KIND = "wrong type at any pod field"


def real_pod(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """A Job's trainer pod as the apiserver hands it to admission: defaults
    filled in, the fields a real training pod sets, MARKER where a tenant
    keeps secrets."""
    container = {
        "name": "trainer", "image": "trainer:1", "command": ["python", "train.py"],
        "args": ["--steps", "1000"], "workingDir": "/work",
        "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
        "env": [{"name": "DB_PASSWORD", "value": MARKER},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "envFrom": [{"secretRef": {"name": "tokens"}}],
        "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "64Gi"},
                      "requests": {"cpu": "8", "memory": "64Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 9090, "scheme": "HTTP"},
                          "periodSeconds": 10, "failureThreshold": 3},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
        "securityContext": {"runAsUser": 1000, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
        "stdin": False, "tty": False}
    spec = {
        "containers": [container],
        "initContainers": [{"name": "fetch", "image": "fetch:1", "command": ["fetch"],
                            "resources": {}, "imagePullPolicy": "IfNotPresent"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "cfg", "configMap": {"name": "cfg", "defaultMode": 420}}],
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 120,
        "activeDeadlineSeconds": 86400, "dnsPolicy": "ClusterFirst",
        "nodeSelector": {"gpu": "h100"}, "serviceAccountName": "trainer",
        "serviceAccount": "trainer", "automountServiceAccountToken": False,
        "hostNetwork": False, "hostPID": False, "hostIPC": False,
        "shareProcessNamespace": False,
        "securityContext": {"fsGroup": 1000, "runAsNonRoot": True, "supplementalGroups": [5]},
        "imagePullSecrets": [{"name": "registry"}], "hostname": "trainer-0",
        "subdomain": "trainers",
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        "schedulerName": "default-scheduler",
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                         "effect": "NoExecute", "tolerationSeconds": 300}],
        "priorityClassName": "training", "priority": 1000,
        "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
        "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                                       "whenUnsatisfiable": "ScheduleAnyway",
                                       "labelSelector": {"matchLabels": {"app": "x"}}}],
        "os": {"name": "linux"}, "schedulingGates": [{"name": "quota"}],
        "readinessGates": [{"conditionType": "example.com/ready"}]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "trainer-", "namespace": namespace,
                         "labels": {**labels, "job-name": "trainer"},
                         "annotations": {"example.com/api-token": MARKER},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                              "name": "trainer", "uid": "j-1",
                                              "controller": True,
                                              "blockOwnerDeletion": True}],
                         "finalizers": ["batch.kubernetes.io/job-tracking"]},
            "spec": spec}


#: Not changed: a pod's apiVersion and kind (the review's business, not
#: the pod's); nor, in cases(), the label the policy selects the pod by,
#: without which it would not reach the rules (a wrong type there is the
#: shape check's, already in webhook_payloads.py).
_KEPT = {("apiVersion",), ("kind",)}


def fields(node: Any) -> Iterator[tuple[Any, ...]]:
    """Every field under `node` (objects' members, lists' items), depth first."""
    return (at for at in paths(node) if at not in _KEPT)


def json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}[type(value)]


def named(at: tuple[Any, ...]) -> str:
    """The field as a refusal names it (admission/review_shape.py):
    `request.object.spec.containers[0].ports`, a label `labels['app']`."""
    text = "request.object"
    for parent, step in zip((None, *at), at, strict=False):
        if isinstance(step, int):
            text += f"[{step}]"
        elif parent in ("labels", "annotations"):
            text += f"[{step[:63]!r}]"
        else:
            text += f".{step}"
    return text


def cases(uids: Iterator[str], namespace: str, labels: dict[str, str]) -> Iterator[Case]:
    """Each field of real_pod() set to each JSON type it does not have, as a
    CREATE review; the Case's uid is its own, its `changed` the field changed."""
    base = real_pod(namespace, labels)
    for at in fields(base):
        if at == ("metadata", "labels", next(iter(labels))):
            continue  # the selecting label: see _KEPT
        own = json_type(get_at(base, at))
        for kind, value in VALUES:
            if kind == own:
                continue
            obj = copy.deepcopy(base)
            get_at(obj, at[:-1])[at[-1]] = copy.deepcopy(value)
            uid = next(uids)
            yield Case(KIND, POD_PATH, json.dumps(admission(uid, namespace, obj)).encode(),
                       uid=uid, changed=named(at))


def unread_problems(case: Case, status: int, body: bytes) -> list[str]:
    """What is wrong with the answer to one of cases() beyond what
    webhook_probe.problems() checks: a 4xx or a refusal that does not name
    the changed field, or a patch that does not apply to the sent pod."""
    assert case.changed is not None
    try:
        answer = json.loads(body)
    except ValueError:
        return []  # webhook_probe.problems says so
    if not isinstance(answer, dict):
        return []
    if 400 <= status < 500:
        message = str(answer.get("message") or answer.get("error") or "")
        return [] if _names(message, case.changed) else [
            f"a {status} that does not name {case.changed}: {message[:300]!r}"]
    response = answer.get("response") if status == 200 else None
    if not isinstance(response, dict):
        return []
    if response.get("allowed") is False:
        message = str((response.get("status") or {}).get("message") or "")
        return [] if _names(message, case.changed) else [
            f"a refusal that does not name {case.changed}: {message[:300]!r}"]
    if "patch" not in response:
        return []
    sent = json.loads(case.body)["request"]["object"]
    try:
        ops = json.loads(base64.b64decode(response["patch"]))
        jsonpatch.apply_patch(sent, ops)
    except (ValueError, TypeError, jsonpatch.JsonPatchException,
            jsonpatch.JsonPointerException) as error:
        return [f"a patch that does not apply to the sent pod ({type(error).__name__}: "
                f"{str(error)[:200]})"]
    return []


def _names(message: str, field: str) -> bool:
    """`message` names `field` (as the shape check does, or as the rules do,
    from the pod: `spec.containers[0].ports`)."""
    return field.removeprefix("request.object.") in message
