"""The labels of a policy's namespace as the operator reads them
(apiserver/namespace_labels.py): a reading is reused for MAX_AGE_S, read
again after; when a read fails the last reading stands while it is trusted
(twice the recheck period), and past that, as with none, the failure names
the namespace and the reading is gone; a changed reading moves `version`.
A failed read is remembered a few seconds: callers within them are answered
at once, never a verdict; `held` never reads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptdrain.operator.apiserver import leadership, namespace_labels, reads

RECHECK_S = 60.0


@pytest.fixture
def apiserver(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """What the apiserver answers: the labels, or an error to raise; and the
    paths asked."""
    state: dict[str, Any] = {"labels": {"tenant": "a"}, "error": None, "asked": []}

    def get_json(path: str, query: list[tuple[str, str]], timeout: float) -> dict[str, Any]:
        state["asked"].append(path)
        if state["error"] is not None:
            raise state["error"]
        return {"metadata": {"name": path.rsplit("/", 1)[1], "labels": dict(state["labels"])}}

    clock = {"now": 1000.0}
    monkeypatch.setattr(reads, "get_json", get_json)
    monkeypatch.setattr(namespace_labels.time, "monotonic", lambda: clock["now"])
    state["clock"] = clock
    namespace_labels.forget()
    yield state
    namespace_labels.forget()


def test_a_recent_reading_is_reused_then_read_again(apiserver: dict[str, Any]) -> None:
    assert namespace_labels.recent("ml-a", RECHECK_S) == {"tenant": "a"}
    apiserver["labels"] = {"tenant": "b"}
    assert namespace_labels.recent("ml-a", RECHECK_S) == {"tenant": "a"}
    assert apiserver["asked"] == ["/api/v1/namespaces/ml-a"]
    apiserver["clock"]["now"] += namespace_labels.MAX_AGE_S
    assert namespace_labels.recent("ml-a", RECHECK_S) == {"tenant": "b"}


def test_fresh_always_reads_and_updates_what_recent_hands_out(
        apiserver: dict[str, Any]) -> None:
    namespace_labels.recent("ml-a", RECHECK_S)
    apiserver["labels"] = {}
    assert namespace_labels.fresh("ml-a") == {}
    assert namespace_labels.recent("ml-a", RECHECK_S) == {}


def test_a_failed_read_keeps_the_last_reading_only_while_trusted(
        apiserver: dict[str, Any]) -> None:
    namespace_labels.recent("ml-a", RECHECK_S)
    apiserver["clock"]["now"] += namespace_labels.MAX_AGE_S
    apiserver["error"] = reads.ApiError(403, "Forbidden")
    assert namespace_labels.recent("ml-a", RECHECK_S) == {"tenant": "a"}
    # Reads failing for good (an RBAC rollback): the label may be gone by
    # now, and the old reading must not keep the namespace allowed.
    apiserver["clock"]["now"] += 2 * RECHECK_S
    with pytest.raises(namespace_labels.LabelsUnreadable) as caught:
        namespace_labels.recent("ml-a", RECHECK_S)
    assert caught.value.field == "metadata.namespace" and "ml-a" in str(caught.value)
    apiserver["error"] = None
    apiserver["labels"] = {}
    apiserver["clock"]["now"] += namespace_labels.FAILURE_MEMORY_S
    assert namespace_labels.recent("ml-a", RECHECK_S) == {}


def test_never_read_and_unreadable_names_the_namespace(apiserver: dict[str, Any]) -> None:
    apiserver["error"] = reads.ApiError(503, "Service Unavailable")
    with pytest.raises(namespace_labels.LabelsUnreadable) as caught:
        namespace_labels.recent("ml-b", RECHECK_S)
    assert caught.value.field == "metadata.namespace" and "ml-b" in str(caught.value)
    with pytest.raises(reads.ApiError):
        namespace_labels.fresh("ml-b")


def test_expire_drops_readings_past_the_trusted_age(apiserver: dict[str, Any]) -> None:
    namespace_labels.recent("ml-a", RECHECK_S)
    apiserver["clock"]["now"] += 2 * RECHECK_S - 1
    namespace_labels.recent("ml-b", RECHECK_S)
    apiserver["clock"]["now"] += 1
    namespace_labels.expire(RECHECK_S)
    apiserver["error"] = reads.ApiError(403, "Forbidden")
    with pytest.raises(namespace_labels.LabelsUnreadable):
        namespace_labels.recent("ml-a", RECHECK_S)
    assert namespace_labels.recent("ml-b", RECHECK_S) == {"tenant": "a"}


def test_a_new_term_forgets_every_reading(apiserver: dict[str, Any]) -> None:
    namespace_labels.recent("ml-a", RECHECK_S)
    leadership.STATE.set(False)
    leadership.STATE.set(True)
    apiserver["error"] = reads.ApiError(403, "Forbidden")
    with pytest.raises(namespace_labels.LabelsUnreadable):
        namespace_labels.recent("ml-a", RECHECK_S)


def test_version_moves_only_when_a_reading_changes(apiserver: dict[str, Any]) -> None:
    namespace_labels.fresh("ml-a")
    before = namespace_labels.version()
    namespace_labels.fresh("ml-a")
    assert namespace_labels.version() == before
    apiserver["labels"] = {"tenant": "b"}
    namespace_labels.fresh("ml-a")
    moved = namespace_labels.version()
    assert moved != before
    apiserver["clock"]["now"] += 3 * RECHECK_S
    namespace_labels.expire(RECHECK_S)
    assert namespace_labels.version() != moved


def test_an_empty_namespace_is_refused_never_a_list(apiserver: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="namespace"):
        namespace_labels.fresh("")
    assert apiserver["asked"] == []


def test_a_failed_read_is_remembered_so_callers_do_not_pay_its_timeout_again(
        apiserver: dict[str, Any]) -> None:
    apiserver["error"] = TimeoutError("timed out")
    with pytest.raises(namespace_labels.LabelsUnreadable):
        namespace_labels.recent("ml-a", RECHECK_S)
    assert len(apiserver["asked"]) == 1
    # Every caller within the window is answered at once: still a retry.
    apiserver["clock"]["now"] += namespace_labels.FAILURE_MEMORY_S - 0.1
    for _ in range(5):
        with pytest.raises(namespace_labels.LabelsUnreadable) as caught:
            namespace_labels.recent("ml-a", RECHECK_S)
        assert "timed out" in str(caught.value) and "ml-a" in str(caught.value)
    assert len(apiserver["asked"]) == 1
    # Per namespace: another one is read.
    with pytest.raises(namespace_labels.LabelsUnreadable):
        namespace_labels.recent("ml-b", RECHECK_S)
    assert len(apiserver["asked"]) == 2
    # Past the window the apiserver is asked again, and its answer stands.
    apiserver["error"] = None
    apiserver["clock"]["now"] += 0.1
    assert namespace_labels.recent("ml-a", RECHECK_S) == {"tenant": "a"}
    assert len(apiserver["asked"]) == 3


def test_within_the_window_a_trusted_reading_is_still_served(
        apiserver: dict[str, Any]) -> None:
    namespace_labels.recent("ml-a", RECHECK_S)
    apiserver["clock"]["now"] += namespace_labels.MAX_AGE_S
    apiserver["error"] = TimeoutError("timed out")
    assert namespace_labels.recent("ml-a", RECHECK_S) == {"tenant": "a"}
    assert namespace_labels.recent("ml-a", RECHECK_S) == {"tenant": "a"}
    assert len(apiserver["asked"]) == 2  # the first reading, one failed read


def test_a_read_that_succeeds_ends_the_window(apiserver: dict[str, Any]) -> None:
    apiserver["error"] = TimeoutError("timed out")
    with pytest.raises(namespace_labels.LabelsUnreadable):
        namespace_labels.recent("ml-a", RECHECK_S)
    # The recheck (or policy admission) reads afresh, window or not.
    apiserver["error"] = None
    assert namespace_labels.fresh("ml-a") == {"tenant": "a"}
    assert namespace_labels.recent("ml-a", RECHECK_S) == {"tenant": "a"}
    assert len(apiserver["asked"]) == 2


def test_held_never_reads(apiserver: dict[str, Any]) -> None:
    with pytest.raises(namespace_labels.LabelsUnreadable) as caught:
        namespace_labels.held("ml-a", RECHECK_S)
    assert caught.value.field == "metadata.namespace" and "ml-a" in str(caught.value)
    assert apiserver["asked"] == []
    namespace_labels.fresh("ml-a")
    apiserver["labels"] = {"tenant": "b"}
    apiserver["clock"]["now"] += 2 * RECHECK_S - 1  # old, still trusted: served
    assert namespace_labels.held("ml-a", RECHECK_S) == {"tenant": "a"}
    before = namespace_labels.version()
    apiserver["clock"]["now"] += 1  # no longer trusted: dropped, and said
    with pytest.raises(namespace_labels.LabelsUnreadable):
        namespace_labels.held("ml-a", RECHECK_S)
    assert namespace_labels.version() != before
    assert apiserver["asked"] == ["/api/v1/namespaces/ml-a"]


def test_a_new_term_forgets_the_failures_too(apiserver: dict[str, Any]) -> None:
    apiserver["error"] = TimeoutError("timed out")
    with pytest.raises(namespace_labels.LabelsUnreadable):
        namespace_labels.recent("ml-a", RECHECK_S)
    namespace_labels.forget()
    apiserver["error"] = None
    assert namespace_labels.recent("ml-a", RECHECK_S) == {"tenant": "a"}


def test_the_class_page_states_how_long_a_failure_is_remembered() -> None:
    page = Path(__file__).resolve().parents[3] / "docs" / "checkpoint-classes.md"
    text = " ".join(page.read_text().split())
    assert (f"A failed read is remembered for {namespace_labels.FAILURE_MEMORY_S:g} s"
            in text)


def test_a_failure_on_a_short_budget_is_not_remembered_for_everyone(
        apiserver: dict[str, Any]) -> None:
    # A policy admission whose deadline is nearly spent times out on its own
    # budget: that says nothing of the apiserver, and must not answer every
    # other caller (a pod's admission, a reconcile) with a retry for 5 s.
    apiserver["error"] = TimeoutError("timed out")
    with pytest.raises(TimeoutError):
        namespace_labels.fresh("ml-a", 0.001)
    apiserver["error"] = None
    assert namespace_labels.recent("ml-a", RECHECK_S) == {"tenant": "a"}
    assert len(apiserver["asked"]) == 2


def test_an_answered_failure_is_remembered_whatever_the_budget(
        apiserver: dict[str, Any]) -> None:
    # A 403 is the apiserver's answer, not the caller's short budget.
    apiserver["error"] = reads.ApiError(403, "Forbidden")
    with pytest.raises(reads.ApiError):
        namespace_labels.fresh("ml-a", 0.001)
    apiserver["error"] = None
    with pytest.raises(namespace_labels.LabelsUnreadable, match="Forbidden"):
        namespace_labels.recent("ml-a", RECHECK_S)
    assert len(apiserver["asked"]) == 1


class _WriterAfterRelease:
    """namespace_labels' lock, with another caller's write run just after
    its first release: the moment a check made under it is stale."""

    def __init__(self, inner: Any, write: Any) -> None:
        self.inner, self.write = inner, write

    def __enter__(self) -> None:
        self.inner.acquire()

    def __exit__(self, *exc: object) -> None:
        self.inner.release()
        write, self.write = self.write, None
        if write is not None:
            write()


def test_an_expired_reading_dropped_never_takes_a_newer_one_with_it(
        apiserver: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    namespace_labels.fresh("ml-a")
    apiserver["clock"]["now"] += 2 * RECHECK_S  # no longer trusted
    apiserver["labels"] = {"tenant": "b"}
    monkeypatch.setattr(namespace_labels, "_lock", _WriterAfterRelease(
        namespace_labels._lock, lambda: namespace_labels.fresh("ml-a")))
    with pytest.raises(namespace_labels.LabelsUnreadable):
        namespace_labels.held("ml-a", RECHECK_S)  # it saw the old one
    assert namespace_labels.held("ml-a", RECHECK_S) == {"tenant": "b"}


def test_expire_never_drops_a_reading_taken_after_its_check(
        apiserver: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    namespace_labels.fresh("ml-a")
    apiserver["clock"]["now"] += 2 * RECHECK_S
    apiserver["labels"] = {"tenant": "b"}
    monkeypatch.setattr(namespace_labels, "_lock", _WriterAfterRelease(
        namespace_labels._lock, lambda: namespace_labels.fresh("ml-a")))
    namespace_labels.expire(RECHECK_S)
    assert namespace_labels.held("ml-a", RECHECK_S) == {"tenant": "b"}


def test_the_class_page_says_admission_and_the_recheck_always_read() -> None:
    page = Path(__file__).resolve().parents[3] / "docs" / "checkpoint-classes.md"
    text = " ".join(page.read_text().split())
    assert "A policy's admission and the namespace recheck always read" in text
