"""Pod admission says an invalid policy's problem as the policy's own status
does (admission/rules.py; policy/version_messages.py): in the version each
field was written at, from the versions the index copy keeps beside the
policy; with none kept, what was expected in v1beta1's spellings and the
value as stored. The same words under Refuse (the refusal) and Flag (the
warning)."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import pytest

from ckptdrain.contract.policy_versions import V1ALPHA1, V1BETA1, to_v1alpha1
from ckptdrain.operator import config
from ckptdrain.operator.admission import policy_mirror, webhook
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.apiserver import slim
from ckptdrain.operator.policy import version_messages

REFUSE = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
FLAG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", unselected_pods="Flag")
LOG = logging.getLogger("test")
CAPACITY = "spec.localTier.capacity"
#: A capacity too small for keep=2 of a 70G-parameter model, as each version says it.
AT_V1BETA1 = ("spec.localTier.capacity: expected at least 2.63T (keep=2 checkpoints plus "
              "the one being captured, 875G per writer), got 1000000000000")
AT_V1ALPHA1 = ("spec.localTier.capacity: expected at least 2.63 TB (keep=2 checkpoints plus "
               "the one being captured, 875 GB per writer), got '1TB'")


def written_at(version: str) -> dict[str, Any]:
    """The policy as the core reads it (v1alpha1's model) whose capacity its
    writer set at `version`, with the managedFields the apiserver keeps."""
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "llama"}},
        "model": {"parameters": 70_000_000_000, "bytesPerParameter": "12.5"},
        "interval": "1h30m", "overlap": "12.5%",
        "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2,
                      "capacity": 1_000_000_000_000},
        "storage": {"uri": "s3://bucket/llama"}}
    if version == V1ALPHA1:
        spec.update(model={"parameters": "70B", "bytesPerParameter": "12.5"},
                    overlap="0.125",
                    localTier={"path": "/mnt/ckptdrain/nvme", "keep": 2,
                               "capacity": "1TB"})
    stored = to_v1alpha1({"apiVersion": version, "kind": "CheckpointPolicy", "spec": spec})
    stored["metadata"] = {"name": "llama", "namespace": "ml", "uid": "u", "generation": 1,
                          "managedFields": [{
                              "apiVersion": version, "fieldsType": "FieldsV1",
                              "manager": "kubectl", "operation": "Update",
                              "fieldsV1": {"f:spec": {"f:localTier": {"f:capacity": {}}}}}]}
    return stored


def pod() -> dict[str, Any]:
    return {"metadata": {"name": "w-0", "namespace": "ml",
                         "labels": {"app": "llama", "ckptdrain.io/inject": "true"}},
            "spec": {"containers": [{"name": "trainer", "image": "t"}],
                     "terminationGracePeriodSeconds": 3600}}


@pytest.fixture(autouse=True)
def no_apiserver(monkeypatch: pytest.MonkeyPatch) -> None:
    """The index copy names the policy: nothing is listed."""
    monkeypatch.setattr(apiserver_reads, "list_policies", lambda namespace: [])


def refusal(cfg: config.OperatorConfig, candidate: dict[str, Any]) -> tuple[str, list[str]]:
    """The refusal (Refuse) or the one warning (Flag) admitting the pod gives."""
    warnings: list[str] = []
    try:
        ops = asyncio.run(admission.admit_pod(pod(), "ml", cfg, warnings, LOG, [candidate],
                                              None))
    except admission.Refused as refused:
        assert refused.code == 422
        return str(refused), warnings
    assert ops == [] and len(warnings) == 1
    return "", warnings


def index_copy(body: dict[str, Any]) -> dict[str, Any]:
    """The policy as the operator's policy_by_label index keeps it."""
    filed = webhook.policy_by_label(namespace="ml", body=copy.deepcopy(body), spec=body["spec"])
    (kept,) = filed.values()
    assert "managedFields" not in kept["metadata"]
    return kept


def mirror_copy(body: dict[str, Any]) -> dict[str, Any]:
    """The policy as the admission process's own view keeps it."""
    mirror = policy_mirror.PolicyMirror()
    mirror._file(copy.deepcopy(body))
    mirror._current = True
    found = mirror.candidates("ml", {"app": "llama"})
    assert found is not None and len(found) == 1
    assert "managedFields" not in found[0]["metadata"]
    return found[0]


@pytest.mark.parametrize("kept", [index_copy, mirror_copy])
@pytest.mark.parametrize("version, said", [(V1BETA1, AT_V1BETA1), (V1ALPHA1, AT_V1ALPHA1)])
def test_the_refusal_and_the_warning_speak_the_version_the_field_was_written_at(
        kept: Any, version: str, said: str) -> None:
    candidate = kept(written_at(version))
    refused, _ = refusal(REFUSE, candidate)
    assert refused.startswith("metadata.labels: CheckpointPolicy llama in ml selects this "
                              f"pod (w-0) but is invalid ({said}); fix the policy")
    _, warnings = refusal(FLAG, candidate)
    assert warnings == [f"ckptdrain: policy llama is invalid ({said}); not injected"]


def test_the_words_are_the_policys_own_status_message() -> None:
    body = written_at(V1BETA1)
    _, warnings = refusal(FLAG, index_copy(body))
    assert version_messages.versions_of(body) == {CAPACITY: V1BETA1}
    status_said = version_messages.message(
        admission.pol.PolicyInvalid([admission.InvalidInput(
            CAPACITY, "at least 2.63 TB (keep=2 checkpoints plus the one being captured, "
            "875 GB per writer)", "1000000000000")]),
        version_messages.versions_of(body))
    assert warnings == [f"ckptdrain: policy llama is invalid ({status_said}); not injected"]


def test_a_copy_that_kept_no_versions_says_v1beta1_expectations_and_the_stored_value() -> None:
    # A copy of neither index (no versions, no managedFields): the fallback
    # the status takes, whose words no writer of either version is misled by.
    expected = ("spec.localTier.capacity: expected at least 2.63T (keep=2 checkpoints plus "
                "the one being captured, 875G per writer), got ")
    bare = slim.kept_copy(written_at(V1BETA1))
    assert version_messages.KEPT_KEY not in bare
    refused, _ = refusal(REFUSE, bare)
    assert f"but is invalid ({expected}'1000000000000'); fix the policy" in refused
    _, warnings = refusal(FLAG, slim.kept_copy(written_at(V1ALPHA1)))
    assert warnings == [f"ckptdrain: policy llama is invalid ({expected}'1TB'); not injected"]


def test_a_policy_listed_from_the_apiserver_is_said_from_its_managed_fields(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # No view to trust: the listed object carries its managedFields.
    monkeypatch.setattr(apiserver_reads, "list_policies",
                        lambda namespace: [written_at(V1ALPHA1)])
    with pytest.raises(admission.Refused) as refused:
        asyncio.run(admission.admit_pod(pod(), "ml", REFUSE, [], LOG, None, None))
    assert f"but is invalid ({AT_V1ALPHA1}); fix the policy" in str(refused.value)
