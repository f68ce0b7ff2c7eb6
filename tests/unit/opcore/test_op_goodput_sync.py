"""operator/goodput/sync.py: a leaving pod's own view is folded, not the
index's older one; a policy that is not there keeps nothing; a restarted
operator reads its own status back from v1beta1 (stored as a merge patch
leaves it: no nulls) and folds to the same; what a newer restore failure or
checkpoint cost no longer has is removed from the status."""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any

import pytest
from tests.support.goodput_views import interrupted, restarted

from ckptdrain.contract import api
from ckptdrain.contract.api import ANNOTATION_GOODPUT
from ckptdrain.contract.goodput import AgentView, PodView, RestoreView, pod_view
from ckptdrain.contract.policy_versions import V1BETA1
from ckptdrain.operator.apiserver import policy_edge
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


def _pruned(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def _merged(target: Any, patch: Any) -> Any:
    """A JSON merge patch (RFC 7386) applied, as the apiserver applies one: a
    null removes its key, and a new value keeps none of its nulls, not even
    inside a list's objects (evanphx/json-patch prunes them)."""
    if not isinstance(patch, dict):
        return _pruned(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merged(out.get(key), value)
    return out


Store = tuple[dict[str, Any], list[dict[str, Any]]]


@pytest.fixture()
def store(monkeypatch: pytest.MonkeyPatch) -> Store:
    """A policy stored at v1beta1, its status patched as the apiserver does;
    and the patches sent."""
    stored: dict[str, Any] = {"apiVersion": V1BETA1, "kind": api.KIND_POLICY,
                              "metadata": {"name": "llama", "namespace": "ns",
                                           "creationTimestamp": "2026-11-29T00:00:00Z"},
                              "spec": {"writers": 1}, "status": {}}
    sent: list[dict[str, Any]] = []

    def patch_status(plural: str, ns: str, name: str, change: dict[str, Any]) -> bool:
        sent.append(change)  # as kube.patch_status writes it: at v1beta1
        stored["status"] = _merged(stored["status"],
                                   policy_edge.written(plural, {"status": change})["status"])
        return True

    monkeypatch.setattr(goodput_sync.kube, "patch_status", patch_status)
    monkeypatch.setattr(goodput_sync.kube, "post_event", lambda *_: None)
    monkeypatch.setattr(goodput_sync.goodput_metrics, "publish", lambda *_: None)
    for state in (goodput_sync._seen, goodput_sync._departed, goodput_sync._written,
                  goodput_sync._failures, goodput_sync._costs):
        state.clear()
    return stored, sent


@pytest.mark.parametrize(("step", "step_s"), [(50, 0.5), (None, None)],
                         ids=["restored", "fresh-start"])
def test_a_restarted_operator_reads_its_v1beta1_status_back_to_the_same_result(
        store: Store, step: int | None, step_s: float | None) -> None:
    """The status is stored at v1beta1, every time in it RFC3339 (trainingAt
    too); an operator that restarts reads it back through its edge and,
    folding the same pods again, finds nothing to write. Also after a fresh
    start (no step restored, no step time known): the figures that are not
    there were never stored, and are not written again."""
    stored, sent = store
    t = 1795996800.0  # 2026-11-30T00:00:00Z
    old = interrupted("w-a", "0", t + 100.25, 57, {50: t + 90.5}, bound=t, step_s=step_s)
    failed = restarted("w-b", "0", t + 103, 2.0, None, None, None,
                       outcome="store_unavailable", reason="gave up", bound=t + 102.5)
    new = restarted("w-c", "0", t + 110.125, 1.5, step, step and "local", t + 118.375,
                    bound=t + 109)
    assert new.restore is not None
    new = dataclasses.replace(new, restore=dataclasses.replace(
        new.restore, agreement=(1, step, "agreed", "every rank reported")))

    # The first replacement's restore fails; the pod after it restores.
    goodput_sync.fold(KEY, policy_edge.seen(stored), [old, failed])
    goodput_sync.fold(KEY, policy_edge.seen(stored), [old, new])
    assert len(sent) == 2
    written = list(sent)
    (entry,) = stored["status"]["goodput"]["recent"]
    assert (entry["restorePod"], entry["recoverySeconds"]) == ("w-c", 18.125)
    assert entry["trainingAt"] == "2026-11-30T00:01:58.375000Z"
    assert entry["at"] == "2026-11-30T00:01:40.250000Z"
    assert stored["status"]["lastRestoreFailure"]["startedAt"] == "2026-11-30T00:01:43.000000Z"
    assert stored["status"]["lastRestoreAgreement"]["startedAt"] \
        == "2026-11-30T00:01:50.125000Z"
    # Read back, the core sees what it folded (the times too; the failed
    # restore's reason gone from lastInterruption with the retry).
    assert policy_edge.seen(stored)["status"]["goodput"] == goodput_sync._written[KEY]
    assert "restoreReason" not in stored["status"]["goodput"]["lastInterruption"]

    before = copy.deepcopy(stored["status"])
    for pods in ([old, new], [new], [failed, new]):
        goodput_sync._new_term()  # what this replica wrote is forgotten: read from the store
        goodput_sync.fold(KEY, policy_edge.seen(stored), pods)
        assert sent == written, [list(change) for change in sent[len(written):]]
        assert stored["status"] == before


def test_what_the_fold_dropped_is_named_null_in_its_merge_patch() -> None:
    """A merge patch keeps the keys it does not name: a new, open interruption
    in lastInterruption would keep showing the restore of the one before."""
    closed = {"pod": "w-a", "at": 1.0, "restoredStep": 50, "recoverySeconds": 8.0}
    opened = {"pod": "w-c", "at": 9.0}
    patch = goodput_sync.replacing({"lastInterruption": closed, "recent": [closed]},
                                   {"lastInterruption": opened, "recent": [opened]})
    assert patch == {"lastInterruption": {"pod": "w-c", "at": 9.0, "restoredStep": None,
                                          "recoverySeconds": None},
                     "recent": [opened]}  # a list is replaced whole
    assert _merged({"lastInterruption": closed}, patch) == {"lastInterruption": opened,
                                                            "recent": [opened]}
    assert goodput_sync.replacing(None, opened) == opened
    assert goodput_sync.replacing(closed, None) is None


def test_a_writers_restore_failure_after_a_readers_is_not_blamed_on_a_reader(
        store: Store) -> None:
    stored, _ = store
    t = 1795996800.0
    reader = PodView("r-a", None, reader="1", restore=RestoreView(
        outcome="none_verified", started_at=t + 10, seconds=1.0, reason="none verified"))
    writer = restarted("w-b", "0", t + 20, 2.0, None, None, None,
                       outcome="store_unavailable", reason="gave up")
    goodput_sync.fold(KEY, policy_edge.seen(stored), [reader])
    assert stored["status"]["lastRestoreFailure"]["reader"] == "1"
    goodput_sync.fold(KEY, policy_edge.seen(stored), [reader, writer])
    failure = stored["status"]["lastRestoreFailure"]
    assert (failure["pod"], failure["writer"]) == ("w-b", "0")
    assert "reader" not in failure


def _saver(name: str, overlap: float | None) -> PodView:
    return PodView(name, name[-1], agent=AgentView(
        blocked_s=30.0, saves=10, interval_s=600.0, overlap_target=0.1,
        drained_step=None if overlap is None else 40,
        drain_s=None if overlap is None else overlap * 1200, drain_overlap=overlap))


def test_the_drain_figures_leave_the_checkpoint_cost_with_the_pods_that_drained(
        store: Store) -> None:
    """The pod that drained is replaced by one that has saved but not yet
    drained: the old drain's figures are not the job's any more."""
    stored, _ = store
    goodput_sync.fold(KEY, policy_edge.seen(stored), [_saver("w-0", 0.2)])
    assert stored["status"]["checkpointCost"]["overlapRule"] == "Exceeds"
    goodput_sync.fold(KEY, policy_edge.seen(stored), [_saver("w-1", None)])
    costs = stored["status"]["checkpointCost"]
    assert costs["overlapRule"] == "Unknown" and costs["worstBlockingPod"] == "w-1"
    gone = {"drainOverlap", "drainOverlapPod", "drainedStep", "drainSeconds", "targetOverlap"}
    assert not gone & set(costs), costs
