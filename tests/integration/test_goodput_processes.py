"""Goodput with real processes: the demo trainer (through the client) and the
agent, SIGTERM, then restore. What the agent would annotate its pod with is
what the trainer logged."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.agentprocs import Pod

from ckptdrain import goodput
from ckptdrain.agent.goodput import read_progress
from ckptdrain.contract.goodput import PodView, RestoreView, from_progress


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    p = Pod(tmp_path)
    p.env.pop("CKPTDRAIN_STORE_URI", None)
    yield p
    p.stop_all()


def test_the_interruption_the_agent_records_is_the_one_the_trainer_logged(pod: Pod) -> None:
    agent = pod.start_agent()
    trainer = pod.start_trainer()
    pod.wait_for(lambda: pod.states("Local"), "a scheduled capture")
    assert pod.sigterm(trainer, agent) == [0, 0], pod.logs()

    lines = pod.trainer_lines(trainer)
    sigterm = next(d for d in lines if d["event"] == "sigterm")
    progress = read_progress(pod.work)
    assert progress is not None, pod.logs()
    # The client noted SIGTERM before the emergency save, and that save's step.
    assert progress["interruptedAt"] <= sigterm["t"] + 0.5
    assert progress["step"] == sigterm["step"] and str(sigterm["step"]) in progress["completed"]
    assert progress["saves"] >= 2 and progress["blockedSeconds"] > 0
    logged = re.search(r"interrupted at step (\d+) \(local tier up to (\d+)", pod.logs())
    assert logged and int(logged[1]) == sigterm["step"] == int(logged[2]), pod.logs()

    # The replacement restores that step: nothing lost, and the restore's own
    # record (what restore annotates its pod with) says where it came from.
    code, result = pod.restore()
    assert code == 0 and result["step"] == sigterm["step"], result
    old = PodView("a", "0", agent=from_progress(progress, sigterm["step"]))
    new = PodView("b", "0", restore=RestoreView(
        "restored", started_at=result["at"], seconds=result["seconds"], step=result["step"],
        tier=result["tier"], step_created=result["step_created"]))
    (entry,) = goodput.merge({}, [old, new], None)["recent"]
    assert entry["lostSteps"] == 0 and entry["restoredTier"] == "local"
    assert json.dumps(entry)
