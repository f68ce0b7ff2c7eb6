"""The policy webhooks given CheckpointPolicies at v1beta1, as the chart's
webhook rules (`apiVersions: ["*"]`) send them in a cluster: unconverted,
in v1beta1's spellings. The operator reads the object at v1alpha1, so each
verdict must be the one the same object gets once converted."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from typing import Any

import pytest

from ckptdrain.contract.policy_versions import V1ALPHA1, V1BETA1, to_v1alpha1, to_v1beta1
from ckptdrain.operator import config
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.admission.policy_rules import validate_policy
from ckptdrain.operator.apiserver import class_view
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.policy import classes

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")


def beta_policy(**spec: Any) -> dict[str, Any]:
    """A v1beta1 policy in v1beta1's own spellings: an integer capacity, a
    fractional bytesPerParameter as a string, a compound Go duration, a
    fractional percentage."""
    body: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "llama"}},
        "model": {"parameters": "70G", "bytesPerParameter": "12.5"},
        "interval": "1h30m", "mtti": "24h", "localWriteTime": "30s", "overlap": "12.5%",
        "writers": 2,
        "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2, "capacity": 20_000_000_000_000},
        "caps": {"bandwidth": "10G"},
        "restore": {"retryDeadline": "10m"},
        "storage": {"uri": "s3://bucket/llama"}}
    body.update(spec)
    return {"apiVersion": V1BETA1, "kind": "CheckpointPolicy",
            "metadata": {"name": "llama", "namespace": "ml"}, "spec": body}


def review(operation: str, obj: dict[str, Any], old: dict[str, Any] | None = None
           ) -> dict[str, Any]:
    """An AdmissionReview as the apiserver sends it for a request at the
    object's own version (no equivalent-version conversion)."""
    version = obj["apiVersion"].partition("/")[2]
    request: dict[str, Any] = {
        "uid": "u-1", "operation": operation, "namespace": "ml",
        "kind": {"group": "ckptdrain.io", "version": version, "kind": "CheckpointPolicy"},
        "resource": {"group": "ckptdrain.io", "version": version,
                     "resource": "checkpointpolicies"},
        "object": obj}
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


@pytest.fixture
def reviewer(monkeypatch: pytest.MonkeyPatch) -> admission_process.Reviewer:
    """The admission process's Reviewer, the apiserver's reads answering
    "no other policy, no live pod"."""
    monkeypatch.setattr(apiserver_reads, "list_policies", lambda namespace, timeout=5: [])
    monkeypatch.setattr(apiserver_reads, "first_injected_pod", lambda *_: None)
    return admission_process.Reviewer(CFG, PolicyMirror())


def answer(reviewer: admission_process.Reviewer, path: str, request: dict[str, Any]
           ) -> dict[str, Any]:
    return dict(asyncio.run(reviewer(request, path))["response"])


def test_a_v1beta1_policy_in_v1beta1_spellings_is_admitted_and_updated(
        reviewer: admission_process.Reviewer) -> None:
    created = beta_policy()
    got = answer(reviewer, admission.VALIDATE_ID, review("CREATE", created))
    assert (got["allowed"], got.get("status")) == (True, None)
    changed = beta_policy(interval="45m", overlap="7.5%", mtti="1h30m")
    got = answer(reviewer, admission.VALIDATE_ID, review("UPDATE", changed, created))
    assert (got["allowed"], got.get("status")) == (True, None)


def test_a_v1beta1_policy_outside_the_allowed_root_is_refused_naming_the_field(
        reviewer: admission_process.Reviewer) -> None:
    outside = beta_policy(localTier={"path": "/etc/ckpt", "capacity": 20_000_000_000_000})
    got = answer(reviewer, admission.VALIDATE_ID, review("CREATE", outside))
    assert got["allowed"] is False and got["status"]["code"] == 422
    message = got["status"]["message"]
    assert "localTier.path" in message and "/etc/ckpt" in message, message
    assert "/mnt/ckptdrain" in message, message  # what was expected


