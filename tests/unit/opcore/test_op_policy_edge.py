"""The operator's edge for CheckpointPolicy: read at v1beta1, seen by the
core at v1alpha1, its status written back at v1beta1 (apiserver/policy_edge.py)."""

from __future__ import annotations

from typing import Any

from ckptdrain.contract import api
from ckptdrain.contract.policy_versions import V1ALPHA1, V1BETA1, to_v1beta1
from ckptdrain.operator.apiserver import policy_edge

MANAGED = [{"manager": "kubectl", "apiVersion": V1ALPHA1, "operation": "Apply",
            "fieldsV1": {"f:spec": {"f:mtti": {}}}}]


def _stored() -> dict[str, Any]:
    return {"apiVersion": V1BETA1, "kind": api.KIND_POLICY,
            "metadata": {"name": "llama", "namespace": "ml", "managedFields": MANAGED},
            "spec": {"model": {"parameters": "405G"}, "mtti": "24h", "overlap": "10%",
                     "caps": {"bandwidth": "10G"}},
            "status": {"goodput": {"heldSince": "2026-11-30T01:02:03.500000Z"}}}


def test_the_core_sees_a_policy_read_at_v1beta1_in_v1alpha1s_model() -> None:
    stored = _stored()
    seen = policy_edge.seen(stored)
    assert seen["apiVersion"] == V1ALPHA1
    assert seen["status"]["goodput"]["heldSince"] == 1796000523.5  # Unix seconds
    assert seen["spec"]["overlap"] == "10%" and seen["spec"]["mtti"] == "24h"
    # metadata untouched: managedFields still say who wrote at which version.
    assert seen["metadata"] == stored["metadata"]
    assert stored == _stored()  # the input is not changed


def test_a_v1alpha1_body_is_seen_as_it_is() -> None:
    alpha = {"apiVersion": V1ALPHA1, "kind": api.KIND_POLICY, "metadata": {"name": "p"},
             "status": {"goodput": {"heldSince": 5.0}}}
    assert policy_edge.seen(alpha) == alpha


def test_a_partial_status_is_written_at_v1beta1_and_only_what_it_holds() -> None:
    change = {"status": {"goodput": {"heldSince": 1796000523.5, "endedAt": None},
                         "lastRestoreFailure": None, "phase": "Ready"}}
    out = policy_edge.written(api.POLICIES, change)
    assert out == {"status": {"goodput": {"heldSince": "2026-11-30T01:02:03.500000Z",
                                          "endedAt": None},
                              "lastRestoreFailure": None, "phase": "Ready"}}
    assert change["status"]["goodput"]["heldSince"] == 1796000523.5  # not mutated


def test_interruption_times_in_a_status_patch_are_written_as_rfc3339() -> None:
    recent = [{"at": 100.0, "restoreStartedAt": 101.25, "completed": {"50": 90.0}}]
    out = policy_edge.written(api.POLICIES, {"status": {"goodput": {"recent": recent}}})
    assert out["status"]["goodput"]["recent"] == [
        {"at": "1970-01-01T00:01:40.000000Z", "restoreStartedAt": "1970-01-01T00:01:41.250000Z",
         "completed": {"50": "1970-01-01T00:01:30.000000Z"}}]


def test_what_the_core_writes_reads_back_as_it_computed_it() -> None:
    status = {"goodput": {"heldSince": 1796000523.123456, "lastInterruption": {"at": 7.5}},
              "lastRestoreAgreement": {"startedAt": 1764464000.0, "pods": 2}}
    written = policy_edge.written(api.POLICIES, {"status": status})
    back = policy_edge.seen({"apiVersion": V1BETA1, "kind": api.KIND_POLICY, **written})
    assert back["status"] == status


def test_a_whole_policy_is_written_at_v1beta1() -> None:
    alpha = {"apiVersion": V1ALPHA1, "kind": api.KIND_POLICY, "metadata": {"name": "p"},
             "spec": {"model": {"parameters": "405B"}, "mtti": "1d"}}
    assert policy_edge.written(api.POLICIES, alpha) == to_v1beta1(alpha)


def test_other_kinds_are_read_and_written_at_their_one_version_unchanged() -> None:
    record = {"apiVersion": api.API_VERSION, "kind": api.KIND_CHECKPOINT,
              "status": {"startedAt": 5.0}}
    assert policy_edge.version_of(api.CHECKPOINTS) == api.VERSION == "v1alpha1"
    assert policy_edge.version_of(api.POLICIES) == api.POLICY_VERSION == "v1beta1"
    assert policy_edge.written(api.CHECKPOINTS, record) == record
    assert policy_edge.read(api.CHECKPOINTS, record) == record
    assert policy_edge.RESOURCE == ("ckptdrain.io", "v1beta1", "checkpointpolicies")
