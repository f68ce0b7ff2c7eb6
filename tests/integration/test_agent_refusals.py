"""The agent as a real process, with a file:// global tier, meeting a work dir
a hostile or unlucky trainer left: a `step-N` symlink pointing outside it and a
zero-padded `step-007`. Nothing of either is captured, drained or published;
the refusal is an event and a log line; the agent goes on with real steps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.agentprocs import Pod

from ckptdrain import keys
from ckptdrain.client import Client
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.catalog import candidate_steps

SECRET = b"-----BEGIN PRIVATE KEY----- not for the bucket"


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    p = Pod(tmp_path, store_env={"CKPTDRAIN_STORE_URI": f"file://{tmp_path}/store"},
            interval="1h")
    yield p
    p.stop_all()


def _everything_under(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()) \
        if root.exists() else b""


def test_a_symlinked_step_is_refused_and_the_agent_goes_on(pod: Pod, tmp_path: Path) -> None:
    outside = tmp_path / "home"
    outside.mkdir()
    (outside / "id_rsa").write_bytes(SECRET)
    pod.work.mkdir(parents=True)
    (pod.work / "step-5").symlink_to(outside, target_is_directory=True)
    padded = pod.work / "step-007"
    padded.mkdir()
    (padded / "weights.bin").write_bytes(b"w" * 1000)
    agent = pod.start_agent()
    pod.wait_for(lambda: pod.states("Failed"), "the refusal of the symlinked step")
    failed = [e for e in pod.event_list() if e["state"] == "Failed"]
    assert {e["step"] for e in failed} == {5} and "symlink" in failed[0]["message"]

    client = Client(pod.work)
    (client.begin(8) / "real.bin").write_bytes(b"r" * 5000)
    client.complete(8)
    pod.wait_for(lambda: 8 in pod.states("Global"), "step 8 drained")
    assert pod.sigterm(agent) == [0], pod.logs()

    assert pod.tier.steps() == [8]
    assert {e["step"] for e in pod.event_list()} == {5, 8}  # 7 was never a step
    store = LocalStore(tmp_path / "store")
    data_steps = {parsed[0] for info in store.list(keys.DATA)
                  if (parsed := keys.parse_data_key(info.key)) is not None}
    assert data_steps == {8} and set(candidate_steps(store)) == {8}
    assert SECRET not in _everything_under(tmp_path / "store")
    assert SECRET not in _everything_under(pod.local)
    log = pod.logs()
    assert "symlink" in log and "step-007" in log
