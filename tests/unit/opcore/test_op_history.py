"""policy/history.py: the policy remembers where its checkpoints were, so a
move of spec.storage.uri never reads as a fresh start at the new prefix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ckptdrain.contract.api import timestamp
from ckptdrain.contract.earlier_stores import EarlierStore
from ckptdrain.contract.progress import Claim
from ckptdrain.contract.record import build_record
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.policy import history
from ckptdrain.operator.policy import spec as policy
from ckptdrain.operator.records import aggregate

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
T0 = "2026-11-01T00:00:00Z"
OLD, NEW, NEWER = ("s3://old/runs/ml/llama", "s3://new/runs/ml/llama",
                   "s3://newer/runs/ml/llama")


def parsed(uri: str, **relocation: Any) -> policy.Policy:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "a"}},
                            "model": {"parameters": "7B"}, "interval": "15m",
                            "localTier": {"path": "/mnt/ckptdrain/nvme"},
                            "storage": {"uri": uri}}
    if relocation:
        spec["relocation"] = relocation
    return policy.parse("ml", "llama", spec, CFG)


def body(storage: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    """A policy object as the reconcile and the webhook see it."""
    if storage is not None:
        status["storage"] = storage
    return {"metadata": {"name": "llama", "namespace": "ml", "creationTimestamp": T0},
            "status": status}


def storage_status(b: dict[str, Any], p: policy.Policy, now: datetime,
                   completed: list[tuple[int, str]] | None = None) -> dict[str, Any]:
    """The reconcile's status.storage, given the records that completed
    (None: the webhook's, without them)."""
    return history.storage_status(b, p, now, None if completed is None else lambda: completed)


def at(hours: float) -> str:
    return timestamp(NOW + timedelta(hours=hours))


def test_the_prefix_is_the_one_pods_are_given() -> None:
    assert parsed("s3://bucket/runs/").store_prefix() == "s3://bucket/runs/ml/llama"


def test_a_status_without_a_prefix_records_the_current_one_since_the_policy_was_made() -> None:
    # A new policy, or one stored before status.storage existed: no move to
    # tell, and what completed since the policy was made was saved here.
    assert storage_status(body(lastGlobalStep=4200), parsed("s3://new/runs"), NOW,
                          [(4200, "2026-11-02T00:00:00Z")]) == {
        "uri": NEW, "since": T0, "reason": "", "startFresh": False, "earlier": []}
    assert storage_status({}, parsed("s3://new/runs"), NOW)["since"] == timestamp(NOW)
    # Since the policy's creation, a step of its first second counts too:
    # there was no prefix before (a move's second is the old prefix's too).
    made = body({"uri": OLD, "since": T0})
    out = storage_status(made, parsed("s3://new/runs"), NOW, [(100, T0)])
    assert [(e["uri"], e["lastGlobalStep"]) for e in out["earlier"]] == [(OLD, 100)]


def test_a_move_after_a_checkpoint_completed_is_recorded_with_step_time_and_reason() -> None:
    moved = parsed("s3://new/runs", reason="bucket migration")
    out = storage_status(body({"uri": OLD, "since": T0}), moved, NOW,
                                 [(4100, "2026-11-28T00:00:00Z"), (4200, at(-1))])
    assert out == {"uri": NEW, "since": timestamp(NOW), "reason": "bucket migration",
                   "startFresh": False, "earlier": [
                       {"uri": OLD, "lastGlobalStep": 4200, "movedAt": timestamp(NOW),
                        "reason": "bucket migration"}]}


def test_the_records_are_asked_for_at_a_move_only() -> None:
    asked: list[bool] = []

    def completed() -> list[tuple[int, str]]:
        asked.append(True)
        return [(4200, at(-1))]
    status = body({"uri": NEW, "since": T0})
    history.storage_status(status, parsed("s3://new/runs"), NOW, completed)
    assert asked == []
    out = history.storage_status(status, parsed("s3://newer/runs"), NOW, completed)
    assert asked == [True] and out["earlier"][0]["lastGlobalStep"] == 4200


def test_the_same_prefix_changes_nothing() -> None:
    storage = {"uri": NEW, "since": T0, "reason": "m", "startFresh": False,
               "earlier": [{"uri": OLD, "lastGlobalStep": 10, "movedAt": T0}]}
    assert storage_status(body(dict(storage)), parsed("s3://new/runs", reason="m"),
                                  NOW, [(50, at(-1))]) == storage


def test_a_prefix_where_nothing_completed_since_it_became_current_is_not_recorded() -> None:
    # old (step 4200) -> mid at NOW-1h: the old run's newest record is never
    # expired and completed before the move; nothing completed at mid.
    storage = {"uri": "s3://mid/runs/ml/llama", "since": at(-1),
               "earlier": [{"uri": OLD, "lastGlobalStep": 4200, "movedAt": at(-1)}]}
    out = storage_status(body(storage, lastGlobalStep=4200), parsed("s3://new/runs"),
                                 NOW, [(4200, at(-2))])
    assert [e["uri"] for e in out["earlier"]] == [OLD]
    # Nor one in the second of the move (times are whole seconds): the old
    # prefix's pods may still complete a step then, never the new one's.
    out = storage_status(body(storage), parsed("s3://new/runs"), NOW,
                                 [(4200, at(-2)), (4250, at(-1))])
    assert [e["uri"] for e in out["earlier"]] == [OLD]
    # Once a checkpoint completed at mid, leaving it is remembered.
    out = storage_status(body(storage), parsed("s3://new/runs"), NOW,
                                 [(4200, at(-2)), (4300, at(-0.5))])
    assert [(e["uri"], e["lastGlobalStep"]) for e in out["earlier"]] == [
        ("s3://mid/runs/ml/llama", 4300), (OLD, 4200)]


def test_a_fresh_run_below_the_old_step_is_remembered_when_it_moves_on() -> None:
    # old@4200 -> new with a fresh start; the new run saves up to step 3000,
    # below the old run's 4200, whose record stays the newest (lastGlobalStep
    # stays 4200). Moving on from new must remember new, at 3000.
    status = body({"uri": OLD, "since": T0}, lastGlobalStep=4200)
    first = parsed("s3://new/runs", reason="m1", startFresh=True)
    status["status"]["storage"] = storage_status(status, first, NOW,
                                                         [(4200, at(-1))])
    assert history.told_to_restore(status, first, NOW) == []
    records = [(4200, at(-1)), (1000, at(1)), (3000, at(2))]
    second = parsed("s3://newer/runs", reason="m2", startFresh=True)
    out = storage_status(status, second, NOW + timedelta(hours=3), records)
    assert [(e["uri"], e["lastGlobalStep"], e.get("startFresh")) for e in out["earlier"]] == [
        (NEW, 3000, None), (OLD, 4200, True)]
    # startFresh left set from the first move waives nothing: the new run is told.
    status["status"]["storage"] = out
    assert [(s.uri, s.step) for s in history.told_to_restore(
        status, second, NOW + timedelta(hours=3))] == [(NEW, 3000)]


def _record(step: int, state: str, when: datetime) -> dict[str, Any]:
    """A one-writer Checkpoint record as the operator folds it at `when`."""
    r = build_record("ml", "llama", step, 1)
    r["status"] = aggregate.fold(r, {0: Claim(state, 10, ("local", "global"))}, when)
    return r


def test_what_completed_is_read_from_the_records_themselves() -> None:
    # The records as the reconcile finds them: the old run's newest (never
    # expired), the new run's steps, one expired by retention since, one not
    # complete yet.
    expired = _record(1000, "Global", NOW + timedelta(hours=1))
    expired["status"]["state"] = "Expired"
    recs = [_record(4200, "Global", NOW - timedelta(hours=1)), expired,
            _record(3000, "Global", NOW + timedelta(hours=2)),
            _record(3500, "Draining", NOW + timedelta(hours=3))]
    assert sorted(aggregate.completions(recs)) == [(1000, at(1)), (3000, at(2)), (4200, at(-1))]
    status = body({"uri": NEW, "since": timestamp(NOW), "reason": "m1", "startFresh": True,
                   "earlier": [{"uri": OLD, "lastGlobalStep": 4200, "startFresh": True}]},
                  lastGlobalStep=4200)
    out = storage_status(status, parsed("s3://newer/runs", reason="m2"),
                                 NOW + timedelta(hours=4), aggregate.completions(recs))
    assert [(e["uri"], e["lastGlobalStep"]) for e in out["earlier"]] == [
        (NEW, 3000), (OLD, 4200)]


def test_a_status_from_before_since_takes_any_complete_record_as_reached() -> None:
    storage = {"uri": "s3://mid/runs/ml/llama"}
    out = storage_status(body(storage), parsed("s3://new/runs"), NOW, [(4300, T0)])
    assert [(e["uri"], e["lastGlobalStep"]) for e in out["earlier"]] == [
        ("s3://mid/runs/ml/llama", 4300)]
    # ... except the step of the prefix before, which is where it was reached.
    storage["earlier"] = [{"uri": OLD, "lastGlobalStep": 4300}]
    out = storage_status(body(storage), parsed("s3://new/runs"), NOW, [(4300, T0)])
    assert [e["uri"] for e in out["earlier"]] == [OLD]
    assert storage_status(body(storage), parsed("s3://new/runs"), NOW, [])[
        "earlier"] == [{"uri": OLD, "lastGlobalStep": 4300}]


def test_without_records_the_status_says_what_completed_since() -> None:
    # The webhook: the newest global step counts when it completed after `since`.
    storage = {"uri": OLD, "since": at(-2)}
    for when, told in ((at(-1), [(OLD, 900)]), (at(-3), []), (None, [])):
        status = body(storage, lastGlobalStep=900, recoveryPointTime=when)
        assert [(s.uri, s.step) for s in history.told_to_restore(
            status, parsed("s3://new/runs"), NOW)] == told
    for step in (None, "4200", True, -1):
        status = body(storage, lastGlobalStep=step, recoveryPointTime=at(-1))
        assert history.told_to_restore(status, parsed("s3://new/runs"), NOW) == []


def test_at_most_five_newest_first() -> None:
    status: dict[str, Any] = body()
    for i in range(8):  # move to bucket-i, then a checkpoint reaches step 100 * i there
        status["status"]["storage"] = storage_status(
            status, parsed(f"s3://bucket-{i}/runs"), NOW + timedelta(hours=i),
            [(100 * j, at(j + 0.5)) for j in range(i)])
    earlier = status["status"]["storage"]["earlier"]
    assert [(e["uri"], e["lastGlobalStep"]) for e in earlier] == [
        (f"s3://bucket-{i}/runs/ml/llama", 100 * i) for i in (6, 5, 4, 3, 2)]
    assert earlier[0]["movedAt"] == "2026-11-29T17:00:00Z"


def test_a_move_back_drops_that_prefix() -> None:
    status = body({"uri": OLD, "since": T0})
    status["status"]["storage"] = storage_status(status, parsed("s3://new/runs"), NOW,
                                                         [(4200, at(-1))])
    back = storage_status(status, parsed("s3://old/runs"), NOW + timedelta(hours=2),
                                  [(4200, at(-1)), (4500, at(1))])
    assert back["uri"] == OLD and back["earlier"] == [
        {"uri": NEW, "lastGlobalStep": 4500, "movedAt": at(2)}]


def test_a_hand_edited_list_keeps_only_what_can_be_read() -> None:
    storage = {"uri": NEW, "since": T0, "earlier": [
        {"uri": "s3://kept-bucket/ml/llama", "lastGlobalStep": 7, "movedAt": "yesterday",
         "reason": "a\nb", "extra": "x", "startFresh": "yes"},
        {"uri": "", "lastGlobalStep": 1}, {"uri": "s3://x/ml/llama", "lastGlobalStep": "7"},
        {"uri": "s3://u:p@kept-bucket/y", "lastGlobalStep": 3},
        {"uri": "s3://kept-bucket/y\nFAKE=1", "lastGlobalStep": 3},
        {"uri": "http://x/y", "lastGlobalStep": 3}, "junk"]}
    out = storage_status(body(storage), parsed("s3://new/runs"), NOW)
    assert out["earlier"] == [{"uri": "s3://kept-bucket/ml/llama", "lastGlobalStep": 7,
                               "reason": "a b"}]
    told = history.told_to_restore(body(storage), parsed("s3://new/runs"), NOW)
    assert told == [EarlierStore("s3://kept-bucket/ml/llama", 7, "", "a b")]


def test_restore_is_told_a_move_before_the_reconcile_records_it() -> None:
    # The status still names the old prefix: a pod admitted in between is
    # protected too.
    status = body({"uri": OLD, "since": T0}, lastGlobalStep=4200, recoveryPointTime=at(-1))
    told = history.told_to_restore(status, parsed("s3://new/runs", reason="migration"), NOW)
    assert told == [EarlierStore(OLD, 4200, timestamp(NOW), "migration")]
    fresh = parsed("s3://new/runs", reason="migration", startFresh=True)
    assert fresh.start_fresh and history.told_to_restore(status, fresh, NOW) == []
    assert history.told_to_restore({}, parsed("s3://new/runs"), NOW) == []


def _moved(reason: str = "m1", **relocation: Any) -> dict[str, Any]:
    """A policy that moved old -> new (reason m1) after step 4200 completed at old."""
    status = body({"uri": OLD, "since": T0})
    status["status"]["storage"] = storage_status(
        status, parsed("s3://new/runs", reason=reason, **relocation), NOW, [(4200, at(-1))])
    return status


def test_a_fresh_start_set_after_the_move_needs_a_new_reason() -> None:
    status = _moved()
    assert [s.step for s in history.told_to_restore(
        status, parsed("s3://new/runs", reason="m1", startFresh=True), NOW)] == [4200]
    later = parsed("s3://new/runs", reason="start over", startFresh=True)
    assert history.told_to_restore(status, later, NOW) == []
    out = storage_status(status, later, NOW)
    assert out["earlier"][0]["startFresh"] is True
    assert (out["reason"], out["startFresh"]) == ("start over", True)


def test_start_fresh_left_set_waives_no_later_move() -> None:
    status = _moved(startFresh=True)
    assert status["status"]["storage"]["earlier"][0]["startFresh"] is True
    # Training went on at new; the next move, with its own new reason, while
    # startFresh was left true from the one before.
    nxt = parsed("s3://newer/runs", reason="m2", startFresh=True)
    later = NOW + timedelta(hours=2)
    out = storage_status(status, nxt, later, [(4200, at(-1)), (600, at(1))])
    assert [(e["uri"], e.get("startFresh")) for e in out["earlier"]] == [
        (NEW, None), (OLD, True)]
    status["status"]["storage"] = out
    assert [(s.uri, s.step) for s in history.told_to_restore(status, nxt, later)] == [
        (NEW, 600)]
    # Set anew (false, then true with a new reason): the fresh start counts again.
    off = parsed("s3://newer/runs", reason="m2")
    status["status"]["storage"] = storage_status(status, off, later)
    again = parsed("s3://newer/runs", reason="m3", startFresh=True)
    assert history.told_to_restore(status, again, later) == []


def test_the_reason_is_recorded_only_when_it_is_new() -> None:
    status = _moved()
    status["status"]["storage"] = storage_status(  # new -> newer, same reason
        status, parsed("s3://newer/runs", reason="m1"), NOW + timedelta(hours=2),
        [(4200, at(-1)), (4300, at(1))])
    assert [(e["uri"], e.get("reason")) for e in status["status"]["storage"]["earlier"]] == [
        (NEW, None), (OLD, "m1")]


def test_start_fresh_must_be_a_boolean() -> None:
    spec = {"selector": {"matchLabels": {"app": "a"}}, "model": {"parameters": "7B"},
            "interval": "15m", "localTier": {"path": "/mnt/ckptdrain/nvme"},
            "storage": {"uri": "s3://bucket/r"}, "relocation": {"reason": "x", "startFresh": "yes"}}
    with pytest.raises(InvalidInput, match=r"spec\.relocation\.startFresh: expected true or"):
        policy.parse("ml", "llama", spec, CFG)
    assert policy.parse("ml", "llama", {**spec, "relocation": {"reason": "x"}},
                        CFG).start_fresh is False
