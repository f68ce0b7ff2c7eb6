"""Every writer's agent sends the same steps to the global tier when
`globalEvery` > 1, whichever step it started on or missed."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.agent_config import agent_config

from ckptdrain.agent.global_choice import GlobalChoice
from ckptdrain.agent.loop import Agent
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.client import Client
from ckptdrain.node.localtier import LocalTier

#: A save every 10 s from this (wall) time on; periods of 3 × 10 s.
START, INTERVAL, EVERY = 3_000_000.0, 10.0, 3


def saved(step: int) -> float:
    return START + INTERVAL * step + 0.5


def chosen(choice: GlobalChoice, steps: range | list[int]) -> list[int]:
    return [s for s in steps if choice.choose(saved(s))]


def test_the_first_save_of_each_period_goes_global_and_the_first_capture_too() -> None:
    assert chosen(GlobalChoice(INTERVAL, EVERY), range(10)) == [0, 3, 6, 9]
    assert chosen(GlobalChoice(INTERVAL, EVERY), range(4, 10)) == [4, 6, 9]


def test_agents_that_start_on_different_steps_agree_after_one_period() -> None:
    early = chosen(GlobalChoice(INTERVAL, EVERY), range(0, 30))
    late = chosen(GlobalChoice(INTERVAL, EVERY), range(2, 30))
    assert early[0] == 0 and late[0] == 2  # each one's first: the others' is unknown
    assert early[1:] == late[1:] == list(range(3, 30, 3))


def test_a_missed_capture_costs_one_period_not_every_one() -> None:
    seen = [s for s in range(30) if s not in (3, 4)]  # missed step 3 (and 4)
    full = chosen(GlobalChoice(INTERVAL, EVERY), range(30))
    gappy = chosen(GlobalChoice(INTERVAL, EVERY), seen)
    assert gappy == [0, 5, *range(6, 30, 3)]
    assert set(full) - set(gappy) == {3}


def test_with_global_every_one_every_capture_goes_global() -> None:
    choice = GlobalChoice(INTERVAL, 1)
    assert all(choice.choose(START) for _ in range(5))


def test_a_sigterm_capture_serves_its_period() -> None:
    choice = GlobalChoice(INTERVAL, EVERY)
    assert choice.choose(saved(0))
    choice.sent(saved(3))
    assert not choice.choose(saved(4)) and choice.choose(saved(6))


class _Drain:
    fence = None  # no writer's lease: nothing else of the loop's housekeeping runs

    def __init__(self) -> None:
        self.submitted: list[int] = []

    def busy_steps(self) -> set[int]:
        return set()

    def lag_bytes(self) -> int:
        return 0

    def submit(self, step: int, trigger: str) -> None:
        self.submitted.append(step)


class _Quiet:
    def report(self, event: object) -> None:
        pass


def _drained(root: Path, steps: range) -> list[int]:
    """What one writer's agent hands to the drain when its trainer saves `steps`
    at `saved(step)` (the step directory's modification time)."""
    cfg = agent_config(root, CKPTDRAIN_LOCAL_KEEP="3", CKPTDRAIN_INTERVAL=f"{INTERVAL:g}s",
                       CKPTDRAIN_GLOBAL_EVERY=str(EVERY))
    drain = _Drain()
    agent = Agent(cfg, LocalTier(cfg.local_dir), _Quiet(), AgentMetrics(),  # type: ignore[arg-type]
                  drain)  # type: ignore[arg-type]
    client = Client(root / "work")
    for step in steps:
        (client.begin(step) / "shard").write_bytes(bytes([step]) * 100)
        published = client.complete(step)
        os.utime(published, (saved(step), saved(step)))
        assert agent.capture_newest("schedule") == step
        agent.housekeeping()
    return drain.submitted


def test_two_writers_whose_agents_start_apart_drain_the_same_steps(tmp_path: Path) -> None:
    # Writer 1's pod started later: its agent's first capture is step 2.
    writer0 = _drained(tmp_path / "w0", range(0, 12))
    writer1 = _drained(tmp_path / "w1", range(2, 12))
    assert writer0 == [0, 3, 6, 9] and writer1 == [2, 3, 6, 9]
    assert set(writer0) & set(writer1) == {3, 6, 9}  # complete globally
