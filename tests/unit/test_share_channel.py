"""The share channel: its format, the operator's two-step admission, and how
an agent derives its share from it."""

from __future__ import annotations

import random

import pytest

from ckptdrain.agent.share import ADMIT_TIMEOUT_S, ChannelView, Share, resolve_channel
from ckptdrain.contract import share as sh
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.share_channel import ChannelState, Drainer, admit, allocation, rank_of


def test_ranks_round_trip_as_ranges() -> None:
    assert sh.encode_ranks([5, 0, 1, 2, 7, 8, 2]) == "0-2,5,7-8"
    assert sh.decode_ranks("0-2,5,7-8") == [(0, 2), (5, 5), (7, 8)]
    assert sh.encode_ranks([]) == "" and sh.decode_ranks("") == []
    rng = random.Random(7)
    for _ in range(50):
        ranks = set(rng.sample(range(300), rng.randint(0, 200)))
        spans = sh.decode_ranks(sh.encode_ranks(ranks))
        assert {r for low, high in spans for r in range(low, high + 1)} == ranks


@pytest.mark.parametrize("text", ["a", "1-", "3-1", "1,,2", "-4"])
def test_bad_ranges_name_the_field(text: str) -> None:
    with pytest.raises(InvalidInput, match=r"spec\.activeRanks"):
        sh.decode_ranks(text)


def _obj(**spec: object) -> dict[str, object]:
    base: dict[str, object] = {"policy": "p", "budgetBytes": 1000, "drainers": 4,
                               "activeRanks": "0-1", "activePods": []}
    base.update(spec)
    return {"spec": {k: v for k, v in base.items() if v is not None}}


def test_an_admitted_agent_gets_budget_over_drainers_within_the_cap() -> None:
    a = sh.from_object(_obj())
    assert a.admits(0, "x") and a.admits(1, "x") and not a.admits(2, "x")
    assert not a.admits(None, "x")
    assert a.share() == 250
    assert sh.from_object(_obj(perDrainerCapBytes=100)).share() == 100
    assert sh.from_object(_obj(activeRanks="", activePods=["solo"], drainers=1)
                          ).admits(None, "solo")


@pytest.mark.parametrize("spec,field", [
    ({"budgetBytes": 0}, "spec.budgetBytes"),
    ({"budgetBytes": "1000"}, "spec.budgetBytes"),
    ({"drainers": -1}, "spec.drainers"),
    ({"drainers": 1}, "spec.drainers"),  # two admitted, one counted: refused
    ({"activeRanks": 3}, "spec.activeRanks"),
    ({"activePods": "a"}, "spec.activePods"),
    ({"policy": ""}, "spec.policy"),
    ({"perDrainerCapBytes": 0}, "spec.perDrainerCapBytes"),
])
def test_a_malformed_allocation_is_refused_by_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput, match=field.replace(".", r"\.")):
        sh.from_object(_obj(**spec))


def test_spec_round_trips_and_a_dropped_cap_is_removed_by_the_patch() -> None:
    a = sh.Allocation(policy="p", budget=900, drainers=3, active_ranks="0-2")
    assert sh.to_spec(a)["perDrainerCapBytes"] is None  # merge patch: remove
    body = sh.body("ns", a, None)
    assert "perDrainerCapBytes" not in body["spec"]
    assert sh.from_object(body) == a


def _d(*pods: str) -> list[Drainer]:
    return [Drainer(p, int(p[1:]) if p.startswith("w") else None) for p in pods]


def test_a_new_drainer_is_counted_first_and_admitted_a_delay_later() -> None:
    state = ChannelState()
    active, joining, recheck = admit(state, _d("w0", "w1"), now=100.0, delay=1.0)
    assert active == frozenset() and set(joining) == {"w0", "w1"} and recheck == 1.0
    state.active, state.joining_since = active, joining
    active, joining, recheck = admit(state, _d("w0", "w1"), now=100.4, delay=1.0)
    assert active == frozenset() and recheck == pytest.approx(0.6)
    active, joining, recheck = admit(state, _d("w0", "w1"), now=101.0, delay=1.0)
    assert active == {"w0", "w1"} and joining == {} and recheck is None
    state.active, state.joining_since = active, joining
    # w2 joins: counted at once, admitted later; w0 is done and leaves.
    active, joining, _ = admit(state, _d("w1", "w2"), now=105.0, delay=1.0)
    assert active == {"w1"} and set(joining) == {"w2"}


def _applied(draining: list[Drainer], a: sh.Allocation) -> float:
    return sum(a.share() for d in draining if a.admits(d.rank, d.pod))


def test_the_admitted_never_sum_above_the_budget_while_drainers_come_and_go() -> None:
    """Every publication, as seen by every agent, over a random run: the
    agents admitted by the newest publication use its share, and those still
    on the previous one (not yet seen) use theirs; together at most the budget
    as long as each publication is seen before the next one (within the join
    delay, for the one that admits)."""
    rng = random.Random(3)
    state = ChannelState()
    pool = [f"w{i}" for i in range(40)]
    draining: set[str] = set()
    previous: sh.Allocation | None = None
    now = 0.0
    for _ in range(400):
        now += rng.choice([0.2, 0.5, 1.0, 1.5])
        for pod in rng.sample(pool, 3):
            draining.symmetric_difference_update({pod})
        ds = _d(*sorted(draining))
        active, joining, _ = admit(state, ds, now, delay=1.0)
        a = allocation("p", 4000, None, ds, active)
        assert _applied(ds, a) <= 4000 + 1e-6
        if previous is not None:
            # Agents that stopped left the count only after stopping; those still
            # draining saw either publication: the worst mix stays within budget.
            worst = sum(max(a.share() if a.admits(d.rank, d.pod) else 0,
                            previous.share() if previous.admits(d.rank, d.pod) else 0)
                        for d in ds)
            assert worst <= 4000 + 1e-6
        state.active, state.joining_since = active, joining
        previous = a


def test_pods_without_a_rank_are_admitted_by_name() -> None:
    ds = [Drainer("solo", None)]
    a = allocation("p", 100, None, ds, frozenset({"solo"}))
    assert a.active_pods == ("solo",) and a.active_ranks == "" and a.admits(None, "solo")
    assert rank_of("12") == 12 and rank_of(None) is None and rank_of("x") is None


FILE = Share(50.0, "file")


def test_agent_uses_the_channel_when_admitted_and_waits_when_counted() -> None:
    a = sh.from_object(_obj())
    live = ChannelView(live=True, allocation=a, draining=True, draining_since=10.0)
    assert resolve_channel(live, 1, "pod", 11.0, FILE) == Share(250.0, "channel")
    waiting = resolve_channel(live, 3, "pod", 11.0, FILE)
    assert waiting.source == "waiting" and waiting.rate == sh.PAUSED_RATE


def test_agent_falls_back_to_its_file_share_when_the_channel_fails_it() -> None:
    a = sh.from_object(_obj())
    late = ChannelView(live=True, allocation=a, draining=True, draining_since=0.0)
    fell = resolve_channel(late, 3, "pod", ADMIT_TIMEOUT_S + 1, FILE)
    assert fell.rate == 50.0 and "not admitted" in (fell.problem or "")
    dead = ChannelView(live=False, allocation=a, draining=True, draining_since=0.0)
    assert resolve_channel(dead, 1, "pod", 1.0, FILE) == FILE
    idle = ChannelView(live=True, allocation=None, draining=False, draining_since=None)
    assert resolve_channel(idle, 3, "pod", 1.0, FILE) == FILE
