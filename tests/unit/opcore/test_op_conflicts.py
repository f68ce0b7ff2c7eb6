"""policy/conflicts.py and status.phase: overlapping policies that got past
admission are marked Conflicting on both, and the phase follows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ckptdrain.operator.policy import conflicts
from ckptdrain.operator.policy import status as st

NOW = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
LATER = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


def body(name: str, selector: dict[str, Any], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    return {"metadata": meta, "spec": {"selector": selector}}


def sized(phase: str = "Ready", constrained: bool = False) -> dict[str, Any]:
    return {"phase": phase, "conditions": [
        st.condition(st.READY, True, "SizingComputed", "ok", 1, NOW),
        st.condition(st.DEGRADED, False, "AsExpected", "", 1, NOW),
        st.condition(st.CONSTRAINED, constrained, "PolicyCap" if constrained else "WithinCaps",
                     "", 1, NOW)]}


def test_both_of_an_overlapping_pair_name_each_other_and_a_third_is_left_alone() -> None:
    found = conflicts.find([
        body("a", {"matchLabels": {"app": "llama"}}),
        body("b", {"matchExpressions": [{"key": "app", "operator": "In",
                                         "values": ["llama", "x"]}]}),
        body("c", {"matchLabels": {"app": "other"}}),
        body("gone", {}, deleting=True),
    ])
    assert found["a"] == ("b", {"app": "llama", "ckptdrain.io/inject": "true"})
    assert found["b"] == ("a", {"app": "llama", "ckptdrain.io/inject": "true"})
    # A policy being deleted still counts, as pod admission counts it.
    assert found["c"] == ("gone", {"app": "other", "ckptdrain.io/inject": "true"})
    assert found["gone"] == ("a", {"app": "llama", "ckptdrain.io/inject": "true"})


def test_selectors_meeting_only_on_pods_that_never_opt_in_do_not_conflict() -> None:
    found = conflicts.find([
        body("a", {"matchExpressions": [{"key": "ckptdrain.io/inject",
                                         "operator": "NotIn", "values": ["true"]}]}),
        body("b", {})])
    assert found == {"a": None, "b": None}


def test_a_conflict_sets_the_condition_and_the_phase_and_its_end_restores_them() -> None:
    overlap = ("b", {"app": "llama", "ckptdrain.io/inject": "true"})
    status = sized(constrained=True, phase="Constrained")
    change = conflicts.with_conflict(status, overlap, 2, NOW)
    assert change is not None and change["phase"] == "Conflicting"
    cond = change["conditions"][-1]
    assert cond["type"] == "Conflicting" and cond["status"] == "True"
    assert cond["reason"] == "SelectorOverlap" and cond["observedGeneration"] == 2
    assert "CheckpointPolicy b" in cond["message"]
    assert "app=llama, ckptdrain.io/inject=true" in cond["message"]
    status = {**status, **change}
    assert conflicts.with_conflict(status, overlap, 2, LATER) is None  # nothing new
    # The same overlap at a new generation: the condition says it was seen.
    seen = conflicts.with_conflict(status, overlap, 3, LATER)
    assert seen is not None and seen["conditions"][-1]["observedGeneration"] == 3
    assert seen["conditions"][-1]["lastTransitionTime"] == cond["lastTransitionTime"]
    ended = conflicts.with_conflict(status, None, 3, LATER)
    assert ended is not None and ended["phase"] == "Constrained"
    assert ended["conditions"][-1]["status"] == "False"
    assert ended["conditions"][-1]["lastTransitionTime"] != cond["lastTransitionTime"]
    assert conflicts.with_conflict({**status, **ended}, None, 3, LATER) is None


def test_no_conflict_and_none_before_writes_nothing_and_unsized_gets_no_phase() -> None:
    assert conflicts.with_conflict(sized(), None, 1, NOW) is None
    change = conflicts.with_conflict({}, ("b", {}), 1, NOW)
    assert change is not None and "phase" not in change
    assert change["conditions"][0]["message"].startswith(
        "spec.selector overlaps CheckpointPolicy b: a pod labelled (no labels)")


def test_the_phase_puts_the_most_urgent_first() -> None:
    conflicting = st.condition(st.CONFLICTING, True, "SelectorOverlap", "", 1, NOW)
    stalled = st.condition(st.DEGRADED, True, "DrainStalled", "", 1, NOW)
    invalid = st.for_invalid("spec.x: bad", 1, NOW, [conflicting])["conditions"]
    assert st.phase(invalid) == "Invalid"
    assert st.phase([*sized()["conditions"], conflicting]) == "Conflicting"
    assert st.phase([stalled, conflicting]) == "Conflicting"
    assert st.phase([stalled]) == "Stalled"
    assert st.phase(sized(constrained=True)["conditions"]) == "Constrained"
    assert st.phase(sized()["conditions"]) == "Ready"


def test_sizing_and_a_stall_keep_a_conflict_in_the_phase() -> None:
    status = sized()
    status = {**status, **conflicts.with_conflict(status, ("b", {}), 1, NOW)}  # type: ignore[dict-item]
    stall = st.with_stall(status, "no checkpoint for 1h", 1, NOW)
    assert stall is not None and stall["phase"] == "Conflicting"
    assert any(c["type"] == "Conflicting" for c in stall["conditions"])
