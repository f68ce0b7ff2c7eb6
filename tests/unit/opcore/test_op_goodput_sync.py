"""operator/goodput/sync.py: a leaving pod's own view is folded, not the
index's older one; a policy that is not there keeps nothing."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ckptdrain.contract.api import ANNOTATION_GOODPUT
from ckptdrain.contract.goodput import AgentView, pod_view
from ckptdrain.operator.goodput import sync as goodput_sync

KEY = ("ns", "llama")


@pytest.fixture()
def patches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(goodput_sync.kube, "patch_status",
                        lambda plural, ns, name, change: sent.append(change) or True)
    monkeypatch.setattr(goodput_sync.goodput_metrics, "publish", lambda *_: None)
    for state in (goodput_sync._seen, goodput_sync._departed, goodput_sync._written,
                  goodput_sync._failures, goodput_sync._costs):
        state.clear()
    return sent


def _meta(view: AgentView, terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"annotations": {ANNOTATION_GOODPUT: view.to_json()},
                            "labels": {"ckptdrain.io/writer": "0"}}
    if terminating:
        meta["deletionTimestamp"] = "2026-11-26T10:00:00Z"
    return meta


POLICY = {"metadata": {"creationTimestamp": "2026-11-26T09:00:00Z"},
          "spec": {"writers": 1}, "status": {}}


def test_a_terminating_pods_interruption_is_folded_from_its_own_event(
        patches: list[dict[str, Any]]) -> None:
    now = time.time()
    running = AgentView(training_at=now - 100, first_step=0, step=50, step_s=0.5)
    assert goodput_sync.observe(KEY, "w-a", _meta(running))
    stale = pod_view("w-a", _meta(running))
    assert stale is not None
    # SIGTERM: the pod is terminating, its agent writes the interruption; the
    # index keeps the previous view for a terminating pod.
    stopped = AgentView(training_at=now - 100, first_step=0, step=57, step_s=0.5,
                        interrupted_at=now - 1, newest_local=57)
    assert goodput_sync.observe(KEY, "w-a", _meta(stopped, terminating=True))
    goodput_sync.fold(KEY, POLICY, [stale])
    (change,) = patches
    assert change["goodput"]["recent"][0]["pod"] == "w-a"


def test_a_later_view_without_the_interruption_does_not_erase_it(
        patches: list[dict[str, Any]]) -> None:
    """The interruption, then (before any fold) the drain's last patch from an
    agent that sent `interruptedAt: null`, then the pod's deletion: the
    interruption is still folded."""
    now = time.time()
    stopped = AgentView(training_at=now - 100, first_step=0, step=57, step_s=0.5,
                        interrupted_at=now - 5, newest_local=57)
    flushed = AgentView(training_at=now - 100, first_step=0, step=57, step_s=0.5,
                        newest_local=57, newest_global=57)
    assert goodput_sync.observe(KEY, "w-a", _meta(stopped, terminating=True))
    assert goodput_sync.observe(KEY, "w-a", _meta(flushed, terminating=True))
    assert goodput_sync.observe(KEY, "w-a", _meta(flushed), deleted=True)
    goodput_sync.fold(KEY, POLICY, [])
    (change,) = patches
    (entry,) = change["goodput"]["recent"]
    assert (entry["pod"], entry["step"]) == ("w-a", 57)


def test_nothing_is_kept_for_a_policy_that_is_not_there(patches: list[dict[str, Any]]) -> None:
    view = AgentView(training_at=time.time() - 10, first_step=0)
    assert not goodput_sync.observe(KEY, "w-a", _meta(view), has_policy=False)
    assert goodput_sync.observe(KEY, "w-a", _meta(view), deleted=True)
    goodput_sync.fold(KEY, None, [])
    assert KEY not in goodput_sync._departed and patches == []


def test_a_pod_that_gets_its_node_or_ends_asks_for_a_fold(patches: list[dict[str, Any]]) -> None:
    """When the job holds its resources bounds runtime goodput's denominator:
    a pod's status moving there (a node, the end) is folded, its other
    status changes are not."""
    now = time.time()
    view = AgentView(training_at=now - 100, first_step=0, step=50, step_s=0.5)
    running = {"phase": "Running", "startTime": "2026-11-26T09:00:00Z"}
    assert goodput_sync.observe(KEY, "w-a", _meta(view), status=running)
    assert not goodput_sync.observe(KEY, "w-a", _meta(view),
                                    status={**running, "podIP": "10.0.0.7"})
    done = {**running, "phase": "Succeeded", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"finishedAt": "2026-11-26T10:00:00Z"}}}]}
    assert goodput_sync.observe(KEY, "w-a", _meta(view), status=done)
    ended = pod_view("w-a", _meta(view), done)
    assert ended is not None
    goodput_sync.fold(KEY, POLICY, [ended])
    (change,) = patches
    held = change["goodput"]
    assert held["heldSince"] == 1795683600.0 and held["endedAt"] == 1795687200.0
    assert held["availableSeconds"] == 3600.0
