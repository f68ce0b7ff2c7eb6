"""When the storage version migration may drop v1alpha1 from the CRD's
status.storedVersions (migration/plan.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ckptdrain.errors import InvalidInput
from ckptdrain.operator.migration import plan
from ckptdrain.operator.migration.plan import CrdState, Outcome, Pass

FLIPPED = CrdState(storage="v1beta1", stored=("v1alpha1", "v1beta1"), generation=3,
                   resource_version="41")


def _pass(**changes: Any) -> Pass:
    base = Pass(before=FLIPPED, after=replace(FLIPPED, resource_version="57"), served=True,
                served_for_s=60.0, settle_s=60.0, complete=True,
                outcomes={"ml/a": Outcome.REWRITTEN, "ml/b": Outcome.CONFLICT,
                          "ml/c": Outcome.GONE})
    return replace(base, **changes)


def test_every_object_settled_may_trim() -> None:
    trim, why = plan.may_trim(_pass())
    assert trim, why
    assert "every object (3)" in why and "[v1beta1]" in why


def test_no_objects_at_all_may_trim() -> None:
    assert plan.may_trim(_pass(outcomes={}))[0]


def test_one_failed_rewrite_keeps_the_old_version_and_names_it() -> None:
    trim, why = plan.may_trim(_pass(outcomes={"ml/a": Outcome.REWRITTEN,
                                              "ml/b": Outcome.FAILED}))
    assert not trim and "ml/b" in why and "ml/a" not in why


def test_a_cut_list_keeps_the_old_version() -> None:
    assert not plan.may_trim(_pass(complete=False))[0]


def test_a_storage_version_not_yet_served_keeps_the_old_version() -> None:
    trim, why = plan.may_trim(_pass(served=False))
    assert not trim and "storageVersionHash" in why


def test_the_trim_waits_until_every_apiserver_had_the_settle_time() -> None:
    trim, why = plan.may_trim(_pass(served_for_s=59.0))
    assert not trim and "59s of the 60s" in why
    assert plan.may_trim(_pass(served_for_s=60.0, settle_s=60.0))[0]
    assert plan.may_trim(_pass(served_for_s=0.0, settle_s=0.0))[0]  # no settle asked


@pytest.mark.parametrize("after", [
    replace(FLIPPED, storage="v1alpha1"),  # rolled back meanwhile
    replace(FLIPPED, generation=5),  # flipped away and back meanwhile
])
def test_a_crd_changed_during_the_pass_keeps_the_old_version(after: CrdState) -> None:
    trim, why = plan.may_trim(_pass(after=after))
    assert not trim and "changed during the pass" in why


def test_already_migrated_needs_no_trim() -> None:
    done = replace(FLIPPED, stored=("v1beta1",))
    assert done.migrated and not FLIPPED.migrated
    assert not plan.may_trim(_pass(before=done, after=done))[0]


def test_the_state_is_read_from_the_crd_as_the_apiserver_sends_it() -> None:
    crd = {"metadata": {"generation": 3, "resourceVersion": "41"},
           "spec": {"versions": [{"name": "v1alpha1", "storage": False},
                                 {"name": "v1beta1", "storage": True}]},
           "status": {"storedVersions": ["v1alpha1", "v1beta1"]}}
    assert plan.crd_state(crd) == FLIPPED
    crd["spec"]["versions"][0]["storage"] = True
    with pytest.raises(InvalidInput, match=r"spec\.versions"):
        plan.crd_state(crd)


def test_the_storage_version_hash_is_the_apiservers() -> None:
    # What discovery shows for apps/v1 Deployment (any cluster: kubectl get
    # --raw /apis/apps/v1).
    assert plan.storage_version_hash("apps", "v1", "Deployment") == "8aSe+NMegvE="
    assert plan.storage_version_hash("ckptdrain.io", "v1beta1", "CheckpointPolicy") != \
        plan.storage_version_hash("ckptdrain.io", "v1alpha1", "CheckpointPolicy")
