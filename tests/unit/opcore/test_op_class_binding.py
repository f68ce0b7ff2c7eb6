"""A policy's class is bound when it is created: admission's mutation
writes the default class's name into a policy created without one (with a
warning when several classes are marked default), leaves it unset without
a default, refuses while the classes cannot be read; a policy that names
no class is never judged again by class events."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from ckptdrain.operator import class_events, config
from ckptdrain.operator.admission import policy_rules
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.apiserver import class_view
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.policy import classes

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")


def checkpoint_class(name: str, created: str = "2026-11-01T00:00:00Z",
                     default: bool = True, root: str = "/mnt/nvme") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if default:
        meta["annotations"] = {classes.DEFAULT_ANNOTATION: "true"}
    return {"metadata": meta, "spec": {"nodeTier": {"root": root}}}


def policy(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "llama", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "llama"}},
                     "model": {"parameters": "7B"}, "interval": "10m",
                     "localTier": {"path": "/mnt/nvme/n"},
                     "storage": {"uri": "s3://ckpt/ml"}, **spec}}


def bind(body: dict[str, Any], warnings: list[str] | None = None) -> list[dict[str, Any]]:
    return asyncio.run(policy_rules.default_class_patch(body, [] if warnings is None
                                                        else warnings))


def test_a_policy_created_without_a_class_gets_the_default_name(
        no_checkpoint_classes: class_view.ClassView) -> None:
    no_checkpoint_classes.replace([checkpoint_class("std"),
                                   checkpoint_class("fast", default=False)], "1")
    assert bind(policy()) == [{"op": "add", "path": "/spec/checkpointClassName",
                               "value": "std"}]
    assert bind(policy(checkpointClassName="fast")) == []


def test_several_defaults_bind_the_oldest_and_warn(
        no_checkpoint_classes: class_view.ClassView) -> None:
    no_checkpoint_classes.replace([checkpoint_class("newer", "2026-11-02T00:00:00Z"),
                                   checkpoint_class("older", "2026-11-01T00:00:00Z")], "1")
    warnings: list[str] = []
    assert bind(policy(), warnings)[0]["value"] == "older"
    assert "the oldest, older, is the default" in warnings[0]


def test_an_unusable_default_is_bound_and_then_refuses(
        no_checkpoint_classes: class_view.ClassView) -> None:
    no_checkpoint_classes.replace([checkpoint_class("broken", root="relative")], "1")
    [op] = bind(policy())
    assert op["value"] == "broken"
    with pytest.raises(admission.Refused, match="CheckpointClass broken cannot be used"):
        asyncio.run(policy_rules.admit_policy(
            policy(checkpointClassName="broken"), None, "ml", CFG))


def test_without_a_default_a_policy_stays_classless(
        no_checkpoint_classes: class_view.ClassView) -> None:
    no_checkpoint_classes.replace([checkpoint_class("fast", default=False)], "1")
    assert bind(policy()) == []


def test_unreadable_classes_refuse_the_policy_rather_than_leave_it_classless(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class_view.CLASSES.lost()

    def unreachable(*_: Any, **__: Any) -> Any:
        raise apiserver_reads.ApiError(503, "Service Unavailable")
    monkeypatch.setattr(apiserver_reads, "get_json", unreachable)
    with pytest.raises(admission.Refused) as refused:
        bind(policy())
    assert refused.value.code == 503
    assert classes.CLASS_FIELD in str(refused.value)


def review(operation: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": operation, "namespace": "ml",
                        "object": obj, "oldObject": obj if operation == "UPDATE" else None}}


def test_the_admission_process_serves_the_binding_on_create_only(
        no_checkpoint_classes: class_view.ClassView) -> None:
    no_checkpoint_classes.replace([checkpoint_class("std")], "1")
    reports: list[tuple[str, str]] = []
    reviewer = admission_process.Reviewer(CFG, PolicyMirror(),
                                          lambda w, o, s: reports.append((w, o)))
    answer = asyncio.run(reviewer(review("CREATE", policy()),
                                  admission.MUTATE_POLICY_ID))["response"]
    assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(answer["patch"]))[0]["value"] == "std"
    update = asyncio.run(reviewer(review("UPDATE", policy()),
                                  admission.MUTATE_POLICY_ID))["response"]
    assert update["allowed"] is True and "patch" not in update
    assert reports == [("policy-class", "ok"), ("policy-class", "ok")]


def test_a_class_event_never_rejudges_a_classless_policy(
        no_checkpoint_classes: class_view.ClassView) -> None:
    stored = policy()
    # A condition other than what its class would say now (any: a classless
    # policy is not re-judged, whatever it holds).
    stored["status"] = {"conditions": [{
        "type": "ClassResolved", "status": "True", "reason": classes.RESOLVED,
        "message": "CheckpointClass old"}]}
    no_checkpoint_classes.replace([checkpoint_class("std")], "1")  # a default appears
    assert not class_events.stale(CFG, stored)
    named = policy(checkpointClassName="std")
    named["status"] = stored["status"]
    assert class_events.stale(CFG, named)
