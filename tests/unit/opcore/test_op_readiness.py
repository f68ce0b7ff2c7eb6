"""Ready means every selected pod is protected: policy/status.py's ready()
and phase(), and policy/readiness.py's census patch; the sizing pass and the
census each keep the other's verdict."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ckptdrain.operator.policy import readiness
from ckptdrain.operator.policy import status as st
from ckptdrain.sizing import SizingInput, compute

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)
NONE = {"selected": 0, "protected": 0, "starting": 0, "waiting": 0, "unprotected": 0}


def counts(protected: int = 0, starting: int = 0, unprotected: int = 0,
           waiting: int = 0) -> dict[str, int]:
    return {"selected": protected + starting + waiting + unprotected, "protected": protected,
            "starting": starting, "waiting": waiting, "unprotected": unprotected}


def pods(c: dict[str, int], generation: int = 1) -> dict[str, Any]:
    return {**c, "observedGeneration": generation}


def sized(previous: list[dict[str, Any]] | None = None, generation: int = 1,
          now: datetime = NOW, unprotected: list[str] | None = None,
          selected: int = 0) -> dict[str, Any]:
    status = st.for_sizing(compute(SizingInput(parameters=1e9, interval_s=900)), generation,
                           now, previous or [], active_drainers=2, unprotected=unprotected,
                           selected=selected)
    return {**status, "drainers": 2}  # as the sizing handler writes it


def ready_of(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == st.READY)


def census(status: dict[str, Any], names: list[str], c: dict[str, int],
           generation: int = 1, now: datetime = NOW) -> dict[str, Any]:
    """The status after the census pass (the patch merged as the apiserver would)."""
    return {**status, **(readiness.with_pods(status, c, names, generation, now) or {})}


def test_ready_is_true_without_unprotected_pods_and_false_with_them() -> None:
    ok = st.ready("sized", [], 3, 1, NOW)
    assert (ok["status"], ok["reason"], ok["message"]) == ("True", "SizingComputed", "sized")
    bad = st.ready("sized", ["w-1", "w-0"], 3, 2, NOW)
    assert (bad["status"], bad["reason"], bad["observedGeneration"]) == (
        "False", "PodsUnprotected", 2)
    assert bad["message"].startswith("2 of 3 selected pod(s) run unprotected")
    assert bad["message"].endswith(": w-0, w-1")
    # metav1.Condition's shape, and the reason the CRD's pattern allows.
    assert set(bad) == {"type", "status", "reason", "message", "lastTransitionTime",
                        "observedGeneration"}


def test_the_message_names_ten_pods_and_counts_them_all() -> None:
    message = st.ready("s", [f"p-{i:02d}" for i in range(25)], 40, 1, NOW)["message"]
    assert message.startswith("25 of 40 selected pod(s)")
    assert "p-09" in message and "p-10" not in message and message.endswith("and 15 more")


def test_without_a_count_the_sizing_pass_keeps_the_census_verdict() -> None:
    flagged = st.ready("s", ["w-0"], 1, 1, NOW)
    kept = st.ready("new sizing", None, 0, 2, LATER, [flagged])
    assert kept == flagged  # observedGeneration too: the census has not recounted
    fine = st.ready("new sizing", None, 0, 2, LATER, [st.ready("s", [], 1, 1, NOW)])
    assert (fine["status"], fine["message"], fine["lastTransitionTime"]) == (
        "True", "new sizing", "2026-01-01T00:00:00Z")


# Every combination of the conditions phase() reads, against its order.
@pytest.mark.parametrize("invalid, conflicting, stalled, unprotected, constrained",
                         list(itertools.product([False, True], repeat=5)))
def test_the_phase_is_the_most_urgent_of_six(invalid: bool, conflicting: bool, stalled: bool,
                                             unprotected: bool, constrained: bool) -> None:
    ready = st.condition(st.READY, False, "InvalidSpec", "", 1, NOW) if invalid \
        else st.ready("s", ["w-0"] if unprotected else [], 1, 1, NOW)
    conditions = [
        ready,
        st.condition(st.CONFLICTING, conflicting, "Overlap", "", 1, NOW),
        st.condition(st.DEGRADED, stalled, "DrainStalled" if stalled else "AsExpected", "",
                     1, NOW),
        st.condition(st.CONSTRAINED, constrained, "ClusterCap", "", 1, NOW)]
    expected = ("Invalid" if invalid else "Conflicting" if conflicting else
                "Stalled" if stalled else "Unprotected" if unprotected else
                "Constrained" if constrained else "Ready")
    assert st.phase(conditions) == expected
    assert expected in st.PHASES


def test_the_census_turns_ready_false_and_back_and_writes_only_changes() -> None:
    status = sized()
    first = ready_of(status)
    counted = readiness.with_pods(status, counts(protected=2), [], 1, NOW)
    assert counted == {"pods": pods(counts(protected=2))}  # Ready was already right
    status = {**status, **counted}
    assert readiness.with_pods(status, counts(protected=2), [], 1, LATER) is None
    status = census(status, ["bare"], counts(protected=2, unprotected=1), now=LATER)
    assert status["phase"] == "Unprotected" and status["pods"]["unprotected"] == 1
    assert ready_of(status)["reason"] == "PodsUnprotected"
    assert ready_of(status)["lastTransitionTime"] == "2026-01-01T00:05:00Z"
    others = [c for c in status["conditions"] if c["type"] != st.READY]
    assert others == [c for c in sized()["conditions"] if c["type"] != st.READY]
    # The bare pod went: Ready is True again, with the sizing's own message.
    status = census(status, [], counts(protected=2))
    assert status["phase"] == "Ready"
    assert {k: ready_of(status)[k] for k in ("status", "reason", "message")} == {
        k: first[k] for k in ("status", "reason", "message")}


def test_starting_pods_keep_ready_true_and_no_pods_is_ready() -> None:
    status = sized()
    assert census(status, [], counts(starting=3))["phase"] == "Ready"
    # Pods not scheduled yet (gated, unschedulable) run nothing: Ready stays.
    assert census(status, [], counts(waiting=4, protected=1))["phase"] == "Ready"
    empty = census(status, [], NONE)
    assert empty["pods"] == pods(NONE) and ready_of(empty)["status"] == "True"


def test_an_invalid_or_unsized_policy_gets_the_counts_only() -> None:
    invalid = st.for_invalid("spec.interval: expected a duration", 2, NOW)
    patch = readiness.with_pods(invalid, counts(unprotected=1), ["bare"], 2, NOW)
    assert patch == {"pods": pods(counts(unprotected=1), 2)}
    assert readiness.with_pods({}, NONE, [], 1, NOW) == {"pods": pods(NONE)}


def test_sizing_and_census_keep_each_others_truth() -> None:
    flagged = census(sized(), ["bare"], counts(unprotected=1))
    resized = {**flagged, **sized(flagged["conditions"], generation=2, now=LATER)}
    assert ready_of(resized) == ready_of(flagged) and resized["phase"] == "Unprotected"
    # Invalid wins over the pods; valid again, the sizing pass counts the
    # pods as it writes Ready: never True for a moment.
    invalid = {**resized, **st.for_invalid("bad", 3, LATER, resized["conditions"])}
    assert invalid["phase"] == "Invalid"
    valid = {**invalid, **sized(invalid["conditions"], 4, LATER, ["bare"], 1),
             "pods": pods(counts(unprotected=1), 4)}
    assert ready_of(valid)["status"] == "False" and valid["phase"] == "Unprotected"
    assert not readiness.needs_count({"metadata": {"generation": 4}, "status": valid})
    assert census(valid, ["bare"], counts(unprotected=1), generation=4) == valid


def test_which_policy_events_call_for_a_count() -> None:
    def body(status: dict[str, Any], generation: int = 1) -> dict[str, Any]:
        return {"metadata": {"generation": generation}, "status": status}

    fine = census(sized(), [], counts(protected=1))
    flagged = census(sized(), ["bare"], counts(unprotected=1))
    assert readiness.needs_count(body({}))  # never counted
    assert not readiness.needs_count(body(fine))
    assert not readiness.needs_count(body(flagged))
    assert readiness.needs_count(body(flagged, generation=2))  # a new selector
    assert readiness.needs_count(body(fine, generation=2))  # whatever Ready says
    # Ready disagreeing with the counts (written by another pass meanwhile).
    assert readiness.needs_count(body({**fine, "pods": flagged["pods"]}))
    assert not readiness.needs_count(body({**st.for_invalid("bad", 1, NOW), "pods": NONE}))


def test_the_sized_event_tells_the_sizing_whatever_ready_says() -> None:
    fine = sized()
    assert st.sizing_summary(fine) == ready_of(fine)["message"] \
        == "14.0 GB every 15m needs 156 MB/s; 2 drainer(s)"
    flagged = census(fine, ["bare"], counts(unprotected=1))
    resized = {**sized(flagged["conditions"]), "drainers": 2}
    assert ready_of(resized)["reason"] == "PodsUnprotected"
    assert st.sizing_summary(resized) == st.sizing_summary(fine)


def test_the_sizing_pass_writes_the_right_ready_first() -> None:
    # Created over a pod admitted while admission was off: never True first.
    created = sized(unprotected=["bare"], selected=1)
    assert ready_of(created)["status"] == "False" and created["phase"] == "Unprotected"
    assert ready_of(created)["reason"] == "PodsUnprotected"
    # Invalid, then valid again while the pod is still there: False at once.
    invalid = {**created, **st.for_invalid("bad", 2, LATER, created["conditions"])}
    valid = {**invalid, **sized(invalid["conditions"], 3, LATER, ["bare"], 1)}
    assert ready_of(valid)["status"] == "False" and valid["phase"] == "Unprotected"
    # And True at once when the pods are all protected.
    fixed = sized(valid["conditions"], 4, LATER, [], 1)
    assert ready_of(fixed)["status"] == "True" and fixed["phase"] == "Ready"
