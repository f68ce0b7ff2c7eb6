"""Goodput accounting (goodput.py) over time: runtime goodput as the union of
badputs while the job held resources, the wait for a node beside it, totals
that survive folding into a bounded status, and the CRD holding every total."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from tests.support.goodput_views import T0, interrupted, restarted

from ckptdrain import goodput
from ckptdrain.contract.goodput import AgentView, PodView, RestoreView


def test_runtime_goodput_is_the_union_of_badputs_over_the_time_with_resources() -> None:
    # Two writers down at overlapping times: the job loses that time once.
    a = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    b = interrupted("b", "1", T0 + 101, 57, {50: T0 + 90})
    a2 = restarted("a2", "0", T0 + 104, 1.0, 50, "local", T0 + 110, bound=T0 + 102)
    b2 = restarted("b2", "1", T0 + 104, 1.0, 50, "local", T0 + 112, bound=T0 + 103)
    status = goodput.merge({}, [a, b, a2, b2], None)
    assert status["heldSince"] == T0  # the first pods' node, not the policy's creation
    sums = goodput.totals(status, since=T0 - 500, now=T0 + 1000, writers=2,
                          live_blocked_s=20.0)
    # [90, 110] ∪ [90, 112] = 22 s, less the waits for a node [100, 102] ∪
    # [101, 103] = 3 s; blocked 20 s over 2 writers = 10 s.
    assert sums["waitingForResourcesSeconds"] == pytest.approx(3.0)
    assert sums["badputSeconds"] == pytest.approx(29.0)
    assert sums["availableSeconds"] == pytest.approx(997.0)
    assert sums["runtimeGoodput"] == pytest.approx(1 - 29 / 997)
    assert sums["wallSeconds"] == pytest.approx(1500.0)  # since the policy, informative
    assert sums["lostSteps"] == 14 and sums["interruptions"] == 2


def test_the_wait_for_a_node_is_reported_beside_the_ratio_not_in_it() -> None:
    # The node is lost at 1000 s; the replacement waits 10 min for another.
    a = interrupted("a", "0", T0 + 1000, 1990, {1980: T0 + 990})
    b = restarted("b", "0", T0 + 1602, 2.0, 1980, "global", T0 + 1610, bound=T0 + 1600)
    status = goodput.merge({}, [a, b], 1980)
    (entry,) = status["recent"]
    assert entry["resourcesAt"] == T0 + 1600 and entry["waitingSeconds"] == 600
    assert entry["recoverySeconds"] == 610  # interruption → training again, wait included
    sums = goodput.totals(status, since=T0, now=T0 + 3600, writers=1, live_blocked_s=0)
    assert sums["waitingForResourcesSeconds"] == 600
    assert sums["availableSeconds"] == 3000
    # 10 s redone and 10 s from the node to training again, of 3000 s.
    assert sums["badputSeconds"] == pytest.approx(20.0)
    assert sums["runtimeGoodput"] == pytest.approx(1 - 20 / 3000)


def test_an_open_interruption_waits_until_now_and_stops_the_clock() -> None:
    a = interrupted("a", "0", T0 + 1000, 57, {50: T0 + 990})
    status = goodput.merge({}, [a], None)
    early = goodput.totals(status, T0, T0 + 1500, 1, 0)
    late = goodput.totals(status, T0, T0 + 2000, 1, 0)
    assert (early["open"], early["waitingForResourcesSeconds"]) == (1, 500)
    assert late["waitingForResourcesSeconds"] == 1000
    assert early["availableSeconds"] == late["availableSeconds"] == 1000
    assert "endedAt" not in status  # a job waiting for a node has not ended


def test_a_retry_after_a_failed_restore_does_not_move_the_node_later() -> None:
    a = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    failed = restarted("b", "0", T0 + 110, 30.0, None, None, None, outcome="store_unavailable",
                       bound=T0 + 105)
    status = goodput.merge({}, [a, failed], None)
    assert status["recent"][0]["resourcesAt"] == T0 + 105
    # The failed pod is gone; the next one (another node) restores.
    retry = restarted("c", "0", T0 + 200, 2.0, 50, "global", T0 + 210, bound=T0 + 190)
    status = goodput.merge(status, [retry], None)
    (entry,) = status["recent"]
    assert entry["restorePod"] == "c" and entry["waitingSeconds"] == 5
    # Folded again (the next pod event, a restarted operator): the same.
    assert goodput.merge(status, [retry], None) == status
    assert goodput.merge(status, [a, retry], None) == status
    # The failed restore's time is checkpointing's badput, in the ratio.
    sums = goodput.totals(status, T0, T0 + 1000, 1, 0)
    assert sums["badputSeconds"] == pytest.approx(10 + 110 - 5)


def test_time_before_the_job_and_between_its_runs_is_not_its_own() -> None:
    ran = PodView("a", "0", agent=AgentView(training_at=T0 + 5, first_step=0, blocked_s=10.0),
                  bound_at=T0, finished_at=T0 + 1000, finished=True)
    status = goodput.merge({"heldSince": None}, [ran], None)
    assert (status["heldSince"], status["endedAt"]) == (T0, T0 + 1000)
    assert goodput.merge(status, [ran], None) == status  # idempotent
    # Created a day before the job, read a day after it ended.
    sums = goodput.totals(status, since=T0 - 86400, now=T0 + 86400, writers=1,
                          live_blocked_s=10.0)
    assert sums["availableSeconds"] == 1000
    assert sums["runtimeGoodput"] == pytest.approx(1 - 10 / 1000)
    # The next run of the policy's job gets its node 4000 s after the end.
    again = PodView("b", "0", agent=AgentView(training_at=T0 + 5010, first_step=0),
                    bound_at=T0 + 5000)
    status = goodput.merge(status, [ran, again], None)
    assert status["endedAt"] is None and status["idleSeconds"] == 4000
    assert goodput.merge(status, [again], None) == status
    sums = goodput.totals(status, since=T0 - 86400, now=T0 + 6000, writers=1,
                          live_blocked_s=0)
    assert sums["availableSeconds"] == 2000


def test_a_status_from_before_the_start_was_recorded_keeps_the_policys_creation() -> None:
    a = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    b = restarted("b", "0", T0 + 104, 1.0, 50, "local", T0 + 110)
    older = goodput.merge({}, [a, b], None)
    for entry in older["recent"]:  # as an earlier release wrote them
        entry.pop("resourcesAt"), entry.pop("waitingSeconds")
    older.pop("heldSince")
    later = PodView("b", "0", agent=AgentView(training_at=T0 + 110), bound_at=T0 + 102)
    status = goodput.merge(older, [later], None)
    assert "heldSince" not in status
    sums = goodput.totals(status, T0, T0 + 1000, 1, 0)
    assert sums["availableSeconds"] == 1000 and sums["waitingForResourcesSeconds"] == 0


def test_the_worked_example_of_docs_goodput_md() -> None:
    def at(h: int, m: int, s: int = 0) -> float:
        return datetime(2025, 11, 23, h, m, s, tzinfo=UTC).timestamp()

    # A spot node reclaimed at 13:00; the replacement waits 6 min for a node.
    first = PodView("llm-0-q9d4s", "0", agent=AgentView(
        training_at=at(12, 11), first_step=0, blocked_s=90.0, interrupted_at=at(13, 0),
        step=2950, step_s=1.0, completed=((2770, at(12, 57)),), newest_local=2950,
        newest_global=2770), bound_at=at(12, 10))
    second = PodView("llm-0-m2v8c", "0", agent=AgentView(
        training_at=at(13, 7), first_step=2771, blocked_s=30.0),
        restore=RestoreView("restored", at(13, 6, 20), 30.0, step=2770, tier="global"),
        bound_at=at(13, 6), finished_at=at(14, 10), finished=True)
    status = goodput.status_patch({}, [first, second], 2770, since=at(12, 0), now=at(18, 0),
                                  writers=1, live_blocked_s=30.0)
    assert status is not None
    assert (status["heldSince"], status["endedAt"]) == (at(12, 10), at(14, 10))
    assert status["waitingForResourcesSeconds"] == 360
    assert status["availableSeconds"] == 6840
    assert status["badputSeconds"] == 360  # 180 redone + 60 node → training + 120 blocked
    assert status["runtimeGoodput"] == pytest.approx(0.947368)
    assert status["wallSeconds"] == 21600  # shown, not divided by


def test_the_status_stays_bounded_and_totals_survive_folding() -> None:
    status: dict = {}
    pods = []
    for i in range(goodput.MAX_RECENT + 5):
        at = T0 + 100 * (i + 1)
        pods = [interrupted(f"p{i}", "0", at, 10 * i + 7, {10 * i: at - 5}),
                restarted(f"p{i + 1}", "0", at + 2, 1.0, 10 * i, "local", at + 4)]
        status = goodput.merge(status, pods, None)
    assert len(status["recent"]) == goodput.MAX_RECENT
    assert len(status["foldedPods"]) <= goodput.MAX_RECENT
    sums = goodput.totals(status, T0, T0 + 10_000, 1, 0)
    assert sums["interruptions"] == goodput.MAX_RECENT + 5
    assert sums["lostSteps"] == 7 * (goodput.MAX_RECENT + 5)
    # Each: 5 s redone and 4 s to training again, 2 s of which waiting for
    # the replacement (its restore's start: its node is not known here).
    assert sums["badputSeconds"] == pytest.approx(7.0 * (goodput.MAX_RECENT + 5))
    assert sums["waitingForResourcesSeconds"] == pytest.approx(2.0 * (goodput.MAX_RECENT + 5))
    assert len(json.dumps(status)) < 10_000


def test_status_patch_ignores_drift_of_the_clock_and_blocked_time() -> None:
    old = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    first = goodput.status_patch({}, [old], None, T0, T0 + 200, 1, 3.0)
    assert first is not None and first["lastInterruption"]["pod"] == "a"
    assert goodput.status_patch(first, [old], None, T0, T0 + 900, 1, 9.0) is None
    new = restarted("b", "0", T0 + 104, 1.0, 50, "local", T0 + 108)
    assert goodput.status_patch(first, [old, new], None, T0, T0 + 900, 1, 9.0) is not None


def test_union_seconds() -> None:
    assert goodput.union_seconds([]) == 0
    assert goodput.union_seconds([(0, 10), (5, 12), (20, 21), (20.5, 20.7)]) == 13


def test_every_total_the_operator_writes_is_in_the_crd() -> None:
    """The apiserver prunes a status field its schema does not declare."""
    from pathlib import Path

    import yaml

    from ckptdrain.contract import api

    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds"
                          / "checkpointpolicies.yaml").read_text())
    # The version the operator writes its status in.
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == api.VERSION]
    schema = version["schema"]["openAPIV3Schema"]
    declared = schema["properties"]["status"]["properties"]["goodput"]["properties"]
    # A comma in an unquoted description splits it into keys of no value.
    malformed = [k for k, v in declared.items()
                 if not isinstance(v, dict) or "type" not in v or None in v.values()]
    assert malformed == []
    a = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    b = restarted("b", "0", T0 + 104, 1.0, 50, "local", T0 + 110, bound=T0 + 102)
    done = PodView("c", "1", agent=AgentView(training_at=T0), bound_at=T0,
                   finished_at=T0 + 50, finished=True)
    status = goodput.status_patch({}, [a, b, done], None, T0, T0 + 1000, 2, 0.0)
    assert status is not None and set(status) <= set(declared)