@pytest.mark.parametrize("field, value", [
    ("model.parameters", 70_000_000_000), ("model.parameters", "7e10"),
    ("model.bytesPerParameter", 14), ("model.bytesPerParameter", "0.5"),
    ("model.checkpointBytes", "5.67T"), ("model.checkpointBytes", 1_500_000_000_000),
    ("localTier.capacity", "1.5Ti"), ("localTier.capacity", "1e13"),
    ("caps.bandwidth", 10_000_000_000), ("caps.bandwidth", "1.25Gi"),
    ("interval", "90s"), ("interval", "500ms"), ("interval", "0s"),
    ("localWriteTime", "1m30s"), ("mtti", "36h"),
    ("overlap", "100%"), ("overlap", "0%"), ("overlap", "0.5%"),
    ("restore.retryDeadline", "0s"), ("drain.stallTimeout", "0s"),
])
def test_each_v1beta1_verdict_is_the_one_its_v1alpha1_form_gets(
        reviewer: admission_process.Reviewer, field: str, value: Any) -> None:
    # What the operator will read is the v1alpha1 form: admission must not
    # admit at v1beta1 what it refuses there, nor the other way round.
    beta = beta_policy()
    *parents, name = field.split(".")
    holder = beta["spec"]
    for key in parents:
        holder = holder.setdefault(key, {})
    holder[name] = value
    alpha = to_v1alpha1(beta)
    assert alpha["apiVersion"] == V1ALPHA1
    at_beta = answer(reviewer, admission.VALIDATE_ID, review("CREATE", beta))
    at_alpha = answer(reviewer, admission.VALIDATE_ID, review("CREATE", alpha))
    assert at_beta["allowed"] == at_alpha["allowed"], (at_beta, at_alpha)
    if not at_beta["allowed"]:
        assert at_beta["status"]["code"] == at_alpha["status"]["code"]
        assert at_beta["status"]["message"].startswith(f"spec.{field}"), at_beta


def test_the_class_mutation_binds_a_v1beta1_policy_to_the_default_class(
        reviewer: admission_process.Reviewer) -> None:
    default = {"apiVersion": V1BETA1, "kind": "CheckpointClass",
               "metadata": {"name": "fast", "resourceVersion": "3",
                            "annotations": {classes.DEFAULT_ANNOTATION: "true"}},
               "spec": {"nodeTier": {"root": "/mnt/ckptdrain"}}}
    class_view.CLASSES.replace([default], "3")
    created = beta_policy()
    got = answer(reviewer, admission.MUTATE_POLICY_ID, review("CREATE", copy.deepcopy(created)))
    assert got["allowed"] is True and got["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(got["patch"])) == [
        {"op": "add", "path": "/spec/checkpointClassName", "value": "fast"}]
    # Bound to it, the policy is judged under the class, in v1beta1 still.
    created["spec"]["checkpointClassName"] = "fast"
    got = answer(reviewer, admission.VALIDATE_ID, review("CREATE", created))
    assert (got["allowed"], got.get("status")) == (True, None), got
    # Named already: left alone.
    got = answer(reviewer, admission.MUTATE_POLICY_ID, review("CREATE", created))
    assert got["allowed"] is True and "patch" not in got


def converted_review(obj: dict[str, Any]) -> dict[str, Any]:
    """A v1beta1 request as a webhook registered for v1alpha1 alone
    (matchPolicy Equivalent) is sent it: the object converted, requestKind
    saying the version written."""
    request = review("CREATE", to_v1alpha1(obj))
    request["request"]["requestKind"] = {"group": "ckptdrain.io", "version": "v1beta1",
                                         "kind": "CheckpointPolicy"}
    return request


def test_a_v1beta1_refusal_speaks_v1beta1_and_a_v1alpha1_one_v1alpha1(
        reviewer: admission_process.Reviewer) -> None:
    small = beta_policy(localTier={"path": "/mnt/ckptdrain/nvme", "keep": 2,
                                   "capacity": 1_000_000_000_000})
    at_beta = answer(reviewer, admission.VALIDATE_ID, review("CREATE", small))
    at_alpha = answer(reviewer, admission.VALIDATE_ID, review("CREATE", to_v1alpha1(small)))
    converted = answer(reviewer, admission.VALIDATE_ID, converted_review(small))
    beta = ("spec.localTier.capacity: expected at least 1.32T (keep=2 checkpoints plus the one "
            "being captured, 438G per writer), got 1000000000000")
    assert (at_beta["allowed"], at_beta["status"]) == (False, {"message": beta, "code": 422})
    # Sent converted, it is said as it was written all the same.
    assert converted["status"] == at_beta["status"]
    assert at_alpha["status"] == {"code": 422, "message": (
        "spec.localTier.capacity: expected at least 1.32 TB (keep=2 checkpoints plus the one "
        "being captured, 438 GB per writer), got '1000000000000'")}


