"""The agent's goodput watcher (agent/goodput.py) on a real local tier."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ckptdrain.agent.goodput import GoodputMetrics, GoodputWatcher, OverlapReporter
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
