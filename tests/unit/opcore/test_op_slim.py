"""What the operator and its admission process keep of the objects they hold
(slim.py): everything but managedFields, and a copy that is its own."""

from __future__ import annotations

import copy
from typing import Any

from ckptdrain.operator import handlers
from ckptdrain.operator.admission import policy_mirror, webhook
from ckptdrain.operator.apiserver.slim import kept_copy, without_managed_fields


def _policy() -> dict[str, Any]:
    return {"apiVersion": "ckptdrain.io/v1alpha1", "kind": "CheckpointPolicy",
            "metadata": {"name": "llama", "namespace": "ml", "resourceVersion": "3",
                         "annotations": {"a": "b"},
                         "managedFields": [{"manager": "kubectl", "fieldsV1": {
                             "f:spec": {"f:selector": {}}}}]},
            "spec": {"selector": {"matchLabels": {"app": "a"}}, "writers": 2},
            "status": {"phase": "Ready"}}


def test_managed_fields_are_left_out_and_nothing_else() -> None:
    body = _policy()
    before = copy.deepcopy(body)
    kept = without_managed_fields(body)
    assert "managedFields" not in kept["metadata"]
    kept["metadata"]["managedFields"] = before["metadata"]["managedFields"]
    assert kept == before
    assert body == before  # the object given is untouched


def test_a_kept_copy_shares_nothing_with_the_object() -> None:
    body = _policy()
    kept = kept_copy(body)
    body["spec"]["selector"]["matchLabels"]["app"] = "changed"
    body["status"]["phase"] = "changed"
    assert kept["spec"]["selector"]["matchLabels"] == {"app": "a"}
    assert kept["status"] == {"phase": "Ready"}
    assert "managedFields" not in kept["metadata"]


def test_the_operator_indexes_and_the_admission_view_keep_no_managed_fields() -> None:
    body = _policy()
    indexed = handlers.checkpointpolicy_index(namespace="ml", name="llama", body=body)
    # The versions its fields were written at are kept beside it
    # (tests/unit/opcore/test_op_field_writers.py).
    assert "managedFields" not in indexed[("ml", "llama")]["metadata"]
    record = {"metadata": {"name": "llama-100", "managedFields": [{"manager": "x"}]},
              "spec": {"policy": "llama", "step": 100}}
    indexed = handlers.checkpoint_index(namespace="ml", spec=record["spec"], body=record)
    assert indexed[("ml", "llama")] == {"metadata": {"name": "llama-100"},
                                        "spec": {"policy": "llama", "step": 100}}
    (filed,) = webhook.policy_by_label(namespace="ml", body=body, spec=body["spec"]).values()
    assert "managedFields" not in filed["metadata"] and filed["spec"] == body["spec"]
    view = policy_mirror.PolicyMirror()
    view.replace([body], "3")
    (offered,) = view.candidates("ml", {"app": "a"}) or []
    assert "managedFields" not in offered["metadata"] and offered["spec"] == body["spec"]
