"""A local tier that never fills the node: the policy's capacity and the
disk's free space bound what the agent keeps, a scheduled capture always
leaves room for the SIGTERM checkpoint, and a capture that cannot fit is
refused with a clear event and nothing half-written (node/space.py,
agent/loop.py)."""

from __future__ import annotations

import argparse
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.agent.loop import Agent
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.agent.refusals import event_body
from ckptdrain.agent.report import CheckpointEvent, State
from ckptdrain.client import Client
from ckptdrain.contract import tier_reserve
from ckptdrain.node import config, space
from ckptdrain.node.localtier import LocalTier

BIG = 10**15  # free space that never binds


def test_nothing_goes_when_the_capture_and_its_reserve_fit() -> None:
    assert space.plan_room(10, 10, {1: 10, 2: 10}, [1, 2], 40, BIG) == space.Room(())


def test_the_first_evictable_steps_go_until_it_fits() -> None:
    assert space.plan_room(10, 10, {1: 10, 2: 10, 3: 10}, [1, 2], 40, BIG).evict == (1,)
    assert space.plan_room(10, 10, {1: 10, 2: 10, 3: 10}, [1, 2], 30, BIG).evict == (1, 2)


def test_the_disk_binds_as_well_as_the_capacity() -> None:
    assert space.plan_room(10, 10, {1: 10}, [1], None, 15).evict == (1,)
    assert space.plan_room(10, 0, {1: 10}, [1], None, 15).evict == ()


def test_what_cannot_fit_is_refused_and_nothing_is_removed_for_it() -> None:
    room = space.plan_room(10, 10, {1: 10, 2: 10}, [1], 25, BIG)
    assert room.evict == () and room.refused is not None
    assert "SIGTERM" in room.refused and "capacity" in room.refused


@given(need=st.integers(0, 100), reserve=st.integers(0, 100),
       sizes=st.dictionaries(st.integers(0, 20), st.integers(0, 100), max_size=8),
       capacity=st.none() | st.integers(0, 500), free=st.integers(0, 500))
def test_a_plan_that_is_not_refused_fits(need: int, reserve: int, sizes: dict[int, int],
                                         capacity: int | None, free: int) -> None:
    evictable = sorted(sizes)[:-1]  # the newest is never evictable
    room = space.plan_room(need, reserve, sizes, evictable, capacity, free)
    gone = sum(sizes[s] for s in room.evict)
    if room.refused is None:
        assert capacity is None or sum(sizes.values()) - gone + need + reserve <= capacity
        assert need + reserve <= free + gone
        assert set(room.evict) <= set(evictable)
    else:
        assert room.evict == ()


class Recorder:
    def __init__(self) -> None:
        self.events: list[CheckpointEvent] = []

    def report(self, event: CheckpointEvent) -> None:
        self.events.append(event)


def _agent(tmp_path: Path, capacity: str, keep: int = 3) -> tuple[Agent, Recorder]:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    cfg = config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(tmp_path / "work"),
        "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "local"),
        "CKPTDRAIN_LOCAL_KEEP": str(keep), "CKPTDRAIN_LOCAL_CAPACITY": capacity})
    recorder = Recorder()
    return Agent(cfg, LocalTier(cfg.local_dir), recorder, AgentMetrics(), None), recorder


def _publish(tmp_path: Path, step: int, size: int = 1000) -> None:
    client = Client(tmp_path / "work")
    (client.begin(step) / "w").write_bytes(os.urandom(size))
    client.complete(step)


def test_scheduled_captures_keep_the_tier_within_capacity_with_room_for_sigterm(
        tmp_path: Path) -> None:
    agent, _ = _agent(tmp_path, capacity="3500")  # keep 3 would need 4000 with the reserve
    for step in range(1, 6):
        _publish(tmp_path, step)
        assert agent.capture_newest("schedule") == step
        agent.housekeeping()
        held = sum(agent.tier.bytes_of(s) for s in agent.tier.steps())
        assert held + 1000 <= 3500, (step, agent.tier.steps())  # room for one more
    assert agent.tier.steps() == [5, 4]
    # The emergency capture takes the reserve.
    _publish(tmp_path, 6)
    assert agent.capture_newest("sigterm") == 6
    assert agent.tier.steps() == [6, 5, 4]


