"""Valid reviews, shaped as an apiserver sends them, that the admission
process must admit (a pod the sample's policy selects: with a patch) and
conversions it must answer Success. Without them the sample could not tell
a hostile body's refusal from a valid one's: a review refused with 400
passes as a 4xx naming its field. Pure, like webhook_payloads.py."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from webhook_payloads import (
    ALLOWED,
    CONVERT_PATH,
    PATCHED,
    POD_PATH,
    POLICY_CLASS_PATH,
    POLICY_PATH,
    SUCCESS,
    Corpus,
    admission,
    conversion,
    pod,
    policy,
)

#: An RFC 1123 label as long as a namespace's name may be.
LONG_NAMESPACE = "n" + "s" * 61 + "0"
ODD_TEXT = "línea\u2028párrafo\u2029名前 😀 \t\"quoted\" \\ end"


def valid_pods(corpus: Corpus) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what, pod) of valid pods the sample's policy selects."""
    base = pod(corpus.namespace, corpus.labels)
    job = copy.deepcopy(base)
    del job["metadata"]["name"]
    job["metadata"].update(generateName="trainer-", finalizers=[
        "batch.kubernetes.io/job-tracking"], ownerReferences=[{
            "apiVersion": "batch/v1", "kind": "Job", "name": "trainer",
            "uid": "6f1c5b9e-0f0e-4c55-9d6b-0a9e0c1e2f3a", "controller": True,
            "blockOwnerDeletion": True}])
    yield "a Job's pod (generateName, ownerReference, finalizer)", job
    sidecar = copy.deepcopy(base)
    sidecar["spec"]["initContainers"] = [{"name": "proxy", "image": "proxy:1",
                                          "restartPolicy": "Always"},
                                         {"name": "setup", "image": "setup:1"}]
    yield "a sidecar initContainer (restartPolicy Always)", sidecar
    volumes = copy.deepcopy(base)
    volumes["spec"]["volumes"] = [
        {"name": "csi", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True,
                                "volumeAttributes": {"secretProviderClass": "p"}}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
            "metadata": {"labels": {"type": "scratch"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                     "resources": {"requests": {"storage": "1Gi"}}}}}},
        {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}},
        {"name": "projected", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
            {"configMap": {"name": "c", "items": [{"key": "k", "path": "k"}]}},
            {"downwardAPI": {"items": [{"path": "labels",
                                        "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]
    volumes["spec"]["serviceAccountName"] = "default"  # what a token volume needs
    volumes["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "shm", "mountPath": "/dev/shm"}, {"name": "scratch", "mountPath": "/scratch"}]
    yield "volumes: csi, ephemeral, hostPath, projected, emptyDir", volumes
    env = copy.deepcopy(base)
    env["spec"]["containers"][0]["env"] += [
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "EMPTY"}, {"name": "BLANK", "value": ""}]
    env["spec"]["containers"][0]["envFrom"] = [
        {"prefix": "DB_", "secretRef": {"name": "db"}},
        {"configMapRef": {"name": "cfg", "optional": True}}]
    yield "env by valueFrom only, with no value; envFrom with a prefix", env
    numbers = copy.deepcopy(base)
    numbers["spec"]["containers"][0]["resources"] = {
        "limits": {"cpu": 2, "memory": 8589934592, "nvidia.com/gpu": 8},
        "requests": {"cpu": 0.5, "memory": "4Gi"}}
    yield "resource quantities as JSON numbers", numbers
    odd = copy.deepcopy(base)
    odd["metadata"]["annotations"]["example.com/note"] = ODD_TEXT
    odd["metadata"]["labels"] = {**corpus.labels, "empty": "", "example.com/tier": ""}
    yield "unicode (U+2028) in annotations, empty label values", odd
    status = copy.deepcopy(base)
    status["status"] = {"phase": "Pending", "qosClass": "BestEffort", "conditions": []}
    status["metadata"].update(uid="0c3e5d9a-1b2c-4d5e-8f90-a1b2c3d4e5f6",
                              creationTimestamp="2026-11-30T10:00:00Z", managedFields=[{
                                  "manager": "kube-controller-manager", "operation": "Update",
                                  "apiVersion": "v1", "time": "2026-11-30T10:00:00Z",
                                  "fieldsType": "FieldsV1", "fieldsV1": {
                                      "f:metadata": {"f:labels": {".": {}}}}}])
    yield "status and managedFields present", status


def valid_cases(corpus: Corpus) -> Iterator[Any]:
    """The Cases, each with what its answer must be."""
    for what, obj in valid_pods(corpus):
        yield corpus.case(f"valid: {what}", POD_PATH, corpus.pod_review(obj), expect=PATCHED)
    beta = corpus.pod_review()
    beta["apiVersion"] = "admission.k8s.io/v1beta1"
    yield corpus.case("valid: admission.k8s.io/v1beta1", POD_PATH, beta, expect=PATCHED)
    # A namespace no policy is in: a pod that did not opt in is let be.
    far = pod(LONG_NAMESPACE, {"app": "elsewhere"})
    yield corpus.case("valid: a 63-character namespace", POD_PATH,
                      admission(corpus.uid(), LONG_NAMESPACE, far), expect=ALLOWED)
    for path, kind, group in ((POD_PATH, "Pod", ""),
                              (POLICY_PATH, "CheckpointPolicy", "ckptdrain.io"),
                              (POLICY_CLASS_PATH, "CheckpointPolicy", "ckptdrain.io")):
        old = pod(corpus.namespace, corpus.labels) if not group else policy(corpus.namespace)
        gone = admission(corpus.uid(), corpus.namespace, None, kind, group, "DELETE")
        gone["request"]["oldObject"] = old
        yield corpus.case("valid: DELETE, object null", path, gone, expect=ALLOWED)
    debug = admission(corpus.uid(), corpus.namespace, pod(corpus.namespace, corpus.labels),
                      operation="UPDATE")
    debug["request"].update(subResource="ephemeralcontainers", dryRun=True,
                            oldObject=pod(corpus.namespace, corpus.labels))
    debug["request"]["object"]["spec"]["ephemeralContainers"] = [{
        "name": "debugger", "image": "busybox:1", "targetContainerName": "trainer",
        "stdin": True, "tty": True}]
    yield corpus.case("valid: UPDATE ephemeralcontainers, dryRun", POD_PATH, debug,
                      expect=ALLOWED)
    for desired in ("ckptdrain.io/v1beta1", "ckptdrain.io/v1alpha1"):
        objects = [policy(corpus.namespace) for _ in range(3)]
        objects[1]["metadata"].update(labels={"empty": ""}, generateName="p-", annotations={
            "example.com/note": ODD_TEXT})
        objects[2]["status"] = {"phase": "Ready", "conditions": [{
            "type": "Ready", "status": "True", "reason": "Valid", "message": ODD_TEXT,
            "lastTransitionTime": "2026-11-30T10:00:00Z", "observedGeneration": 3}]}
        objects[2]["metadata"]["managedFields"] = [{
            "manager": "kubectl", "operation": "Apply", "apiVersion": "ckptdrain.io/v1alpha1",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:interval": {}}}}]
        yield corpus.case("valid: conversion", CONVERT_PATH,
                          conversion(corpus.uid(), desired, objects), expect=SUCCESS)
    yield corpus.case("valid: conversion of no objects", CONVERT_PATH,
                      conversion(corpus.uid(), "ckptdrain.io/v1beta1", []), expect=SUCCESS)
