"""The agent's goodput watcher (agent/goodput.py) on a real local tier."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ckptdrain.agent.goodput import GoodputMetrics, GoodputWatcher, OverlapReporter, SaveCounter
from ckptdrain.agent.report import CheckpointEvent, State
from ckptdrain.client import Client
from ckptdrain.contract.goodput import parse_agent
from ckptdrain.node.localtier import LocalTier


def test_training_start_and_interruption_reach_the_pod(tmp_path: Path) -> None:
    work, local = tmp_path / "work", tmp_path / "local"
    tier = LocalTier(local)
    registry = CollectorRegistry()
    sent: list[tuple[str, str]] = []
    watcher = GoodputWatcher(work, tier, GoodputMetrics(registry),
                             lambda k, v: sent.append((k, v)) or True, clock=lambda: 0.0)
    client = Client(work, environ={})
    client.step_done(0)
    watcher.tick()
    watcher.close(5)
    assert [k for k, _ in sent] == ["ckptdrain.io/goodput"]
    first = parse_agent(sent[0][1])
    assert first is not None and first.training_at is not None and first.interrupted_at is None
    d = client.begin(3)
    (d / "a.bin").write_bytes(b"x" * 100)
    client.complete(3)
    tier.capture(work / "step-3", 3, writer=0, writers=1)
    watcher.interrupted(at=12345.0)
    watcher.close(5)
    last = parse_agent(sent[-1][1])
    assert last is not None and last.interrupted_at == 12345.0
    assert last.step == 3 and last.newest_local == 3 and last.newest_global is None
    assert registry.get_sample_value("ckptdrain_trainer_step") == 3
    assert registry.get_sample_value("ckptdrain_trainer_blocked_seconds") >= 0


def test_the_pending_bytes_patch_after_the_flush_keeps_the_interruption(tmp_path: Path) -> None:
    """The drain's last pending-bytes patch (after the SIGTERM flush) carries
    the goodput view too; it once sent `interruptedAt: null` and erased the
    interruption the operator had not folded yet."""
    work, tier = tmp_path / "work", LocalTier(tmp_path / "local")
    watcher = GoodputWatcher(work, tier, GoodputMetrics(CollectorRegistry()),
                             lambda k, v: True, clock=lambda: 0.0)
    client = Client(work, environ={})
    client.step_done(0)
    watcher.tick()
    before = parse_agent(watcher.annotation()["ckptdrain.io/goodput"])
    assert before is not None and before.interrupted_at is None
    watcher.interrupted(at=12345.0)
    watcher.close(5)
    after = parse_agent(watcher.annotation()["ckptdrain.io/goodput"])
    assert after is not None and after.interrupted_at == 12345.0


def test_overlap_is_drain_time_over_the_global_interval() -> None:
    registry = CollectorRegistry()
    metrics = GoodputMetrics(registry)
    OverlapReporter(metrics, 100.0).report(CheckpointEvent(7, State.GLOBAL, 10, seconds=8.0))
    assert registry.get_sample_value("ckptdrain_drain_overlap_ratio") == 0.08


def test_an_interruption_before_any_step_is_said_in_words(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    watcher = GoodputWatcher(tmp_path / "work", LocalTier(tmp_path / "local"),
                             GoodputMetrics(CollectorRegistry()), lambda k, v: True,
                             clock=lambda: 0.0)
    with caplog.at_level(logging.INFO, logger="ckptdrain.agent.goodput"):
        watcher.interrupted(at=1.0)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "interrupted at an unknown step" in said and "None" not in said


def test_each_save_blocking_lands_in_the_histogram_and_the_view(tmp_path: Path) -> None:
    """Two saves of a real client: the histogram counts two saves whose sum is
    the client's blocked seconds; the annotation carries the saves, the
    schedule and the newest drain, which the operator folds (cost.py)."""
    work, tier = tmp_path / "work", LocalTier(tmp_path / "local")
    registry = CollectorRegistry()
    metrics = GoodputMetrics(registry)
    drains = OverlapReporter(metrics, 600.0, target=0.1)
    watcher = GoodputWatcher(work, tier, metrics, None, clock=lambda: 0.0, drains=drains,
                             interval_s=300.0, overlap_target=0.1)
    client = Client(work, environ={})
    for step in (10, 20):
        d = client.begin(step)
        (d / "a.bin").write_bytes(b"x" * 100)
        client.complete(step)
        watcher.refresh()
    watcher.refresh()  # the same totals again: nothing counted twice
    assert registry.get_sample_value("ckptdrain_save_blocking_seconds_count") == 2
    blocked = registry.get_sample_value("ckptdrain_trainer_blocked_seconds")
    assert registry.get_sample_value("ckptdrain_save_blocking_seconds_sum") == \
        pytest.approx(blocked, abs=1e-5)
    assert registry.get_sample_value("ckptdrain_drain_overlap_target_ratio") == 0.1
    drains.report(CheckpointEvent(20, State.GLOBAL, 10, seconds=90.0))
    drains.report(CheckpointEvent(10, State.GLOBAL, 10, seconds=30.0))  # older: not newest
    view = parse_agent(watcher.annotation()["ckptdrain.io/goodput"])
    assert view is not None
    assert (view.saves, view.interval_s, view.overlap_target) == (2, 300.0, 0.1)
    assert (view.drained_step, view.drain_s, view.drain_overlap) == (20, 90.0, 0.15)
    assert registry.get_sample_value("ckptdrain_drain_overlap_ratio") == 0.15


def test_save_counter_spreads_blocked_time_and_restarts_with_a_new_trainer() -> None:
    registry = CollectorRegistry()
    counter = SaveCounter(GoodputMetrics(registry).per_save)

    def seen() -> tuple[float | None, float | None]:
        return (registry.get_sample_value("ckptdrain_save_blocking_seconds_count"),
                registry.get_sample_value("ckptdrain_save_blocking_seconds_sum"))

    counter.update({"pid": 7, "blockedSeconds": 6.0, "saves": 3})
    assert seen() == (3, 6.0)
    # An asynchronous save let the trainer go; it has not completed yet.
    counter.update({"pid": 7, "blockedSeconds": 6.5, "saves": 3})
    assert seen() == (3, 6.0)
    counter.update({"pid": 7, "blockedSeconds": 6.5, "saves": 4})
    assert seen() == (4, 6.5)
    assert registry.get_sample_value("ckptdrain_save_blocking_seconds_bucket",
                                     {"le": "0.5"}) == 1
    # The trainer restarted in its pod: its own totals, from zero.
    counter.update({"pid": 8, "blockedSeconds": 1.0, "saves": 1})
    assert seen() == (5, 7.5)
    counter.update({"pid": 8, "blockedSeconds": "x", "saves": 2})  # not a number: ignored
    assert seen() == (5, 7.5)


def test_a_slow_training_patch_never_lands_after_the_interruption(tmp_path: Path) -> None:
    """Each view goes out from its own thread (a slow apiserver must not hold
    up the loop); the training view's patch hanging until after the SIGTERM
    flush must not land last and erase the interruption."""
    work, tier = tmp_path / "work", LocalTier(tmp_path / "local")
    sent: list[str] = []
    hanging, release = threading.Event(), threading.Event()

    def annotate(key: str, value: str) -> bool:
        if not hanging.is_set():  # the first patch: the apiserver is slow
            hanging.set()
            assert release.wait(30)
        sent.append(value)
        return True
    watcher = GoodputWatcher(work, tier, GoodputMetrics(CollectorRegistry()), annotate,
                             clock=lambda: 0.0)
    Client(work, environ={}).step_done(0)
    watcher.tick()
    assert hanging.wait(30)
    watcher.interrupted(at=12345.0)
    for later in watcher._threads[1:]:  # every patch that can go before the slow one
        later.join(30)
    release.set()
    watcher.close(30)
    last = parse_agent(sent[-1])
    assert last is not None and last.interrupted_at == 12345.0
