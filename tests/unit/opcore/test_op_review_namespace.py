"""A review whose request.namespace is empty for a namespaced object (no
apiserver sends one: forged, or hand-made) is refused by name, 400,
before admission reads anything: neither the namespace's labels (the read
of an empty name raised a bare error, answered as a 500) nor the policies
(an empty namespace lists every namespace's)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.apiserver import class_view, namespace_labels
from ckptdrain.operator.apiserver import reads as apiserver_reads

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
POLICY = {"apiVersion": "ckptdrain.io/v1alpha1", "kind": "CheckpointPolicy",
          "metadata": {"name": "llama"},
          "spec": {"selector": {"matchLabels": {"app": "a"}}, "model": {"parameters": "7B"},
                   "interval": "10m", "localTier": {"path": "/mnt/ckptdrain/n"},
                   "storage": {"uri": "s3://bucket/p"}}}
POD = {"metadata": {"name": "w-0", "labels": {"app": "a", "ckptdrain.io/inject": "true"}},
       "spec": {"containers": [{"name": "trainer", "image": "t"}]}}


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read admission makes, by what it read."""
    made: list[str] = []

    def record(what: str) -> Any:
        def read(*args: Any, **kwargs: Any) -> Any:
            made.append(what)
            raise AssertionError(f"{what} read for an empty namespace")
        return read

    def list_policies(namespace: str, *_: Any) -> list[dict[str, Any]]:
        made.append(f"policies of {namespace!r}")
        return []

    monkeypatch.setattr(apiserver_reads, "list_policies", list_policies)
    monkeypatch.setattr(namespace_labels, "fresh", record("labels"))
    monkeypatch.setattr(namespace_labels, "recent", record("labels"))
    monkeypatch.setattr(class_view, "current", record("classes"))
    return made


def answer(path: str, obj: dict[str, Any]) -> dict[str, Any]:
    reviewer = admission_process.Reviewer(CFG, PolicyMirror(), lambda w, o, s: None)
    request = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "u-1", "operation": "CREATE", "namespace": "",
                           "object": obj}}
    return asyncio.run(reviewer(request, path))["response"]


@pytest.mark.parametrize("path, obj, kind", [
    (admission.MUTATE_ID, POD, "Pod"),
    (admission.VALIDATE_ID, POLICY, "CheckpointPolicy"),
    (admission.MUTATE_POLICY_ID, POLICY, "CheckpointPolicy"),
])
def test_an_empty_namespace_is_refused_by_name_before_any_read(
        reads: list[str], path: str, obj: dict[str, Any], kind: str) -> None:
    found = answer(path, obj)
    assert found["allowed"] is False
    assert found["status"] == {
        "code": 400,
        "message": f"request.namespace: expected the namespace of the {kind} "
                   "(a namespaced kind), got an empty one"}
    assert reads == []


def test_the_objects_own_namespace_stands_in_for_the_requests(
        reads: list[str]) -> None:
    # The request's namespace empty but the object's set: that one is read.
    pod = {**POD, "metadata": {**POD["metadata"], "namespace": "ml"}}
    found = answer(admission.MUTATE_ID, pod)
    assert reads == ["policies of 'ml'"]
    assert found["status"]["code"] == 422
    assert "no CheckpointPolicy in ml selects this pod" in found["status"]["message"]
