"""operator/policy/status.py and the record aggregate of operator/records/aggregate.py:
a policy's conditions and phase, a record's state from its writers' claims,
stalled drains, owners. Folding progress is in test_op_record_fold.py,
retention and recovery points in test_op_record_retention.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from tests.support.record_builders import NOW, record

from ckptdrain import sizing
from ckptdrain.contract import record as fmt
from ckptdrain.operator.policy import status
from ckptdrain.operator.records import aggregate as records


def sized(**kw: Any) -> sizing.Sizing:
    return sizing.compute(sizing.SizingInput(parameters=405e9, interval_s=900, **kw))


def cond(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == kind)


def test_ready_policy_status() -> None:
    st = status.for_sizing(sized(), 3, NOW)
    assert st["phase"] == "Ready" and st["requiredBandwidth"] == "63.0 GB/s"
    assert st["requiredBandwidthBytes"] == 63_000_000_000
    assert cond(st, "Ready")["status"] == "True"
    assert cond(st, "BandwidthConstrained")["status"] == "False"
    assert all(c["observedGeneration"] == 3 for c in st["conditions"])


def test_constrained_policy_reports_effective_overlap() -> None:
    st = status.for_sizing(sized(policy_cap=21e9), 1, NOW)
    c = cond(st, "BandwidthConstrained")
    assert st["phase"] == "Constrained" and c["status"] == "True" and c["reason"] == "PolicyCap"
    assert st["effectiveOverlap"] == "30%" and "effective overlap 30%" in c["message"]


def test_invalid_policy_status_names_the_field() -> None:
    st = status.for_invalid("spec.overlap: expected …", 2, NOW)
    assert st["phase"] == "Invalid"
    assert cond(st, "Ready")["reason"] == "InvalidSpec"
    assert cond(st, "Degraded")["status"] == "True"


def test_transition_time_moves_only_on_flip() -> None:
    first = status.for_sizing(sized(), 1, NOW)
    later = status.for_sizing(sized(), 2, NOW + timedelta(hours=1), first["conditions"])
    assert cond(later, "Ready")["lastTransitionTime"] == cond(first, "Ready")["lastTransitionTime"]
    flipped = status.for_invalid("x", 3, NOW + timedelta(hours=2), later["conditions"])
    assert cond(flipped, "Ready")["lastTransitionTime"] == "2026-01-02T05:04:05Z"


@pytest.mark.parametrize(("claims", "state"), [
    ({}, "Capturing"),
    ({"0": "Local"}, "Capturing"),
    ({"0": "Local", "1": "Local"}, "Local"),
    ({"0": "Global", "1": "Local"}, "Draining"),
    ({"0": "Global", "1": "Global"}, "Global"),
    ({"0": "Global", "1": "Failed"}, "Failed"),
])
def test_aggregate_state(claims: dict[str, str], state: str) -> None:
    assert records.summarize(record(1, claims)).state == state


def test_global_is_complete_only_with_every_writer() -> None:
    half = records.summarize(record(1, {"0": "Global"}))
    assert not half.complete and half.tiers == "local" and half.writers == "1/2"
    full = records.aggregate_patch(record(1, {"0": "Global", "1": "Global"}), NOW)
    assert full["state"] == "Global" and full["tiers"] == "global,local"
    assert full["completionTime"] == "2026-01-02T03:04:05Z" and full["sizeBytes"] == 200


def test_young_daly_and_recommended_interval_when_known() -> None:
    s = sizing.compute(sizing.SizingInput(parameters=405e9, mtti_s=9000, local_write_s=30))
    fields = status.sizing_fields(s)
    assert fields["recommendedInterval"] == "15m"  # a tenth of 150 m
    assert fields["youngDalyInterval"] == "12m15s"  # sqrt(2 × 30 s × 9000 s) = 734.8 s


def test_a_drain_stalls_after_two_missed_intervals() -> None:
    since = NOW - timedelta(hours=5)
    last = NOW - timedelta(minutes=31)
    assert status.drain_stall(last, since, 900, 90, 4, NOW) is None  # 31 m < 2×15 m + 90 s
    stall = status.drain_stall(NOW - timedelta(minutes=40), since, 900, 90, 4, NOW)
    assert stall is not None and "40m" in stall and "15m" in stall
    assert status.drain_stall(None, NOW - timedelta(minutes=10), 900, 90, 4, NOW) is None
    assert "no checkpoint" in (status.drain_stall(None, since, 900, 90, 4, NOW) or "")
    assert status.drain_stall(None, since, 900, 90, 0, NOW) is None  # nothing runs


def test_stall_flips_degraded_and_phase_and_back() -> None:
    ready = status.for_sizing(sized(), 1, NOW)
    stalled = status.with_stall(ready, "no checkpoint …", 1, NOW)
    assert stalled is not None and stalled["phase"] == "Stalled"
    assert cond(stalled, "Degraded")["reason"] == "DrainStalled"
    assert status.with_stall({**ready, **stalled}, "no checkpoint …", 1, NOW) is None
    healed = status.with_stall({**ready, **stalled}, None, 1, NOW)
    assert healed is not None and healed["phase"] == "Ready"
    assert cond(healed, "Degraded")["status"] == "False"
    assert status.with_stall(ready, None, 1, NOW) is None


def test_owner_patch_adds_the_policy_once() -> None:
    rec = fmt.build_record("ns", "pol", 1, 1)
    patch = records.owner_patch(rec, "uid-1")
    assert patch == {"metadata": {"ownerReferences": [{
        "apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointPolicy", "name": "pol",
        "uid": "uid-1"}]}}
    assert records.owner_patch(fmt.build_record("ns", "pol", 1, 1, "uid-1"), "uid-1") is None
    assert records.owner_patch(rec, None) is None


def test_two_live_pods_on_one_writer_are_named_in_the_condition() -> None:
    ok = status.writers_check([("a", "0", 2), ("b", "1", 2)], 2)
    assert ok == (True, "Consistent", "2 live pod(s), each its own writer")
    shared = status.writers_check([("a", "1", None), ("b", "0", None), ("c", "1", None)], 2)
    assert shared[:2] == (False, "DuplicateWriter")
    assert "writer 1 is held by pods a, c" in shared[2]
    off = status.writers_check([("a", "0", 4), ("b", "1", 4)], 2)
    assert off[:2] == (False, "WritersMismatch")
    assert "spec.writers is 2 but pod a's workload has 4 pods that write" in off[2]


def test_writers_condition_is_written_once_and_kept_by_sizing() -> None:
    base = status.for_sizing(sized(), 1, NOW)
    check = status.writers_check([("a", "0", None), ("b", "0", None)], 2)
    change = status.with_writers(base, check, 1, NOW)
    assert change is not None
    after = {**base, **change}
    assert cond(after, "WritersConsistent")["reason"] == "DuplicateWriter"
    assert status.with_writers(after, check, 1, NOW) is None  # unchanged: no write
    # Re-sizing rewrites its own four conditions and keeps this one.
    resized = status.for_sizing(sized(), 2, NOW, after["conditions"])
    assert cond(resized, "WritersConsistent")["status"] == "False"
    assert len(resized["conditions"]) == 5
    # Nothing sized yet: nothing to attach the condition to.
    assert status.with_writers({}, check, 1, NOW) is None


def test_a_writer_retrying_a_store_that_does_not_answer_is_not_a_failed_checkpoint() -> None:
    from ckptdrain.operator.records.aggregate import summarize

    record = {"spec": {"writers": 2}, "status": {"writers": {
        "0": {"state": "Global", "bytes": 5, "tiers": ["global", "local"]},
        "1": {"state": "Retrying", "bytes": 5, "tiers": ["local"],
              "message": "drain: endpoint did not answer; retrying in 4s"}}}}
    s = summarize(record)
    assert (s.state, s.complete, s.tiers) == ("Retrying", False, "local")
    record["status"]["writers"]["1"]["state"] = "Failed"
    assert summarize(record).state == "Failed"
