"""The operator's namespace recheck (class_events.recheck): each namespace
whose policies name a class that allows namespaces by label is read once a
pass, and each of its policies whose ClassResolved would change is
reconciled as a retried pass of its own; a namespace that cannot be read
is skipped, a standby reads nothing, and a pass over its time budget goes on
at the next one from where it stopped."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from ckptdrain.operator import class_events, config
from ckptdrain.operator.apiserver import class_view, leadership, namespace_labels, reads
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.coalesce import Coalescer

LOG = logging.getLogger("test")
SCHEDULE = class_events._schedule
CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0",
                            namespace_recheck_s=60.0)
TEAM_A = {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
          "metadata": {"name": "team-a", "creationTimestamp": "2026-11-01T00:00:00Z"},
          "spec": {"nodeTier": {"root": "/mnt/nvme"},
                   "namespaces": {"from": "Selector",
                                  "selector": {"matchLabels": {"tenant": "a"}}}}}
EVERYONE = {**TEAM_A, "metadata": {**TEAM_A["metadata"], "name": "everyone"},
            "spec": {"nodeTier": {"root": "/mnt/nvme"}}}


def _body(namespace: str, name: str, cls: str = "team-a") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "generation": 1},
            "spec": {"checkpointClassName": cls}, "status": {}}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch,
          no_checkpoint_classes: class_view.ClassView) -> Iterator[dict[str, Any]]:
    """Namespaces' labels as the apiserver answers (a namespace in `broken`
    answers 403), the namespaces read, and the policies scheduled."""
    no_checkpoint_classes.replace([TEAM_A, EVERYONE], "1")
    state: dict[str, Any] = {"read": [], "scheduled": [], "broken": set(),
                             "stale": lambda body: True, "labels": {"tenant": "a"},
                             "joint": []}

    def get_json(path: str, query: Any, timeout: float) -> dict[str, Any]:
        namespace = path.rsplit("/", 1)[1]
        state["read"].append(namespace)
        if namespace in state["broken"]:
            raise reads.ApiError(403, "Forbidden")
        return {"metadata": {"name": namespace, "labels": dict(state["labels"])}}

    monkeypatch.setattr(reads, "get_json", get_json)

    def joint_pass(key: Any, *args: Any, **kwargs: Any) -> None:
        # As the joint pass asked for would, once run: it parses the labels now held.
        state["joint"].append(key)
        monkeypatch.setattr(rebalance, "_joint_labels", namespace_labels.version())

    monkeypatch.setattr(rebalance, "schedule", joint_pass)
    monkeypatch.setattr(rebalance, "_joint_labels", namespace_labels.version())
    monkeypatch.setattr(class_events, "stale", lambda cfg, body: state["stale"](body))
    monkeypatch.setattr(class_events, "_schedule", lambda key, *a: state["scheduled"].append(key))
    monkeypatch.setattr(class_events, "_recheck_after", "")
    namespace_labels.forget()
    yield state
    namespace_labels.forget()
    leadership.STATE.set(True)


INDEX = {("ml-a", "p"): [_body("ml-a", "p")], ("ml-a", "q"): [_body("ml-a", "q")],
         ("ml-b", "p"): [_body("ml-b", "p")],
         ("ml-c", "open"): [_body("ml-c", "open", cls="everyone")]}


def recheck(budget_s: float = 30.0, index: dict[Any, Any] = INDEX) -> None:
    class_events.recheck(CFG, SimpleNamespace(config=CFG), LOG,  # type: ignore[arg-type]
                         {"checkpointpolicy_index": index, "pod_index": {}}, budget_s)


def test_each_labelled_namespace_is_read_once_and_its_stale_policies_scheduled(
        world: dict[str, Any]) -> None:
    world["stale"] = lambda body: body["metadata"]["name"] != "q"
    recheck()
    # ml-c's class allows every namespace: its labels are never asked for.
    assert world["read"] == ["ml-a", "ml-b"]
    assert world["scheduled"] == [("ml-a", "p"), ("ml-b", "p")]


def test_a_namespace_that_cannot_be_read_is_skipped_the_others_judged(
        world: dict[str, Any]) -> None:
    world["broken"] = {"ml-a"}
    recheck()
    assert world["read"] == ["ml-a", "ml-b"]
    assert world["scheduled"] == [("ml-b", "p")]


def test_a_standby_reads_and_schedules_nothing(world: dict[str, Any]) -> None:
    leadership.STATE.set(False)
    recheck()
    assert (world["read"], world["scheduled"]) == ([], [])


def test_leadership_lost_mid_pass_stops_it(world: dict[str, Any]) -> None:
    def stale_then_paused(body: dict[str, Any]) -> bool:
        leadership.STATE.set(False)  # paused while judging ml-a's first policy
        return True

    world["stale"] = stale_then_paused
    recheck()
    assert world["read"] == ["ml-a"]
    assert world["scheduled"] == [("ml-a", "p")]


def test_a_pass_over_its_budget_goes_on_next_time_from_where_it_stopped(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"now": 100.0}

    def slow_read(path: str, query: Any, timeout: float) -> dict[str, Any]:
        clock["now"] += 20  # each GET takes 20 s
        world["read"].append(path.rsplit("/", 1)[1])
        return {"metadata": {"labels": {"tenant": "a"}}}

    monkeypatch.setattr(reads, "get_json", slow_read)
    monkeypatch.setattr(class_events.time, "monotonic", lambda: clock["now"])
    recheck(budget_s=10.0)
    assert world["read"] == ["ml-a"]
    recheck(budget_s=10.0)
    assert world["read"] == ["ml-a", "ml-b"]
    recheck(budget_s=10.0)
    assert world["read"] == ["ml-a", "ml-b", "ml-a"]


def test_rotation_starts_after_the_last_one_read() -> None:
    assert class_events.rotation(["a", "b", "c"], "") == ["a", "b", "c"]
    assert class_events.rotation(["a", "b", "c"], "a") == ["b", "c", "a"]
    assert class_events.rotation(["a", "c"], "b") == ["c", "a"]
    assert class_events.rotation(["a", "b"], "b") == ["a", "b"]


def test_a_policy_whose_labels_cannot_be_told_is_left_as_it_is(
        world: dict[str, Any]) -> None:
    def unknown(body: dict[str, Any]) -> bool:
        if body["metadata"]["name"] == "p" and body["metadata"]["namespace"] == "ml-a":
            raise namespace_labels.LabelsUnreadable("metadata.namespace", "readable", "403")
        return True

    world["stale"] = unknown
    recheck()
    assert world["scheduled"] == [("ml-a", "q"), ("ml-b", "p")]


def test_one_failing_policy_stops_no_other_and_is_retried(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    done = threading.Event()

    def reconcile(body: Any, **_: Any) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        calls.append(key)
        if key == ("ml-a", "p") and calls.count(key) == 1:
            raise RuntimeError("policies ml-a/p changed under 5 status writes in a row")
        if len(calls) == 4:
            done.set()

    # The real _schedule, over a Coalescer that retries at once.
    monkeypatch.setattr(class_events, "_schedule", SCHEDULE)
    monkeypatch.setattr(class_events, "reconcile_policy", reconcile)
    monkeypatch.setattr(class_events, "_rejudged", Coalescer("test", retry_delay=0.05))
    recheck(index={k: v for k, v in INDEX.items() if k[0] != "ml-c"})
    assert done.wait(10), calls
    assert sorted(calls) == [("ml-a", "p"), ("ml-a", "p"), ("ml-a", "q"), ("ml-b", "p")]


def test_a_pass_that_finds_labels_changed_recomputes_the_joint_budgets(
        world: dict[str, Any]) -> None:
    # No policy's ClassResolved moves (no reconcile asks for a joint pass),
    # yet a namespace's labels decide its policies' share of the cluster cap.
    world["stale"] = lambda body: False
    recheck()  # a start or a new term: every reading is new
    assert world["joint"] == [rebalance.JOINT]
    recheck()
    assert world["joint"] == [rebalance.JOINT]  # the same labels: no pass
    world["labels"] = {"tenant": "b"}
    recheck()
    assert world["joint"] == [rebalance.JOINT, rebalance.JOINT]
    assert world["scheduled"] == []


def test_labels_another_reader_moved_first_still_bring_a_joint_pass(
        world: dict[str, Any]) -> None:
    # A reconcile's read finds the change before the recheck does: the
    # recheck's own pass then moves nothing, yet no joint pass parsed it.
    world["stale"] = lambda body: False
    recheck()
    world["labels"] = {"tenant": "b"}
    for namespace in sorted({key[0] for key in INDEX}):  # the policies' reconciles
        namespace_labels.fresh(namespace)
    recheck()
    assert world["joint"] == [rebalance.JOINT, rebalance.JOINT]


def test_a_standby_asks_for_no_joint_pass(world: dict[str, Any]) -> None:
    leadership.STATE.set(False)
    recheck()
    assert world["joint"] == []


def test_the_first_pass_runs_at_start_and_at_a_new_term_without_waiting(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    passes: queue.Queue[bool] = queue.Queue()
    monkeypatch.setattr(class_events, "recheck", lambda *a: passes.put(leadership.active()))
    started, due = threading.Event(), threading.Event()
    due.set()  # as at import
    monkeypatch.setattr(class_events, "_recheck_started", started)
    monkeypatch.setattr(class_events, "_recheck_due", due)
    try:
        # The period is a minute: a pass within seconds is one not waited for.
        class_events.start_recheck(SimpleNamespace(config=CFG), LOG, {})  # type: ignore[arg-type]
        assert passes.get(timeout=5) is True
        leadership.STATE.set(False)
        leadership.STATE.set(True)  # this replica leads again: a new term
        assert passes.get(timeout=5) is True
        assert passes.empty()
    finally:
        started.clear()  # the thread ends at its next wake
        due.set()
