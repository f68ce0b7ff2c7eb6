"""policy/history.py: the policy remembers where its checkpoints were, so a
move of spec.storage.uri never reads as a fresh start at the new prefix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ckptdrain.contract.earlier_stores import EarlierStore
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.policy import history
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def parsed(uri: str, **relocation: Any) -> policy.Policy:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "a"}},
                            "model": {"parameters": "7B"}, "interval": "15m",
                            "localTier": {"path": "/mnt/ckptdrain/nvme"},
                            "storage": {"uri": uri}}
    if relocation:
        spec["relocation"] = relocation
    return policy.parse("ml", "llama", spec, CFG)


def test_the_prefix_is_the_one_pods_are_given() -> None:
    assert parsed("s3://bucket/runs/").store_prefix() == "s3://bucket/runs/ml/llama"


def test_a_status_without_a_prefix_records_the_current_one_and_no_history() -> None:
    # A new policy, or one stored before status.storage existed: no move to tell.
    status = {"lastGlobalStep": 4200}
    assert history.storage_status(status, parsed("s3://new/runs"), NOW) == {
        "uri": "s3://new/runs/ml/llama", "earlier": []}


def test_a_move_after_checkpoints_completed_is_recorded_with_step_time_and_reason() -> None:
    status = {"lastGlobalStep": 4200, "storage": {"uri": "s3://old/runs/ml/llama"}}
    moved = parsed("s3://new/runs", reason="bucket migration")
    assert history.storage_status(status, moved, NOW) == {
        "uri": "s3://new/runs/ml/llama",
        "earlier": [{"uri": "s3://old/runs/ml/llama", "lastGlobalStep": 4200,
                     "movedAt": "2026-11-29T10:00:00Z", "reason": "bucket migration"}]}


def test_the_same_prefix_changes_nothing() -> None:
    earlier = [{"uri": "s3://old/runs/ml/llama", "lastGlobalStep": 10,
                "movedAt": "2026-11-01T00:00:00Z"}]
    status = {"lastGlobalStep": 50, "storage": {"uri": "s3://new/runs/ml/llama",
                                                "earlier": earlier}}
    assert history.storage_status(status, parsed("s3://new/runs"), NOW) == {
        "uri": "s3://new/runs/ml/llama", "earlier": earlier}


def test_no_history_when_no_checkpoint_completed_globally() -> None:
    for step in (None, "4200", True, -1):
        status = {"lastGlobalStep": step, "storage": {"uri": "s3://old/runs/ml/llama"}}
        assert history.storage_status(status, parsed("s3://new/runs"), NOW)["earlier"] == []


def test_a_prefix_left_before_any_checkpoint_reached_it_is_not_recorded() -> None:
    # old (step 4200) -> mid (nothing completed there: the records still say
    # 4200) -> new: the place to copy from stays old, never the empty mid.
    status = {"lastGlobalStep": 4200, "storage": {
        "uri": "s3://mid/runs/ml/llama",
        "earlier": [{"uri": "s3://old/runs/ml/llama", "lastGlobalStep": 4200,
                     "movedAt": "2026-11-01T00:00:00Z"}]}}
    out = history.storage_status(status, parsed("s3://new/runs"), NOW)
    assert [e["uri"] for e in out["earlier"]] == ["s3://old/runs/ml/llama"]
    # Once a checkpoint completed at mid, leaving it is remembered.
    status["lastGlobalStep"] = 4300
    out = history.storage_status(status, parsed("s3://new/runs"), NOW)
    assert [(e["uri"], e["lastGlobalStep"]) for e in out["earlier"]] == [
        ("s3://mid/runs/ml/llama", 4300), ("s3://old/runs/ml/llama", 4200)]


def test_at_most_five_newest_first() -> None:
    status: dict[str, Any] = {}
    for i in range(8):  # move to bucket-i, then checkpoints reach step 100 * (i + 1) there
        status["storage"] = history.storage_status(status, parsed(f"s3://bucket-{i}/runs"),
                                                   NOW + timedelta(hours=i))
        status["lastGlobalStep"] = 100 * (i + 1)
    earlier = status["storage"]["earlier"]
    assert [(e["uri"], e["lastGlobalStep"]) for e in earlier] == [
        (f"s3://bucket-{i}/runs/ml/llama", 100 * (i + 1)) for i in (6, 5, 4, 3, 2)]
    assert earlier[0]["movedAt"] == "2026-11-29T17:00:00Z"


def test_a_move_back_drops_that_prefix() -> None:
    status: dict[str, Any] = {"lastGlobalStep": 4200,
                              "storage": {"uri": "s3://old/runs/ml/llama"}}
    status["storage"] = history.storage_status(status, parsed("s3://new/runs"), NOW)
    status["lastGlobalStep"] = 4500  # training went on at the new prefix
    back = history.storage_status(status, parsed("s3://old/runs"), NOW)
    assert back == {"uri": "s3://old/runs/ml/llama", "earlier": [
        {"uri": "s3://new/runs/ml/llama", "lastGlobalStep": 4500,
         "movedAt": "2026-11-29T10:00:00Z"}]}


def test_a_hand_edited_list_keeps_only_what_can_be_read() -> None:
    status = {"lastGlobalStep": 1, "storage": {"uri": "s3://new/runs/ml/llama", "earlier": [
        {"uri": "s3://ok/ml/llama", "lastGlobalStep": 7}, {"uri": "", "lastGlobalStep": 1},
        {"uri": "s3://x/ml/llama", "lastGlobalStep": "7"}, "junk"]}}
    out = history.storage_status(status, parsed("s3://new/runs"), NOW)
    assert out["earlier"] == [{"uri": "s3://ok/ml/llama", "lastGlobalStep": 7}]


def test_restore_is_told_the_earlier_prefixes_unless_start_fresh() -> None:
    status = {"lastGlobalStep": 4200, "storage": {"uri": "s3://old/runs/ml/llama"}}
    # Told even before the reconcile recorded the move (the status still
    # names the old prefix): a pod admitted in between is protected too.
    told = history.told_to_restore(status, parsed("s3://new/runs", reason="migration"), NOW)
    assert told == [EarlierStore("s3://old/runs/ml/llama", 4200, "2026-11-29T10:00:00Z",
                                 "migration")]
    fresh = parsed("s3://new/runs", reason="migration", startFresh=True)
    assert fresh.start_fresh and history.told_to_restore(status, fresh, NOW) == []
    assert history.told_to_restore({}, parsed("s3://new/runs"), NOW) == []


def test_start_fresh_must_be_a_boolean() -> None:
    spec = {"selector": {"matchLabels": {"app": "a"}}, "model": {"parameters": "7B"},
            "interval": "15m", "localTier": {"path": "/mnt/ckptdrain/nvme"},
            "storage": {"uri": "s3://bucket/r"}, "relocation": {"reason": "x", "startFresh": "yes"}}
    with pytest.raises(InvalidInput, match=r"spec\.relocation\.startFresh: expected true or"):
        policy.parse("ml", "llama", spec, CFG)
    assert policy.parse("ml", "llama", {**spec, "relocation": {"reason": "x"}},
                        CFG).start_fresh is False
