"""Goodput accounting (goodput.py): each interruption joined to the restore
that followed it, the steps and seconds it lost, and a reader's restore kept
apart from a writer's recovery. Runtime goodput and totals are in
test_goodput_runtime.py; the annotations read in test_goodput_annotations.py."""

from __future__ import annotations

import pytest
from tests.support.goodput_views import T0, interrupted, restarted

from ckptdrain import goodput, restore_status
from ckptdrain.contract.goodput import AgentView, PodView, RestoreView


def test_one_interruption_from_sigterm_to_training_again() -> None:
    old = interrupted("job-0-a", "0", at=T0 + 100, step=57, completed={50: T0 + 90.0,
                                                                        55: T0 + 97.5})
    new = restarted("job-0-b", "0", started=T0 + 104, seconds=1.5, step=50, tier="global",
                    training=T0 + 108)
    status = goodput.merge({}, [old, new], restorable_global=50)
    (entry,) = status["recent"]
    assert entry["restoredStep"] == 50 and entry["restoredTier"] == "global"
    assert entry["lostSteps"] == 7
    # From the restored step's save to the interruption: 10 s of training redone.
    assert entry["lostSeconds"] == pytest.approx(10.0)
    assert entry["recoverySeconds"] == pytest.approx(8.0)
    assert entry["restorableGlobal"] == 50 and entry["restorableLocal"] == 57
    assert "completed" not in entry  # only kept until the lost time is known


def test_merge_is_idempotent_and_order_free() -> None:
    old = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    new = restarted("b", "0", T0 + 104, 1.5, 50, "local", T0 + 108)
    first = goodput.merge({}, [new], None)  # the restore seen before the interruption
    assert first["recent"] == []
    both = goodput.merge(first, [old], None)
    assert both["recent"][0].get("restorePod") is None  # the new pod is not in this event
    joined = goodput.merge(both, [old, new], None)
    assert joined["recent"][0]["restorePod"] == "b"
    assert goodput.merge(joined, [old, new], None) == joined
    assert goodput.merge(joined, [new], None) == joined


def test_restore_of_another_writer_or_before_the_interruption_is_not_joined() -> None:
    old = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    other = restarted("c", "1", T0 + 104, 1.0, 50, "local", T0 + 106)
    earlier = restarted("d", "0", T0 + 10, 1.0, None, None, T0 + 12, outcome="fresh_start")
    (entry,) = goodput.merge({}, [old, other, earlier], None)["recent"]
    assert "restorePod" not in entry and "recoverySeconds" not in entry
    assert goodput.totals({"recent": [entry]}, T0, T0 + 200, 1, 0)["open"] == 1


def test_each_interruption_takes_the_restore_that_followed_it() -> None:
    first = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    second_pod = restarted("b", "0", T0 + 104, 1.0, 50, "local", T0 + 106)
    second = interrupted("b", "0", T0 + 200, 120, {110: T0 + 190})
    third_pod = restarted("c", "0", T0 + 203, 1.0, 110, "global", T0 + 209)
    status = goodput.merge({}, [first, second_pod, second, third_pod], None)
    newest, oldest = status["recent"]
    assert (newest["pod"], newest["restorePod"], newest["lostSteps"]) == ("b", "c", 10)
    assert (oldest["pod"], oldest["restorePod"], oldest["lostSteps"]) == ("a", "b", 7)


def test_a_successful_restore_stays_attached_after_its_pod_is_gone() -> None:
    """Once `b` restored for `a`'s interruption, `b` leaving (and with it its
    view) must not move the entry to a later pod's restore, even when `b`'s own
    interruption was never seen."""
    first = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    second_pod = restarted("b", "0", T0 + 104, 1.0, 50, "local", T0 + 106)
    status = goodput.merge({}, [first, second_pod], None)
    later_pod = restarted("c", "0", T0 + 203, 1.0, 110, "global", T0 + 209)
    (entry,) = goodput.merge(status, [later_pod], None)["recent"]
    assert (entry["restorePod"], entry["restoredStep"], entry["lostSteps"]) == ("b", 50, 7)
    assert entry["recoverySeconds"] == pytest.approx(6.0)


