"""What the agent refuses to capture from the work dir, and that refusing
publishes nothing: a symlinked step, a misnamed step, a step that vanished."""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

import pytest

from ckptdrain.agent.loop import Agent
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.agent.report import CheckpointEvent, State
from ckptdrain.client import Client
from ckptdrain.errors import UnsafeSource
from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.node.steps import completed_steps


class Recorder:
    def __init__(self) -> None:
        self.events: list[CheckpointEvent] = []

    def report(self, event: CheckpointEvent) -> None:
        self.events.append(event)


def _agent(tmp_path: Path) -> tuple[Agent, Recorder]:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    cfg = config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(tmp_path / "work"),
        "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "local")})
    cfg.work_dir.mkdir(parents=True)
    recorder = Recorder()
    return Agent(cfg, LocalTier(cfg.local_dir), recorder, AgentMetrics(), None), recorder


def _secret(tmp_path: Path) -> Path:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "id_rsa").write_text("-----BEGIN PRIVATE KEY-----\n")
    return outside


def test_a_symlinked_step_pointing_outside_is_refused_and_nothing_is_published(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent, recorder = _agent(tmp_path)
    (agent.cfg.work_dir / "step-5").symlink_to(_secret(tmp_path), target_is_directory=True)
    with pytest.raises(UnsafeSource, match="symlink"):
        agent.capture_newest("schedule")
    assert agent.tier.steps() == []
    assert not any(p.name.startswith("step-") for p in agent.cfg.local_dir.iterdir())
    failed = [e for e in recorder.events if e.state is State.FAILED]
    assert [e.step for e in failed] == [5] and "symlink" in failed[0].message
    # A SIGTERM flush meets the same refusal: it logs it, publishes nothing, exits 0.
    agent.terminating.set()
    with caplog.at_level(logging.WARNING):
        assert agent.run() == 0
    assert agent.tier.steps() == []
    assert "symlink" in caplog.text


def test_a_symlink_inside_a_step_is_refused_too(tmp_path: Path) -> None:
    agent, _ = _agent(tmp_path)
    step = agent.cfg.work_dir / "step-6"
    step.mkdir()
    (step / "key").symlink_to(_secret(tmp_path) / "id_rsa")
    with pytest.raises(UnsafeSource, match="symlink"):
        agent.capture_newest("schedule")
    assert agent.tier.steps() == []


def test_a_zero_padded_step_is_never_published_empty(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent, recorder = _agent(tmp_path)
    padded = agent.cfg.work_dir / "step-007"
    padded.mkdir()
    (padded / "model.bin").write_bytes(b"w" * 4096)
    with caplog.at_level(logging.WARNING):
        assert agent.capture_newest("schedule") is None
    assert agent.tier.steps() == [] and recorder.events == []
    assert "step-007" in caplog.text
    # A canonical step beside it is captured whole, from exactly its own directory.
    Client(agent.cfg.work_dir).begin(8).joinpath("a.bin").write_bytes(b"x" * 100)
    Client(agent.cfg.work_dir).complete(8)
    assert agent.capture_newest("schedule") == 8
    assert [f.path for f in agent.tier.manifest(8).files] == ["a.bin"]
    assert agent.tier.manifest(8).total_bytes == 100


def test_a_step_that_vanishes_before_capture_fails_the_capture(tmp_path: Path) -> None:
    agent, _ = _agent(tmp_path)
    client = Client(agent.cfg.work_dir)
    (client.begin(9) / "a.bin").write_bytes(b"x" * 10)
    client.complete(9)
    assert completed_steps(agent.cfg.work_dir) == [9]
    gone = agent.cfg.work_dir / "step-9"
    shutil.rmtree(gone)  # e.g. the trainer's own cleanup, between listing and capture
    with pytest.raises(UnsafeSource, match="missing"):
        agent.tier.capture(gone, 9, writer=0, writers=1)
    assert agent.tier.steps() == [] and not agent.tier.has(9)
    assert not list(agent.cfg.local_dir.iterdir())  # no temp left either
