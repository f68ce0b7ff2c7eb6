"""The share channel: its format, the operator's two-step admission, and how
an agent derives its share from it."""

from __future__ import annotations

import random

import pytest

from ckptdrain.agent.share import ChannelView, Share, resolve_channel
from ckptdrain.agent.share_channel import ShareChannel
from ckptdrain.contract import share as sh
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.bandwidth.share_channel import (
    ChannelState,
    Drainer,
    admit,
    allocation,
    rank_of,
)


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


def _view(**kw: object) -> ChannelView:
    base: dict[str, object] = {"established": True, "broken": False, "forbidden": False,
                               "allocation": sh.from_object(_obj(writers=4)),
                               "received_at": 10.0, "admitted": False, "draining": True,
                               "waiting_since": 10.0, "flushing": False}
    base.update(kw)
    return ChannelView(**base)  # type: ignore[arg-type]


def test_agent_uses_the_channel_when_admitted_and_waits_when_counted() -> None:
    assert resolve_channel(_view(admitted=True), 11.0, FILE) == Share(250.0, "channel")
    waiting = resolve_channel(_view(), 11.0, FILE)
    assert waiting.source == "waiting" and waiting.rate == sh.PAUSED_RATE


def test_the_fallback_never_exceeds_the_budget_over_the_writers() -> None:
    rich = Share(10_000.0, "file")  # an annotation from before the budget shrank
    assert resolve_channel(_view(draining=False), 11.0, rich).rate == 250.0
    assert resolve_channel(_view(established=False, allocation=None), 11.0,
                           rich).rate == 10_000.0  # no channel ever seen: nothing to cap by


def test_a_channel_gone_quiet_or_broken_drops_the_admitted_to_the_smaller_share() -> None:
    quiet = resolve_channel(_view(admitted=True), 10.0 + sh.DEAD_AFTER_S + 1,
                            Share(100.0, "file"))
    assert quiet.rate == 100.0 and "not current" in (quiet.problem or "")
    broken = resolve_channel(_view(admitted=True, broken=True), 11.0, Share(400.0, "file"))
    assert broken.rate == 250.0 and broken.problem
    # Nobody drains: no heartbeat is due, an old event is no sign of trouble.
    idle = sh.from_object(_obj(drainers=0, activeRanks=""))
    assert resolve_channel(_view(admitted=False, allocation=idle, draining=False),
                           10.0 + 3600, FILE) == FILE


def test_a_never_counted_drainer_outwaits_the_admitted_before_it_falls_back() -> None:
    assert sh.ADMIT_TIMEOUT_S > sh.DEAD_AFTER_S + sh.JOIN_DELAY_S
    late = resolve_channel(_view(waiting_since=0.0), sh.ADMIT_TIMEOUT_S + 0.1, FILE)
    assert late.rate == 50.0 and "not admitted" in (late.problem or "")
    still = resolve_channel(_view(waiting_since=0.0), sh.ADMIT_TIMEOUT_S - 0.1, FILE)
    assert still.source == "waiting"


def test_a_sigterm_flush_does_not_wait_to_be_admitted() -> None:
    flush = resolve_channel(_view(flushing=True), 11.0, FILE)
    assert flush.rate == 50.0 and "SIGTERM" in (flush.problem or "")


def test_without_a_channel_the_file_share_applies() -> None:
    assert resolve_channel(_view(forbidden=True, admitted=True), 1.0, FILE).source == "file"
    assert resolve_channel(_view(established=False), 1.0, FILE) == FILE


def test_pods_sharing_a_rank_are_admitted_by_name_only() -> None:
    ds = [Drainer("old", 3), Drainer("new", 3), Drainer("w4", 4)]
    a = allocation("p", 900, None, ds, frozenset({"old", "w4"}), writers=5)
    assert a.active_ranks == "4" and a.active_pods == ("old",)
    assert a.admits(None, "old") and not a.admits(3, "new") and a.admits(4, "w4")
    assert a.fallback_cap() == 180


class _Api:
    """A CheckpointShare list the channel reads once; the watch never delivers."""

    def __init__(self, obj: dict[str, object] | None) -> None:
        self.obj = obj

    def list_namespaced_custom_object(self, *args: object, **kw: object) -> dict[str, object]:
        if kw.get("watch"):
            raise ConnectionError("no watch here")
        return {"metadata": {"resourceVersion": "5"},
                "items": [self.obj] if self.obj else []}


def test_an_admission_older_than_the_drains_report_is_not_believed() -> None:
    clock = {"now": 100.0}
    reported: dict[str, float | None] = {"at": None}
    pending = {"bytes": 10}
    channel = ShareChannel("ns", "p", rank=0, pod="w0", pending=lambda: pending["bytes"],
                           reported=lambda: reported["at"], api=_Api(None),
                           clock=lambda: clock["now"])
    channel._accept(_obj(activeRanks="0-1", drainers=2))
    clock["now"] = 101.0
    reported["at"] = 100.5  # this drain was reported after that allocation arrived
    view = channel.view()
    assert not view.admitted and view.waiting_since == 101.0
    clock["now"] = 102.0
    channel._accept(_obj(activeRanks="0-1", drainers=2))
    view = channel.view()
    assert view.admitted and view.waiting_since is None
    pending["bytes"] = 0
    assert channel.view().waiting_since is None


def test_a_channel_is_labelled_with_its_policy_only_when_the_name_fits_a_label() -> None:
    """The apiserver refuses a label value over 63 characters: a longer policy
    name (valid without the peer tier) gets an unlabelled channel, never a
    refused write."""
    def channel(policy: str) -> dict[str, object]:
        return sh.body("ns", sh.Allocation(policy=policy, budget=900, drainers=3,
                                           active_ranks="0-2"), None)
    fits = channel("p" * 63)
    assert fits["metadata"]["labels"] == {"ckptdrain.io/policy": "p" * 63}
    long = channel("p" * 64)
    assert "labels" not in long["metadata"] and long["metadata"]["name"] == "p" * 64