def test_a_kept_restore_gives_way_to_a_newer_interruption_seen_later() -> None:
    """A's first restore failed (b), A then took c's; b's own interruption
    (before c) arrives last: c was b's restore, and A goes back to b."""
    first = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    failed = restarted("b", "0", T0 + 104, 30.0, None, None, None, outcome="store_unavailable",
                       reason="the global tier could not be asked")
    status = goodput.merge({}, [first, failed], None)
    later = restarted("c", "0", T0 + 203, 1.0, 110, "global", T0 + 209)
    status = goodput.merge(status, [later], None)
    assert status["recent"][0]["restorePod"] == "c"
    b_stopped = PodView("b", "0", agent=AgentView(interrupted_at=T0 + 200),
                        restore=failed.restore)
    newest, oldest = goodput.merge(status, [b_stopped, later], None)["recent"]
    assert (newest["pod"], newest["restorePod"]) == ("b", "c")
    assert (oldest["pod"], oldest["restorePod"]) == ("a", "b")


def test_a_failed_restore_gives_way_to_the_restore_that_followed() -> None:
    old = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    failed = restarted("b", "0", T0 + 104, 30.0, None, None, None, outcome="store_unavailable",
                       reason="the global tier could not be asked")
    status = goodput.merge({}, [old, failed], None)
    assert status["recent"][0]["restorePod"] == "b"
    retried = restarted("c", "0", T0 + 150, 1.0, 50, "global", T0 + 152)
    (entry,) = goodput.merge(status, [retried], None)["recent"]
    assert (entry["restorePod"], entry["restoreOutcome"], entry["lostSteps"]) == (
        "c", "restored", 7)
    assert "restoreReason" not in entry


def test_keep_interruption_carries_it_to_a_later_view_that_lost_it() -> None:
    stopped = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    lost = PodView("a", "0", agent=AgentView(training_at=T0, first_step=0, step=57))
    kept = goodput.keep_interruption(stopped, lost)
    assert kept.agent is not None and kept.agent.interrupted_at == T0 + 100
    assert goodput.keep_interruption(None, lost) is lost
    assert goodput.keep_interruption(lost, stopped) is stopped


def test_fresh_start_loses_every_step() -> None:
    old = interrupted("a", "0", T0 + 100, 57, {}, step_s=0.5)
    new = restarted("b", "0", T0 + 101, 0.2, None, None, T0 + 102, outcome="fresh_start")
    (entry,) = goodput.merge({}, [old, new], None)["recent"]
    assert entry["lostSteps"] == 58 and entry["lostSeconds"] == pytest.approx(29.0)


def test_failed_restore_keeps_the_interruption_open_with_its_reason() -> None:
    old = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    new = restarted("b", "0", T0 + 104, 30.0, None, None, None, outcome="store_unavailable",
                    reason="the global tier could not be asked")
    (entry,) = goodput.merge({}, [old, new], None)["recent"]
    assert entry["restoreOutcome"] == "store_unavailable"
    assert "could not be asked" in entry["restoreReason"]
    assert "lostSteps" not in entry and "recoverySeconds" not in entry
    sums = goodput.totals({"recent": [entry]}, T0, T0 + 200, 1, 0)
    assert sums["failedRestores"] == 1 and sums["open"] == 1
    failure = restore_status.restore_failure([new])
    assert failure is not None and failure["outcome"] == "store_unavailable"


