"""The PodsUnprotected condition: count, bounded names, remedy; other
conditions survive the sizing writer and the sweep alike."""

from __future__ import annotations

from datetime import UTC, datetime

from ckptdrain.operator.policy import status as st
from ckptdrain.sizing import SizingInput, compute

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _cond(patch: dict, kind: str) -> dict:
    return next(c for c in patch["conditions"] if c["type"] == kind)


def test_nothing_to_report_and_never_was_writes_nothing() -> None:
    assert st.with_unprotected({}, [], 1, NOW) is None


def test_bare_pods_set_the_condition_with_count_names_and_remedy() -> None:
    patch = st.with_unprotected({}, ["w-1", "w-0"], 3, NOW)
    assert patch is not None
    c = _cond(patch, st.UNPROTECTED)
    assert (c["status"], c["reason"], c["observedGeneration"]) == (
        "True", "AdmittedWithoutInjection", 3)
    assert c["message"].startswith("2 selected pod(s) run without injection")
    assert "w-0, w-1" in c["message"] and "Delete them" in c["message"]
    # Unchanged → no patch; cleared → False, kept as a record.
    assert st.with_unprotected(patch, ["w-0", "w-1"], 3, NOW) is None
    cleared = st.with_unprotected(patch, [], 3, NOW)
    assert cleared is not None and _cond(cleared, st.UNPROTECTED)["status"] == "False"


def test_names_are_bounded_and_the_count_is_exact() -> None:
    pods = [f"p-{i:03d}" for i in range(250)]
    message = _cond(st.with_unprotected({}, pods, 1, NOW) or {}, st.UNPROTECTED)["message"]
    assert message.startswith("250 selected pod(s)")
    assert "p-009" in message and "p-010" not in message and "and 240 more" in message


def test_the_sizing_writer_and_the_sweep_keep_each_others_conditions() -> None:
    flagged = st.with_unprotected({}, ["w-0"], 1, NOW) or {}
    sized = st.for_sizing(compute(SizingInput(parameters=1e9, interval_s=900)), 1, NOW,
                          flagged["conditions"])
    assert {c["type"] for c in sized["conditions"]} == {
        st.READY, st.DEGRADED, st.CONSTRAINED, st.ADJUSTED, st.UNPROTECTED}
    invalid = st.for_invalid("bad", 2, NOW, sized["conditions"])
    assert _cond(invalid, st.UNPROTECTED)["status"] == "True"
    again = st.with_unprotected(sized, [], 1, NOW) or {}
    assert {c["type"] for c in again["conditions"]} == {
        st.READY, st.DEGRADED, st.CONSTRAINED, st.ADJUSTED, st.UNPROTECTED}
