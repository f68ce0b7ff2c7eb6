"""policy/relocation.py: which UPDATEs move checkpoints or change the writer
count, and when the update itself says the move is meant."""

from __future__ import annotations

import copy
from typing import Any

from ckptdrain.operator.policy import relocation


def spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"selector": {"matchLabels": {"app": "a"}}, "writers": 2,
                            "interval": "15m",
                            "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
                            "storage": {"uri": "s3://bucket/runs"}}
    base.update(over)
    return base


def test_other_fields_change_freely() -> None:
    assert relocation.guarded_changes(spec(), spec(interval="30m", overlap="20%")) == []
    assert relocation.refused(spec(), spec(interval="30m")) == []


def test_each_guarded_field_is_named_as_a_user_writes_it() -> None:
    old = spec()
    assert relocation.refused(old, spec(storage={"uri": "s3://other/runs"})) == \
        ["spec.storage.uri"]
    assert relocation.refused(old, spec(localTier={"path": "/mnt/ckptdrain/b", "keep": 2})) \
        == ["spec.localTier.path"]
    assert relocation.refused(old, spec(writers=4)) == ["spec.writers"]
    moved = spec(writers=4, storage={"uri": "s3://x/y"}, localTier={"path": "/mnt/ckptdrain/b"})
    assert relocation.refused(old, moved) == ["spec.storage.uri", "spec.localTier.path",
                                              "spec.writers"]


def test_writers_left_out_means_the_schema_default() -> None:
    old = spec()
    del old["writers"]
    assert relocation.guarded_changes(old, spec(writers=1)) == []
    assert relocation.guarded_changes(old, spec(writers=2)) == ["spec.writers"]


def test_a_new_reason_lets_the_location_move_but_never_the_writers() -> None:
    old = spec()
    new = spec(storage={"uri": "s3://other/runs"}, relocation={"reason": "bucket migration"})
    assert relocation.acknowledged(old, new)
    assert relocation.refused(old, new) == []
    both = copy.deepcopy(new)
    both["writers"] = 8
    assert relocation.refused(old, both) == ["spec.writers"]


def test_a_reason_left_from_an_earlier_move_acknowledges_nothing_new() -> None:
    old = spec(relocation={"reason": "bucket migration"})
    again = spec(storage={"uri": "s3://third/runs"}, relocation={"reason": "bucket migration"})
    assert not relocation.acknowledged(old, again)
    assert relocation.refused(old, again) == ["spec.storage.uri"]
    blank = spec(storage={"uri": "s3://third/runs"}, relocation={"reason": "   "})
    assert relocation.refused(spec(), blank) == ["spec.storage.uri"]
    fresh = spec(storage={"uri": "s3://third/runs"}, relocation={"reason": "second move"})
    assert relocation.refused(old, fresh) == []


def _pod(phase: str, *owners: dict[str, Any], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "ownerReferences": list(owners)}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-29T08:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "controller": True}
RUNNING_JOB: dict[str, Any] = {"status": {"active": 1}}


def test_live_is_what_still_writes_or_comes_back() -> None:
    assert relocation.counts_as_live(_pod("Running"))
    assert relocation.counts_as_live(_pod("Pending"))
    assert relocation.counts_as_live(_pod("Running", deleting=True))  # flushing
    assert not relocation.counts_as_live(_pod("Succeeded", JOB), RUNNING_JOB)
    assert relocation.counts_as_live(_pod("Failed", JOB), RUNNING_JOB)
    assert relocation.counts_as_live(_pod("Failed", JOB, deleting=True), RUNNING_JOB)
    for done in ("Complete", "Failed", "FailureTarget", "SuccessCriteriaMet"):
        job = {"status": {"conditions": [{"type": done, "status": "True"}]}}
        assert not relocation.counts_as_live(_pod("Failed", JOB), job)
    assert not relocation.counts_as_live(_pod("Failed", JOB), None)  # the Job is gone
    # Only a controlling Job recreates a pod.
    assert not relocation.counts_as_live(_pod("Failed"), RUNNING_JOB)
    assert not relocation.counts_as_live(_pod("Failed", {**JOB, "controller": False}),
                                         RUNNING_JOB)
    assert not relocation.counts_as_live(
        _pod("Failed", {**JOB, "kind": "ReplicaSet", "apiVersion": "apps/v1"}), RUNNING_JOB)


def test_what_a_pod_was_injected_with_is_read_back_from_it() -> None:
    pod = {"spec": {
        "initContainers": [{"name": "ckptdrain-restore", "env": [
            {"name": "CKPTDRAIN_STORE_URI", "value": "s3://b/p/ml/llama"},
            {"name": "CKPTDRAIN_WRITERS", "value": "2"}]}],
        "volumes": [{"name": "ckptdrain-local", "hostPath": {"path": "/mnt/c/ml/llama"}}]}}
    assert relocation.injected_with(pod) == {
        "spec.storage.uri": "s3://b/p/ml/llama", "spec.writers": "2",
        "spec.localTier.path": "/mnt/c/ml/llama"}
    same = dict(relocation.injected_with(pod))
    assert relocation.differs(pod, same) == []
    assert relocation.differs(pod, {**same, "spec.writers": "4",
                                    "spec.localTier.path": "/mnt/d/ml/llama"}) == [
        "spec.localTier.path", "spec.writers"]
    assert relocation.refused_on_create(["spec.storage.uri", "spec.writers"],
                                        {"relocation": {"reason": "move"}}) == ["spec.writers"]
    assert relocation.refused_on_create(["spec.storage.uri"], {}) == ["spec.storage.uri"]
