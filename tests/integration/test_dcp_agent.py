"""An async DCP save cut by SIGTERM, beside the real agent (processes, as in a pod).

The trainer saves step 5 with ckptdrain.dcp and the agent captures it; the
trainer then starts an async save of step 6 that writes its data files but
never finishes. SIGTERM reaches both, as when the pod is deleted: the agent's
flush waits for the trainer's emergency checkpoint while `step-6.tmp` is
being written, then captures and drains the newest *published* step. Step 6,
half written (data files without DCP's `.metadata`), must be published
nowhere: not in the work dir, not in the local tier, not in the store; step
5 stays the newest complete step everywhere, and restores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.agentprocs import WAIT_CAP, Pod
from tests.support.s3servers import S3Server

pytest.importorskip("torch", reason="ckptdrain.dcp needs PyTorch (the `torch` extra)")
pytest.importorskip("numpy", reason="DCP's object collectives need NumPy (the torch extra)")

from ckptdrain.node.steps import completed_steps
from ckptdrain.transfer.catalog import complete_steps

WORKER = Path(__file__).with_name("dcp_worker.py")
STEP = 5


@pytest.fixture
def pod(seaweedfs: S3Server, tmp_path: Path) -> Iterator[Pod]:
    """A pod's agent draining into a bucket of its own (`pod.store`)."""
    bucket = seaweedfs.create_bucket()
    p = Pod(tmp_path, interval="1h", grace="10", store_env={
        "CKPTDRAIN_STORE_URI": f"s3://{bucket}/job",
        "CKPTDRAIN_S3_ENDPOINT": seaweedfs.endpoint_url,
        "AWS_ACCESS_KEY_ID": seaweedfs.access_key,
        "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key, "AWS_REGION": seaweedfs.region})
    p.env["CKPTDRAIN_WRITERS"] = "1"
    p.store = seaweedfs.open_store(bucket, "job")  # type: ignore[attr-defined]
    yield p
    p.stop_all()
    seaweedfs.delete_bucket(bucket)


def _start_trainer(pod: Pod) -> subprocess.Popen[bytes]:
    job = {"mode": "agent", "rank": 0, "world": 1, "step": STEP,
           "go": str(pod.root / "go"), "started": str(pod.root / "started")}
    log = pod.root / "trainer.log"
    env = {**pod.env, "PYTHONPATH": os.pathsep.join(sys.path)}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(WORKER), json.dumps(job)], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    pod.procs.append(("trainer", proc, log))
    return proc


def test_sigterm_during_an_async_save_keeps_the_previous_step_newest(pod: Pod) -> None:
    agent = pod.start_agent()
    trainer = _start_trainer(pod)
    pod.wait_for(lambda: STEP in pod.states("Local"), "the agent to capture the saved step")
    (pod.root / "go").touch()
    pod.wait_for(lambda: (pod.root / "started").exists(), "the async save to write its data")

    trainer.send_signal(signal.SIGTERM)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(WAIT_CAP) == 0, pod.logs()
    if trainer.poll() is None:  # still joining DCP's stalled thread: the kubelet's SIGKILL
        trainer.kill()
    trainer.wait(WAIT_CAP)

    half = pod.work / f"step-{STEP + 1}.tmp"
    assert any(p.name.endswith(".distcp") for p in half.iterdir()), pod.logs()
    assert not (half / ".metadata").exists()
    assert completed_steps(pod.work) == [STEP]
    assert pod.tier.steps() == [STEP], pod.logs()
    pod.tier.verify(STEP)
    store = pod.store  # type: ignore[attr-defined]
    assert [c.step for c in complete_steps(store)] == [STEP], pod.logs()
    assert STEP + 1 not in {e["step"] for e in pod.event_list()}
    agent_log = next(path for name, _, path in pod.procs if name == "agent").read_text()
    assert f"SIGTERM flush done: step {STEP} is global" in agent_log, pod.logs()
    assert "emergency checkpoint failed" in (pod.root / "trainer.log").read_text()