def test_a_capture_the_tier_cannot_hold_is_refused_with_a_clear_event(tmp_path: Path) -> None:
    agent, recorder = _agent(tmp_path, capacity="1500")
    _publish(tmp_path, 1, size=1000)
    with pytest.raises(space.WontFit) as refused:
        agent.capture_newest("schedule")
    assert space.is_no_room(refused.value)  # the loop backs off as for a full disk
    failed = [e for e in recorder.events if e.state is State.FAILED]
    assert len(failed) == 1 and "step 1 refused" in failed[0].message
    assert "1.00 kB plus 1.00 kB kept free for the SIGTERM checkpoint" in failed[0].message
    assert agent.tier.steps() == []
    local = tmp_path / "local"
    assert not local.exists() or not any(local.iterdir())  # nothing half-written
    # SIGTERM needs no reserve: the same step fits then.
    assert agent.capture_newest("sigterm") == 1


def test_the_only_copy_of_the_recovery_point_is_never_removed_for_room(tmp_path: Path) -> None:
    agent, _ = _agent(tmp_path, capacity="2500", keep=5)
    _publish(tmp_path, 1)
    assert agent.capture_newest("schedule") == 1  # not global: the recovery point
    _publish(tmp_path, 2, size=1200)
    with pytest.raises(space.WontFit):
        agent.capture_newest("schedule")
    assert agent.tier.steps() == [1]
    agent.tier.mark_global(1, "file:///store")
    assert agent.capture_newest("schedule") == 2  # now step 1 may make room
    assert agent.tier.steps() == [2]


class Refusals:
    def __init__(self) -> None:
        self.seen: list[tuple[int | None, str]] = []

    def refused(self, step: int | None, message: str) -> None:
        self.seen.append((step, message))


def test_a_refused_capture_posts_one_warning_event_on_the_pod(tmp_path: Path) -> None:
    agent, _ = _agent(tmp_path, capacity="1500")
    agent.refusals = refusals = Refusals()
    _publish(tmp_path, 1, size=1000)
    for _ in range(3):  # the loop's retries of one refusal: one Event
        with pytest.raises(space.WontFit):
            agent.capture_newest("schedule")
    ((step, message),) = refusals.seen
    assert step == 1 and "SIGTERM checkpoint" in message
    body = event_body("ml", "llm-0", "uid-1", step, message, datetime.now(UTC))
    assert body["reason"] == "CaptureRefused" and body["type"] == "Warning"
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "llm-0",
                                      "namespace": "ml", "uid": "uid-1"}
    assert body["message"].startswith("step 1: ") and "kept free" in body["message"]


@given(keep=st.integers(1, 8), shard=st.integers(1, 10**9), more=st.integers(0, 10**9),
       on_disk=st.booleans(), data=st.data())
def test_a_policy_at_the_least_capacity_admission_takes_gets_its_scheduled_captures(
        keep: int, shard: int, more: int, on_disk: bool, data: st.DataObject) -> None:
    """Admission takes `keep + 1` shards (policy/spec.py); with the tier
    holding only this writer's earlier steps (global, none being drained)
    and steps no bigger than a shard, no scheduled capture is refused."""
    capacity = (keep + 1) * shard + data.draw(st.sampled_from([0, more]))
    need = data.draw(st.integers(0, shard))
    held = data.draw(st.lists(st.integers(0, shard), max_size=keep))
    sizes = dict(enumerate(held))
    reserve = need * tier_reserve.reserve_steps(need, capacity, keep, on_disk)
    assert space.plan_room(need, reserve, sizes, sorted(sizes), capacity, BIG).refused is None


def test_two_steps_are_kept_free_only_where_the_capacity_holds_keep_plus_three() -> None:
    assert tier_reserve.reserve_steps(10, 20, 1, False) == 1
    assert tier_reserve.reserve_steps(10, 39, 1, True) == 1
    assert tier_reserve.reserve_steps(10, 40, 1, True) == 2
    assert tier_reserve.reserve_steps(10, None, 1, True) == 2


def test_with_the_work_dir_on_the_tier_keep_1_at_two_shards_still_captures(
        tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    work = tmp_path / "local" / "work-0-0f1e"
    work.mkdir(parents=True)
    cfg = config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(work), "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "local"),
        "CKPTDRAIN_LOCAL_KEEP": "1", "CKPTDRAIN_LOCAL_CAPACITY": "2000"})
    agent = Agent(cfg, LocalTier(cfg.local_dir), Recorder(), AgentMetrics(), None)  # type: ignore[arg-type]
    assert agent.stale_work is not None  # the work dir is seen on the tier's disk
    client = Client(work)
    for step in (1, 2):
        (client.begin(step) / "w").write_bytes(os.urandom(1000))
        client.complete(step)
        assert agent.capture_newest("schedule") == step
        agent.tier.mark_global(step, "file:///store")  # drained: it may make room
    assert agent.tier.steps() == [2]