def test_a_readers_restore_is_no_writers_recovery_but_its_failure_is_reported() -> None:
    """One writer (no rank label) and a reader (no writer label either): the
    reader's restore must not close the writer's interruption, which only the
    writer's own replacement, training again, can."""
    old = interrupted("w-a", None, at=T0 + 100, step=57,  # type: ignore[arg-type]
                      completed={50: T0 + 90.0})
    reader = PodView("r-b", None, restore=RestoreView(
        outcome="none_verified", started_at=T0 + 102, seconds=1.0, step=None, tier=None,
        reason="checkpoints exist but none verified"), reader="0")
    status = goodput.merge({}, [old, reader], restorable_global=50)
    (entry,) = status["recent"]
    assert "restorePod" not in entry and "recoverySeconds" not in entry
    new = restarted("w-b", None, started=T0 + 104, seconds=1.5,  # type: ignore[arg-type]
                    step=50, tier="global", training=T0 + 108)
    (entry,) = goodput.merge(status, [old, reader, new], restorable_global=50)["recent"]
    assert (entry["restorePod"], entry["recoverySeconds"]) == ("w-b", pytest.approx(8.0))
    failure = restore_status.restore_failure([reader, new])
    assert failure is not None and (failure["pod"], failure["reader"]) == ("r-b", "0")


def test_a_pods_interruption_reported_again_is_counted_once_the_newest_kept() -> None:
    """The agent's first patch after SIGTERM carries its own time, a later one
    the trainer's (progress file): one interruption, at the newest report."""
    first = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    status = goodput.merge({}, [first], None)
    again = interrupted("a", "0", T0 + 101, 58, {50: T0 + 90})
    new = restarted("b", "0", T0 + 104, 1.5, 50, "local", T0 + 108)
    status = goodput.merge(status, [again, new], None)
    (entry,) = status["recent"]
    assert (entry["at"], entry["step"], entry["restorePod"]) == (T0 + 101, 58, "b")
    assert entry["lostSteps"] == 8
    assert entry["recoverySeconds"] == pytest.approx(7.0)
    assert goodput.totals(status, T0, T0 + 200, 1, 0)["interruptions"] == 1
    assert goodput.merge(status, [again, new], None) == status


def test_a_report_again_after_the_restore_pod_left_keeps_that_restore() -> None:
    first = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    new = restarted("b", "0", T0 + 104, 1.5, 50, "local", T0 + 108)
    status = goodput.merge({}, [first, new], None)
    again = interrupted("a", "0", T0 + 101, 58, {50: T0 + 90})
    (entry,) = goodput.merge(status, [again], None)["recent"]  # b's view is gone
    assert (entry["at"], entry["restorePod"], entry["lostSteps"]) == (T0 + 101, "b", 8)
    assert entry["lostSeconds"] == pytest.approx(11.0)
    assert entry["recoverySeconds"] == pytest.approx(7.0)
    assert entry["waitingSeconds"] == pytest.approx(3.0)
    assert "completed" not in entry


def test_a_second_interruption_of_a_pod_an_hour_later_is_listed_apart() -> None:
    """A pod of stable name (a LeaderWorkerSet's) or one SIGTERMed twice is
    interrupted twice: only reports within SAME_INTERRUPTION_S are one."""
    first = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    status = goodput.merge({}, [first], None)
    later = interrupted("a", "0", T0 + 3700, 400, {390: T0 + 3690})
    status = goodput.merge(status, [later], None)
    assert [(e["at"], e["step"]) for e in status["recent"]] == [(T0 + 3700, 400),
                                                                (T0 + 100, 57)]
    assert goodput.totals(status, T0, T0 + 4000, 1, 0)["interruptions"] == 2
    assert goodput.merge(status, [later], None) == status


def test_reports_of_a_pod_are_one_interruption_only_within_the_bound() -> None:
    first = interrupted("a", "0", T0 + 100, 57, {50: T0 + 90})
    status = goodput.merge({}, [first], None)
    bound = goodput.SAME_INTERRUPTION_S
    same = interrupted("a", "0", T0 + 100 + bound, 58, {50: T0 + 90})
    assert len(goodput.merge(status, [same], None)["recent"]) == 1
    other = interrupted("a", "0", T0 + 100 + bound + 1, 58, {50: T0 + 90})
    assert len(goodput.merge(status, [other], None)["recent"]) == 2
