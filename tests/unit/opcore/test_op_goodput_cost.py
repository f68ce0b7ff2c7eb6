"""operator/goodput/cost.py: the two rules (blocking per save against 5% of
the interval, the drain's overlap against its target) from the pods' views,
and when they are worth a status patch; sync.py folds them into
`status.checkpointCost`."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ckptdrain.contract.api import ANNOTATION_GOODPUT
from ckptdrain.contract.goodput import AgentView, PodView, parse_agent
from ckptdrain.operator.goodput import cost
from ckptdrain.operator.goodput import sync as goodput_sync


def _pod(name: str, blocked: float = 0.0, saves: int = 0, interval: float | None = 600.0,
         overlap: float | None = None, target: float | None = 0.1,
         reader: str | None = None) -> PodView:
    return PodView(name=name, writer=None if reader else name[-1], reader=reader,
                   agent=AgentView(blocked_s=blocked, saves=saves, interval_s=interval,
                                   overlap_target=target, drained_step=None if overlap is None
                                   else 40, drain_s=None if overlap is None else overlap * 1200,
                                   drain_overlap=overlap))


def test_the_worst_pod_judges_each_rule() -> None:
    pods = [_pod("w0", blocked=30.0, saves=10, overlap=0.06),   # 3 s a save: 0.5%
            _pod("w1", blocked=400.0, saves=10, overlap=0.14),  # 40 s a save: 6.7%
            _pod("r0", blocked=900.0, saves=1, reader="0")]     # a reader never saves
    out = cost.checkpoint_cost(pods)
    assert out == {
        "blockingBudget": 0.05, "pods": 2, "saves": 20,
        "blockingPerSaveSeconds": 21.5, "worstBlockingPerSaveSeconds": 40.0,
        "worstBlockingPod": "w1", "intervalSeconds": 600.0, "blockingFraction": 0.06667,
        "blockingRule": "Exceeds",
        "drainOverlap": 0.14, "drainOverlapPod": "w1", "drainedStep": 40,
        "drainSeconds": 168.0, "targetOverlap": 0.1, "overlapRule": "Exceeds"}


def test_within_both_rules_and_unknown_without_figures() -> None:
    out = cost.checkpoint_cost([_pod("w0", blocked=3.0, saves=2, overlap=0.1)])
    assert out is not None
    assert (out["blockingRule"], out["overlapRule"]) == ("Within", "Within")  # at the target
    # Saved, never drained (no store, or not yet): the overlap is not known.
    out = cost.checkpoint_cost([_pod("w0", blocked=3.0, saves=2)])
    assert out is not None and out["overlapRule"] == "Unknown" and "drainOverlap" not in out
    # An older agent: saves without the interval it runs with.
    out = cost.checkpoint_cost([_pod("w0", blocked=3.0, saves=2, interval=None,
                                     overlap=0.2, target=None)])
    assert out is not None
    assert (out["blockingRule"], out["overlapRule"]) == ("Unknown", "Unknown")
    assert cost.checkpoint_cost([_pod("w0")]) is None  # nothing saved or drained yet
    assert cost.checkpoint_cost([PodView(name="w0", writer="0")]) is None


@pytest.mark.parametrize(("before", "after", "patch"), [
    (dict(blocked=30.0, saves=10), dict(blocked=33.0, saves=11), False),  # 3.0 -> 3.0 s
    (dict(blocked=30.0, saves=10), dict(blocked=35.0, saves=11), False),  # +6%
    (dict(blocked=30.0, saves=10), dict(blocked=40.0, saves=11), True),   # +21%
    (dict(blocked=30.0, saves=10, overlap=0.09), dict(blocked=30.0, saves=10, overlap=0.095),
     False),
    (dict(blocked=30.0, saves=10, overlap=0.099), dict(blocked=30.0, saves=10, overlap=0.101),
     True),  # under 10% apart, but the rule's verdict flips
    (dict(blocked=30.0, saves=10), dict(blocked=30.0, saves=10, interval=900.0), True),
    (dict(blocked=30.0, saves=10), dict(blocked=30.0, saves=10, overlap=0.05), True),
], ids=["same per save", "small move", "large move", "small overlap move", "verdict flips",
        "interval changed", "first drain"])
def test_only_meaningful_changes_are_patched(before: dict[str, Any], after: dict[str, Any],
                                             patch: bool) -> None:
    old = cost.checkpoint_cost([_pod("w0", **before)])
    new = cost.checkpoint_cost([_pod("w0", **after)])
    assert cost.changed(old, new) is patch
    assert cost.changed(None, new) and not cost.changed(old, None)


def test_a_pod_event_asks_for_a_fold_only_when_its_figures_move() -> None:
    base = cost.pod_signature(_pod("w0", blocked=30.0, saves=10, overlap=0.08))
    assert cost.pod_signature(_pod("w0", blocked=33.0, saves=11, overlap=0.08)) == base
    assert cost.pod_signature(_pod("w0", blocked=60.0, saves=11, overlap=0.08)) != base
    assert cost.pod_signature(_pod("w0", blocked=30.0, saves=10, overlap=0.2)) != base
    assert cost.pod_signature(_pod("w0", blocked=30.0, saves=10, overlap=0.0)) != base


def test_the_view_round_trips_and_an_older_one_still_parses() -> None:
    view = AgentView(blocked_s=12.5, saves=5, interval_s=900.0, overlap_target=0.1,
                     drained_step=50, drain_s=81.25, drain_overlap=0.0902777)
    back = parse_agent(view.to_json())
    assert back is not None
    assert (back.saves, back.interval_s, back.overlap_target, back.drained_step,
            back.drain_s, back.drain_overlap) == (5, 900.0, 0.1, 50, 81.25, 0.090278)
    older = parse_agent('{"blockedSeconds": 3.0, "step": 7}')
    assert older is not None and older.saves == 0 and older.drain_overlap is None
    junk = parse_agent('{"saves": -2, "intervalSeconds": 0, "drainOverlap": "x"}')
    assert junk is not None and (junk.saves, junk.interval_s, junk.drain_overlap) == \
        (0, None, None)


def test_fold_writes_the_cost_once_until_it_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(goodput_sync.kube, "patch_status",
                        lambda plural, ns, name, change: sent.append(change) or True)
    monkeypatch.setattr(goodput_sync.goodput_metrics, "publish", lambda *_: None)
    key = ("ns", "cost")
    goodput_sync.forget(key)
    policy = {"metadata": {"creationTimestamp": "2026-11-26T09:00:00Z"},
              "spec": {"writers": 1}, "status": {}}

    def fold(blocked: float, saves: int) -> None:
        view = AgentView(training_at=time.time() - 60, first_step=0, blocked_s=blocked,
                         saves=saves, interval_s=600.0, overlap_target=0.1)
        meta = {"annotations": {ANNOTATION_GOODPUT: view.to_json()},
                "labels": {"ckptdrain.io/writer": "0"}}
        goodput_sync.observe(key, "w-0", meta)
        goodput_sync.fold(key, policy, [PodView(name="w-0", writer="0", agent=view)])

    fold(40.0, 1)
    fold(42.0, 1)   # 5% more: not worth a patch
    fold(80.0, 2)   # the same per save
    fold(100.0, 1)  # 100 s a save: 16.7% of the interval
    costs = [c["checkpointCost"] for c in sent if "checkpointCost" in c]
    assert [c["worstBlockingPerSaveSeconds"] for c in costs] == [40.0, 100.0]
    assert [c["blockingRule"] for c in costs] == ["Exceeds", "Exceeds"]
    goodput_sync.forget(key)
