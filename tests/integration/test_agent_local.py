"""The agent as a real process with the local tier only: schedule, SIGTERM, restore."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.agentprocs import Pod


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    p = Pod(tmp_path)
    p.env.pop("CKPTDRAIN_STORE_URI", None)
    yield p
    p.stop_all()


def test_sigterm_makes_the_emergency_checkpoint_durable_and_verified(pod: Pod) -> None:
    agent = pod.start_agent()
    trainer = pod.start_trainer()
    pod.wait_for(lambda: pod.states("Local"), "a scheduled capture")
    assert pod.sigterm(trainer, agent) == [0, 0], pod.logs()

    lines = pod.trainer_lines(trainer)
    last = [d for d in lines if d["event"] == "exit"][-1]["step"]
    emergency = [d["step"] for d in lines if d.get("emergency")]
    assert emergency == [last], pod.logs()
    # The newest state the trainer had is durable, complete and verified locally.
    assert pod.tier.steps()[0] == last
    manifest = pod.tier.verify(last)
    assert manifest.extra["trigger"] == "sigterm"
    assert {f.path for f in manifest.files} == {"shard-000.bin", "shard-001.bin", "state.json"}
    # No half-copied leftovers, and retention kept the tier at local_keep (2).
    assert all(p.name.startswith("step-") for p in pod.local.iterdir())
    assert len(pod.tier.steps()) <= 2


def test_restore_after_sigterm_resumes_from_the_newest_step(pod: Pod) -> None:
    agent = pod.start_agent()
    trainer = pod.start_trainer()
    pod.wait_for(lambda: len(pod.states("Local")) >= 2, "two captures")
    pod.sigterm(trainer, agent)
    newest = pod.tier.steps()[0]

    import shutil

    shutil.rmtree(pod.work)  # a new pod on the same node: empty work dir, same local tier
    code, result = pod.restore()
    assert code == 0, result
    assert (result["step"], result["tier"], result["fresh_start"]) == (newest, "local", False)
    resumed = pod.start_trainer("--max-steps", str(newest + 3))
    assert resumed.wait(60) == 0, pod.logs()
    start = next(d for d in pod.trainer_lines(resumed) if d["event"] == "start")
    assert start["from_step"] == newest + 1 and start["restored"] == newest


def test_trainer_is_not_blocked_when_the_agent_is_gone(pod: Pod) -> None:
    # No agent at all: requests never come, the trainer just trains.
    trainer = pod.start_trainer("--max-steps", "20")
    assert trainer.wait(60) == 0
    assert next(d for d in pod.trainer_lines(trainer) if d["event"] == "exit")["step"] == 19


def test_a_second_sigterm_never_leaves_a_corrupt_local_copy(pod: Pod) -> None:
    import os
    import signal
    import time

    from ckptdrain.client import Client

    pod.env["CKPTDRAIN_INTERVAL"] = "1h"
    agent = pod.start_agent()
    client = Client(pod.work)
    directory = client.begin(3)
    for i in range(8):
        (directory / f"shard-{i}.bin").write_bytes(os.urandom(1 << 20) * 48)
    client.complete(3)
    agent.send_signal(signal.SIGTERM)
    time.sleep(1.1)  # the agent waits ~1 s for an emergency checkpoint, then copies
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(60) == 0, pod.logs()
    # Whatever the second signal interrupted: a whole, verified copy or none at all.
    for step in pod.tier.steps():
        pod.tier.verify(step)
    assert all(p.name.startswith("step-") for p in pod.local.iterdir()), \
        list(pod.local.iterdir())
