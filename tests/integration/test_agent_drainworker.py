"""The drain worker in-process over a real file:// store (and a fault wrapper around it):
newest first, retries after store errors, no re-send of what the store already has."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.faults import FaultyStore

from ckptdrain import keys
from ckptdrain.agent.drainworker import DrainWorker
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.errors import StoreAccessDenied, StoreUnreachable
from ckptdrain.node.localtier import LocalTier
from ckptdrain.store.local import LocalStore

PART = 1 << 20


class Recorder:
    def __init__(self) -> None:
        self.events: list[CheckpointEvent] = []

    def report(self, event: CheckpointEvent) -> None:
        self.events.append(event)

    def states(self, step: int) -> list[str]:
        return [e.state.value for e in self.events if e.step == step]


def _tier(tmp_path: Path, steps: list[int], size: int = 3 * PART) -> LocalTier:
    tier = LocalTier(tmp_path / "local")
    for step in steps:
        src = tmp_path / "src" / f"step-{step}"
        src.mkdir(parents=True)
        (src / "w.bin").write_bytes(bytes([step % 256]) * size)
        tier.capture(src, step, writer=0, writers=1)
    return tier


def _worker(tier: LocalTier, store: object, recorder: Recorder) -> DrainWorker:
    from ckptdrain.transfer.drain import Drainer

    return DrainWorker(tier, store, Drainer(store, part_size=PART, concurrency=2),  # type: ignore[arg-type]
                       recorder, AgentMetrics(), part_size=PART)


def _wait(condition: Callable[[], bool], what: str, cap: float = 60.0) -> None:
    deadline = time.monotonic() + cap
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def store(tmp_path: Path) -> FaultyStore:
    return FaultyStore(LocalStore(str(tmp_path / "store")))


def _drain_until_failed(tier: LocalTier, store: FaultyStore, step: int, what: str) -> Recorder:
    """Drain `step` until the worker reports it Failed; what it reported."""
    recorder = Recorder()
    worker = _worker(tier, store, recorder)
    worker.start()
    worker.submit(step)
    _wait(lambda: "Failed" in recorder.states(step), what)
    worker.stop(10)
    return recorder


def test_store_errors_are_retried_and_reported(tmp_path: Path, store: FaultyStore) -> None:
    tier = _tier(tmp_path, [1])
    # Not transient, so the engine gives up at once and the worker's own retry acts.
    store.fail("upload_part", times=1, error=lambda: StoreAccessDenied("injected: denied"))
    recorder = Recorder()
    worker = _worker(tier, store, recorder)
    worker.start()
    worker.submit(1)
    _wait(lambda: tier.is_global(1), "the retried drain")
    worker.stop(10)
    states = recorder.states(1)
    assert "Failed" in states and states[-1] == "Global"
    failed = next(e for e in recorder.events if e.state.value == "Failed")
    assert "denied" in failed.message and "retrying" in failed.message


def test_a_store_that_does_not_answer_is_retrying_not_failed(tmp_path: Path,
                                                             store: FaultyStore) -> None:
    from ckptdrain.transfer.drain import Drainer

    tier = _tier(tmp_path, [1])
    # One try per drain in the engine, so the worker sees each outage itself.
    store.fail("upload_part", times=2, error=lambda: StoreUnreachable("injected: no answer"))
    recorder = Recorder()
    worker = DrainWorker(tier, store, Drainer(store, part_size=PART, concurrency=1, attempts=1),  # type: ignore[arg-type]
                         recorder, AgentMetrics(), part_size=PART)
    worker.start()
    worker.submit(1)
    _wait(lambda: tier.is_global(1), "the retried drain")
    worker.stop(10)
    states = recorder.states(1)
    assert "Retrying" in states and "Failed" not in states and states[-1] == "Global"
    retrying = next(e for e in recorder.events if e.state.value == "Retrying")
    assert "no answer" in retrying.message and "retrying in" in retrying.message


def test_a_step_already_in_the_store_is_not_sent_again(tmp_path: Path, store: FaultyStore
                                                       ) -> None:
    tier = _tier(tmp_path, [4])
    first = _worker(tier, store, Recorder())
    first.start()
    first.submit(4)
    _wait(lambda: tier.is_global(4), "the first drain")
    first.stop(10)
    (tier.step_dir(4) / "GLOBAL").unlink()  # as if the agent died before writing the marker
    sent = store.calls["upload_part"]
    recorder = Recorder()
    again = _worker(tier, store, recorder)
    again.start()
    again.submit(4)
    _wait(lambda: tier.is_global(4), "the second pass")
    again.stop(10)
    assert store.calls["upload_part"] == sent
    assert recorder.events[-1].message == "already in the store"


@pytest.mark.parametrize("committed_first", ["other content", "corrupt"])
def test_a_step_committed_otherwise_stays_local_and_is_reported(
        tmp_path: Path, store: FaultyStore, committed_first: str) -> None:
    """Another pod that held this rank committed step 5 with other content, or
    the committed manifest is unreadable: not "already global" (local
    retention could then delete the only good copy), and never overwritten."""
    if committed_first == "other content":
        other = _tier(tmp_path / "other-pod", [5], size=PART + 7)
        first = _worker(other, store, Recorder())
        first.start()
        first.submit(5)
        _wait(lambda: other.is_global(5), "the other pod's drain")
        first.stop(10)
    else:
        store.put_bytes(keys.manifest_key(5, 0), b'{"format":2')
    theirs = store.get_bytes(keys.manifest_key(5, 0))
    tier = _tier(tmp_path, [5])
    recorder = _drain_until_failed(tier, store, 5, "the conflict's report")
    assert not tier.is_global(5) and tier.has(5)
    assert "Global" not in recorder.states(5)
    failed = next(e for e in recorder.events if e.state.value == "Failed")
    expected = "different content" if committed_first == "other content" else "unreadable"
    assert expected in failed.message
    assert store.get_bytes(keys.manifest_key(5, 0)) == theirs


def test_newest_first_when_behind(tmp_path: Path, store: FaultyStore) -> None:
    tier = _tier(tmp_path, [1, 2, 3])
    recorder = Recorder()
    worker = _worker(tier, store, recorder)
    for step in (1, 2, 3):
        worker.submit(step)
    worker.start()
    _wait(lambda: tier.is_global(3), "the newest drain")
    worker.stop(10)
    # 3 went first; once it is global the older ones are pointless and dropped.
    assert recorder.events[0].step == 3
    assert not tier.is_global(1) and not tier.is_global(2)


def test_a_superseded_drain_goes_back_to_local(tmp_path: Path, store: FaultyStore) -> None:
    tier = _tier(tmp_path, [1, 2], size=8 * PART)
    store.delay("upload_part", seconds=0.2)  # slow enough for step 2 to arrive mid-drain
    recorder = Recorder()
    worker = _worker(tier, store, recorder)
    worker.submit(1)
    worker.start()
    _wait(lambda: store.calls["upload_part"] >= 1, "step 1 to start draining")
    worker.submit(2)
    _wait(lambda: tier.is_global(2), "the newer step")
    worker.stop(10)
    # Step 1 was cut short: its last word must not be "Draining" (a stall in disguise).
    assert recorder.states(1)[:1] == ["Draining"]
    assert recorder.states(1)[-1] == "Local"
    assert not tier.is_global(1)


class Fence:
    """A writer lease stand-in: fenced for the first `held_by_other` checks."""

    def __init__(self, held_by_other: int) -> None:
        self.left, self.checks, self.released = held_by_other, 0, False

    def check(self) -> None:
        from ckptdrain.node.lease import WriterFenced

        self.checks += 1
        if self.left > 0:
            self.left -= 1
            raise WriterFenced("writer lease is held by pod uid other")

    def release(self) -> None:
        self.released = True


def test_a_fenced_writer_commits_only_once_it_holds_the_lease(tmp_path: Path,
                                                              store: FaultyStore) -> None:
    tier = _tier(tmp_path, [1])
    recorder = Recorder()
    fence = Fence(held_by_other=1)
    worker = DrainWorker(tier, store, _worker(tier, store, recorder).drainer, recorder,
                         AgentMetrics(), part_size=PART, fence=fence)
    worker.start()
    worker.submit(1)
    _wait(lambda: tier.is_global(1), "the drain after the lease came free")
    assert worker.stop(10) and fence.released
    failed = next(e for e in recorder.events if e.state.value == "Failed")
    assert "held by pod uid other" in failed.message
    assert fence.checks == 2 and recorder.states(1)[-1] == "Global"


def test_a_drain_still_retrying_when_the_pod_stops_is_reported_given_up(
        tmp_path: Path, store: FaultyStore) -> None:
    import argparse

    from ckptdrain.agent.loop import Agent
    from ckptdrain.client import Client
    from ckptdrain.node import config
    from ckptdrain.transfer.drain import Drainer

    store.fail("upload_part", times=10_000, error=lambda: StoreUnreachable("injected: down"))
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    cfg = config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(tmp_path / "work"), "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "l"),
        "CKPTDRAIN_GRACE_SECONDS": "3", "CKPTDRAIN_NODE_NAME": "node-a"})
    tier = LocalTier(cfg.local_dir)
    recorder = Recorder()
    worker = DrainWorker(tier, store, Drainer(store, part_size=PART, concurrency=1, attempts=1),  # type: ignore[arg-type]
                         recorder, AgentMetrics(), part_size=PART)
    worker.start()
    agent = Agent(cfg, tier, recorder, AgentMetrics(), worker)
    client = Client(tmp_path / "work")
    (client.begin(4) / "w.bin").write_bytes(b"x" * (2 * PART))
    client.complete(4)
    assert agent.capture_newest("schedule") == 4
    _wait(lambda: "Retrying" in recorder.states(4), "a failed try")
    agent.on_sigterm()
    assert agent.flush() == 0
    states = recorder.states(4)
    assert states[-1] == "Failed" and not tier.is_global(4)
    last = [e for e in recorder.events if e.step == 4][-1]
    assert "given up when the pod stopped" in last.message and "down" in last.message
    assert "node-a" in last.message


def test_a_linked_file_rewritten_after_capture_is_refused_before_any_byte_is_sent(
        tmp_path: Path, store: FaultyStore) -> None:
    """Capture hard-linked the trainer's file (one filesystem); the trainer then
    rewrote it in place: the drain refuses the step before sending anything."""
    tier = _tier(tmp_path, [6])
    shard = tmp_path / "src" / "step-6" / "w.bin"
    assert shard.stat().st_nlink == 2  # taken by link, not copied
    time.sleep(0.02)  # past the filesystem's timestamp tick
    with open(shard, "r+b") as f:
        f.write(b"\xff")
    recorder = _drain_until_failed(tier, store, 6, "the refusal")
    assert not tier.is_global(6)
    sent = {c for c, n in store.calls.items() if n and c.startswith(("put", "upload", "create",
                                                                      "complete"))}
    assert not sent, store.calls
    failed = next(e for e in recorder.events if e.step == 6 and e.state.value == "Failed")
    assert "w.bin" in failed.message, failed.message
