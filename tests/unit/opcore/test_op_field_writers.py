"""Which version each field of a stored policy was written at
(policy/version_messages.py field_versions), from metadata.managedFields:
the entries owning the field, whoever wrote last."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ckptdrain.contract.policy_versions import V1ALPHA1, V1BETA1
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import handlers
from ckptdrain.operator.policy import version_messages as said

CAPACITY = "spec.localTier.capacity"

#: A real apiserver's managedFields (tests/cluster/test_version_refusals.py
#: makes them): created at v1alpha1 by `gitops`, its capacity patched at
#: v1beta1 by kubectl, then labelled at v1alpha1 by `gitops`, whose entry is
#: now the newest and owns every spec field but the capacity.
PATCHED_AT_V1BETA1_THEN_LABELLED: list[dict[str, Any]] = [
    {"apiVersion": "ckptdrain.io/v1beta1", "fieldsType": "FieldsV1",
     "fieldsV1": {"f:spec": {"f:localTier": {"f:capacity": {}}}},
     "manager": "kubectl-patch", "operation": "Update", "time": "2026-11-30T11:51:31Z"},
    {"apiVersion": "ckptdrain.io/v1alpha1", "fieldsType": "FieldsV1",
     "fieldsV1": {
         "f:metadata": {"f:labels": {".": {}, "f:team": {}}},
         "f:spec": {
             ".": {}, "f:drain": {".": {}, "f:stallTimeout": {}}, "f:globalEvery": {},
             "f:gracePolicy": {}, "f:interval": {},
             "f:localTier": {".": {}, "f:keep": {}, "f:path": {}},
             "f:model": {".": {}, "f:bytesPerParameter": {}, "f:parameters": {}},
             "f:overlap": {}, "f:readers": {},
             "f:restore": {".": {}, "f:agreementTimeout": {}, "f:directIO": {}, "f:enabled": {},
                           "f:prefer": {}, "f:reshard": {}, "f:retryDeadline": {}},
             "f:selector": {},
             "f:storage": {".": {}, "f:keep": {}, "f:trainerAccess": {}, "f:uri": {}},
             "f:triggers": {".": {}, "f:schedule": {}, "f:sigterm": {}}, "f:writers": {}}},
     "manager": "gitops", "operation": "Update", "time": "2026-11-30T11:51:32Z"},
    {"apiVersion": "ckptdrain.io/v1alpha1", "fieldsType": "FieldsV1",
     "fieldsV1": {"f:metadata": {"f:annotations": {
         ".": {}, "f:ckptdrain.io/kopf-managed": {},
         "f:ckptdrain.io/last-handled-configuration": {}}}},
     "manager": "kopf", "operation": "Update", "time": "2026-11-30T11:51:33Z"},
    {"apiVersion": "ckptdrain.io/v1alpha1", "fieldsType": "FieldsV1",
     "fieldsV1": {"f:status": {".": {}, "f:observedGeneration": {}, "f:phase": {}}},
     "manager": "kopf", "operation": "Update", "subresource": "status",
     "time": "2026-11-30T11:51:33Z"},
]

SMALL = InvalidInput(CAPACITY, "at least 1.32 TB (keep=2 checkpoints plus the one being "
                     "captured, 438 GB per writer)", "1000000000000")


def test_a_field_is_said_in_the_version_its_owner_wrote_not_the_newest_writers() -> None:
    versions = said.field_versions({"managedFields": PATCHED_AT_V1BETA1_THEN_LABELLED})
    assert versions[CAPACITY] == V1BETA1
    assert (versions["spec.model.parameters"], versions["spec.interval"]) == (V1ALPHA1,
                                                                              V1ALPHA1)
    assert said.message(SMALL, versions) == (
        "spec.localTier.capacity: expected at least 1.32T (keep=2 checkpoints plus the one "
        "being captured, 438G per writer), got 1000000000000")


def entry(version: object, *paths: str, time: object = "2026-11-30T10:00:00Z",
          manager: str = "kubectl") -> dict[str, Any]:
    """A managedFields entry owning `paths` (spec.…)."""
    fields: dict[str, Any] = {"f:metadata": {"f:labels": {}}}
    for path in paths:
        node = fields
        for key in path.split("."):
            node = node.setdefault(f"f:{key}", {})
    return {"manager": manager, "operation": "Update", "apiVersion": version, "time": time,
            "fieldsType": "FieldsV1", "fieldsV1": fields}


@pytest.mark.parametrize("entries, version", [
    ([], None),
    ([entry(V1BETA1, CAPACITY)], V1BETA1),
    ([entry(V1ALPHA1, CAPACITY)], V1ALPHA1),
    # Newer writes of other fields, at another version, change nothing.
    ([entry(V1BETA1, CAPACITY, time="2026-11-30T10:00:00Z"),
      entry(V1ALPHA1, "spec.interval", time="2026-11-30T11:00:00Z")], V1BETA1),
    # The operator's own writes (status, annotations) own no spec field.
    ([entry(V1BETA1, CAPACITY), entry(V1ALPHA1, "status.phase", manager="kopf")], V1BETA1),
    # Owned by no one (another field's writer, or removed): not known.
    ([entry(V1BETA1, "spec.localTier.keep")], None),
    # Owners (two appliers of the same value) at two versions: not known.
    ([entry(V1ALPHA1, CAPACITY), entry(V1BETA1, CAPACITY)], None),
    ([entry(V1BETA1, CAPACITY), entry(V1BETA1, CAPACITY, manager="helm")], V1BETA1),
    ([entry("ckptdrain.io/v1", CAPACITY)], None),
    # A parent written at one version, a child at another: the child's.
    ([entry(V1ALPHA1, "spec.localTier"), entry(V1BETA1, CAPACITY)], V1BETA1),
    # Not what the apiserver writes: an apiVersion that is no string (not
    # even hashable) tells nothing, and breaks nothing; nor does a time
    # that is no string, which is not read at all.
    ([entry(V1BETA1, CAPACITY), entry({"v": 1}, CAPACITY)], V1BETA1),
    ([entry(V1BETA1, CAPACITY), entry(["v1alpha1"], CAPACITY)], V1BETA1),
    ([entry(V1BETA1, CAPACITY, time=20261130)], V1BETA1),
    ([entry(V1BETA1, CAPACITY), "not an entry",
      {**entry(V1ALPHA1, CAPACITY), "fieldsV1": ["f:spec"]},
      {**entry(V1ALPHA1, CAPACITY), "fieldsV1": {"f:spec": {"f:localTier": "f:capacity"}}}],
     V1BETA1),
])
def test_a_field_is_said_in_the_version_of_the_entries_owning_it(
        entries: list[Any], version: str | None) -> None:
    meta = {"name": "llama", "managedFields": entries}
    assert said.field_versions(meta).get(CAPACITY) == version


def test_the_policy_index_keeps_the_versions_and_no_managed_fields() -> None:
    body = {"apiVersion": V1ALPHA1, "kind": "CheckpointPolicy",
            "metadata": {"name": "llama", "namespace": "ml",
                         "managedFields": copy.deepcopy(PATCHED_AT_V1BETA1_THEN_LABELLED)},
            "spec": {"writers": 2}}
    (kept,) = handlers.checkpointpolicy_index(namespace="ml", name="llama", body=body).values()
    assert "managedFields" not in kept["metadata"]
    # Kept beside the object, under a key no apiserver object has.
    assert set(kept) == {"apiVersion", "kind", "metadata", "spec", said.KEPT_KEY}
    assert said.versions_of(kept) == said.versions_of(body) \
        == said.field_versions(body["metadata"])
    assert said.versions_of(kept)[CAPACITY] == V1BETA1


def test_every_policy_shares_one_version_string() -> None:
    # Each index copy keeps its versions: thousands of policies hold the
    # module's two strings, not one copy each of what the apiserver sent.
    written = "".join(["ckptdrain.io/", "v1beta1"])
    assert written is not V1BETA1
    versions = said.field_versions({"managedFields": [entry(written, CAPACITY)]})
    assert versions[CAPACITY] is V1BETA1