def test_a_v1alpha1_request_sent_converted_to_v1beta1_is_said_as_written(
        reviewer: admission_process.Reviewer) -> None:
    # As a configuration registered for v1beta1 alone (neither the chart's
    # nor Kopf's) has it: a v1alpha1 create reaches the webhook converted,
    # requestKind v1alpha1.
    small = beta_policy(localTier={"path": "/mnt/ckptdrain/nvme", "keep": 2,
                                   "capacity": 1_000_000_000_000})
    request = review("CREATE", small)
    request["request"]["requestKind"] = {"group": "ckptdrain.io", "version": "v1alpha1",
                                         "kind": "CheckpointPolicy"}
    converted = answer(reviewer, admission.VALIDATE_ID, request)
    at_alpha = answer(reviewer, admission.VALIDATE_ID, review("CREATE", to_v1alpha1(small)))
    assert converted["allowed"] is False
    assert converted["status"] == at_alpha["status"], converted
    # An update judged so too: the stored object, sent converted, compared
    # with the request's in the same version (a spec left alone is admitted).
    request = review("UPDATE", small, copy.deepcopy(small))
    request["request"]["requestKind"] = {"group": "ckptdrain.io", "version": "v1alpha1",
                                         "kind": "CheckpointPolicy"}
    assert answer(reviewer, admission.VALIDATE_ID, request)["allowed"] is True


def test_a_value_sent_converted_is_said_in_the_version_written_as_converted_back(
        reviewer: admission_process.Reviewer) -> None:
    # docs/api-versions.md: the field in the version written, the value the
    # same but respelled ("2GB/s" there and back is "2G"); sent as written,
    # as the chart and Kopf register the webhooks, it is said as written.
    alpha = to_v1alpha1(beta_policy(caps={"bandwidth": "1G", "perDrainer": "2G"}))
    alpha["spec"]["caps"] = {"bandwidth": "1GB/s", "perDrainer": "2GB/s"}
    request = review("CREATE", to_v1beta1(alpha))
    request["request"]["requestKind"] = {"group": "ckptdrain.io", "version": "v1alpha1",
                                         "kind": "CheckpointPolicy"}
    expected = "spec.caps.perDrainer: expected at most caps.bandwidth (1.00 GB/s), got "
    assert answer(reviewer, admission.VALIDATE_ID, request)["status"]["message"] == \
        expected + "'2G'"
    as_written = answer(reviewer, admission.VALIDATE_ID, review("CREATE", alpha))
    assert as_written["status"]["message"] == expected + "'2GB/s'"


@pytest.mark.parametrize("version", [V1ALPHA1, V1BETA1])
def test_a_checkpoint_size_past_any_number_is_refused_naming_bytes_per_parameter(
        reviewer: admission_process.Reviewer, version: str) -> None:
    # The schema takes 1e300 bytes per parameter; times 70G parameters it
    # is no number: refused (422) naming the field, never a failure.
    beta = beta_policy(model={"parameters": "70G", "bytesPerParameter": "1e300"})
    obj = beta if version == V1BETA1 else to_v1alpha1(beta)
    got = answer(reviewer, admission.VALIDATE_ID, review("CREATE", obj))
    assert (got["allowed"], got["status"]["code"]) == (False, 422), got
    message = got["status"]["message"]
    assert message.startswith("spec.model.bytesPerParameter: expected a value whose "
                              "model.parameters × model.bytesPerParameter"), message
    assert "1e300" in message or "1e+300" in message, message
    # The operator's own process (Kopf's server) judges it by the same rule.
    with pytest.raises(admission.Refused) as refused:
        validate_policy(obj["spec"], "llama", CFG, version)
    assert str(refused.value) == message
