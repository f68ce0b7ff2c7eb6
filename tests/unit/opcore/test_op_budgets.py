"""operator/bandwidth/budgets.py: the remembered joint budgets equal a fresh parse and
joint sizing of every policy, whatever changed between asks, and only what
changed is parsed again. rebalance.budget_of: a rebalance of one policy
reuses the last joint answer while no policy changed, recounting only its
own drainers, and asks again for everything as soon as one may have."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.bandwidth import answer_memo, policy_changes, rebalance
from ckptdrain.operator.bandwidth.budgets import JointBudgets
from ckptdrain.operator.policy import allocation
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", cluster_bandwidth=200e9)
Key = tuple[str, str]


def body(name: str, generation: int, uid: str = "", **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": name}},
        "model": {"checkpointBytes": f"{100 + 10 * generation}GB"}, "interval": "15m",
        "localTier": {"path": "/mnt/ckptdrain/nvme"},
        "storage": {"uri": "s3://bucket/prefix"},
    }
    spec.update(over)
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid or f"uid-{name}",
                         "generation": generation}, "spec": spec}


class Parser:
    def __init__(self, cfg: config.OperatorConfig = CFG) -> None:
        self.cfg, self.calls = cfg, 0

    def __call__(self, b: Mapping[str, Any], drainers: int) -> policy.Policy:
        self.calls += 1
        return policy.parse(b["metadata"]["namespace"], b["metadata"]["name"], b["spec"],
                            self.cfg, drainers=drainers)


def fresh_answer(bodies: Mapping[Key, Mapping[str, Any]], drainers: Mapping[Key, int],
                 cfg: config.OperatorConfig = CFG) -> dict[Key, Any]:
    """What the operator computed before the memo: everything parsed again."""
    parsed = {}
    for key, b in bodies.items():
        try:
            parsed[key] = policy.parse(key[0], key[1], b["spec"], cfg,
                                       drainers=max(1, drainers.get(key, 0)))
        except policy.InvalidInput:
            continue
    joint = allocation.joint_sizing({k: p.sizing_input for k, p in parsed.items()},
                                    cfg.cluster_bandwidth,
                                    counted={k for k in parsed if drainers.get(k, 0) > 0})
    return {k: (s, share, parsed[k]) for k, (s, share) in joint.items()}


def test_equal_to_a_fresh_joint_sizing_through_random_changes() -> None:
    rng = random.Random(7)
    memo, parse = JointBudgets(), Parser()
    bodies: dict[Key, dict[str, Any]] = {}
    drainers: dict[Key, int] = {}
    generation = 0
    for _ in range(300):
        what = rng.random()
        name = f"p{rng.randrange(12)}"
        key = ("ns", name)
        if what < 0.35:  # a spec change (or a new policy)
            generation += 1
            bodies[key] = body(name, generation)
        elif what < 0.45:  # an invalid spec
            generation += 1
            bodies[key] = body(name, generation, interval="never")
        elif what < 0.55 and key in bodies:  # deleted, maybe back as another policy
            del bodies[key]
            memo.forget(key)
        else:  # pods come and go
            drainers[key] = rng.randrange(0, 50)
        got = memo.compute(bodies, drainers, CFG.cluster_bandwidth, parse, CFG)
        assert got == fresh_answer(bodies, drainers)
    assert parse.calls < 150  # re-parsed on spec changes only, not on every ask


def test_asks_without_a_change_parse_nothing_and_pods_move_only_the_per_drainer_figure(
) -> None:
    memo, parse = JointBudgets(), Parser()
    bodies = {("ns", f"p{i}"): body(f"p{i}", 1) for i in range(100)}
    running = dict.fromkeys(bodies, 1)
    first = memo.compute(bodies, running, CFG.cluster_bandwidth, parse, CFG)
    assert parse.calls == 100
    again = memo.compute(bodies, {**running, ("ns", "p3"): 8}, CFG.cluster_bandwidth, parse,
                         CFG)
    assert parse.calls == 100
    assert again[("ns", "p3")][0].per_drainer_bandwidth == pytest.approx(
        first[("ns", "p3")][0].allowed_bandwidth / 8)
    assert again[("ns", "p3")][2].sizing_input.drainers == 8
    assert {k: v[1] for k, v in again.items()} == {k: v[1] for k, v in first.items()}


def test_a_policys_first_pod_moves_the_split_and_its_last_moves_it_back() -> None:
    # 30 policies of 10 GB/s each under a 200 GB/s cap: with pods, 20 of them
    # fit; an idle one takes no part, so the running ones keep what they get.
    memo, parse = JointBudgets(), Parser()
    bodies = {("ns", f"p{i}"): body(f"p{i}", 1, model={"checkpointBytes": "900GB"})
              for i in range(30)}
    twenty = {("ns", f"p{i}"): 1 for i in range(20)}
    alone = memo.compute(bodies, twenty, CFG.cluster_bandwidth, parse, CFG)
    assert alone[("ns", "p0")][1].budget == pytest.approx(10e9)
    assert not alone[("ns", "p25")][1].counted
    assert alone[("ns", "p25")][1].budget == pytest.approx(200e9 / 21)  # once it runs
    joined = memo.compute(bodies, {**twenty, ("ns", "p25"): 1}, CFG.cluster_bandwidth,
                          parse, CFG)
    assert joined[("ns", "p0")][1].budget == pytest.approx(200e9 / 21)
    assert sum(v[1].budget for v in joined.values() if v[1].counted) == pytest.approx(200e9)
    back = memo.compute(bodies, twenty, CFG.cluster_bandwidth, parse, CFG)
    assert back == alone == fresh_answer(bodies, twenty)
    assert parse.calls == 30


def test_a_body_without_uid_or_generation_is_always_parsed_again() -> None:
    memo, parse = JointBudgets(), Parser()
    b = body("p", 1)
    del b["metadata"]["generation"]
    memo.compute({("ns", "p"): b}, {}, None, parse, CFG)
    b["spec"]["interval"] = "30m"  # the same object, changed: nothing to tell by
    got = memo.compute({("ns", "p"): b}, {}, CFG.cluster_bandwidth, parse, CFG)
    assert parse.calls == 2
    assert got == fresh_answer({("ns", "p"): b}, {})


def test_a_recreated_policy_with_the_same_generation_is_parsed_again() -> None:
    memo, parse = JointBudgets(), Parser()
    memo.compute({("ns", "p"): body("p", 1, uid="a")}, {}, None, parse, CFG)
    got = memo.compute({("ns", "p"): body("p", 1, uid="b", interval="30m")}, {}, None,
                       parse, CFG)
    assert got[("ns", "p")][0].local_interval_s == 1800


def test_a_fresh_policy_overrides_the_index() -> None:
    memo, parse = JointBudgets(), Parser()
    bodies = {("ns", "a"): body("a", 1), ("ns", "b"): body("b", 1)}
    newer = policy.parse("ns", "a", body("a", 9)["spec"], CFG, drainers=3)
    got = memo.compute(bodies, {}, CFG.cluster_bandwidth, parse, CFG, {("ns", "a"): newer})
    assert got[("ns", "a")][2] is newer
    assert got[("ns", "a")][1].wanted == pytest.approx(190e9 / 90)
    # The fresh one is not remembered as the index's.
    plain = memo.compute(bodies, {}, CFG.cluster_bandwidth, parse, CFG)
    assert plain == fresh_answer(bodies, {})


def test_another_configuration_starts_a_new_memo() -> None:
    memo = JointBudgets()
    bodies = {("ns", "p"): body("p", 1)}
    memo.compute(bodies, {}, None, Parser(), CFG)
    narrow = config.OperatorConfig(allowed_root="/elsewhere", cluster_bandwidth=1e9)
    got = memo.compute(bodies, {}, narrow.cluster_bandwidth, Parser(narrow), narrow)
    assert got == {}  # its local path is outside the new allowed root: invalid now


def test_policies_gone_without_a_word_are_not_remembered_for_ever() -> None:
    memo, parse = JointBudgets(), Parser()
    for round_ in range(20):  # 20 generations of 50 policies, never forgotten
        bodies = {("ns", f"r{round_}-{i}"): body(f"r{round_}-{i}", 1) for i in range(50)}
        memo.compute(bodies, {}, None, parse, CFG)
    assert len(memo._parsed) <= 2 * 50 + 64


def test_an_answer_recounted_for_other_drainers_equals_a_fresh_one() -> None:
    rng = random.Random(11)
    memo, parse = JointBudgets(), Parser()
    bodies = {("ns", f"p{i}"): body(f"p{i}", 1) for i in range(20)}
    # Recounting is for a policy that keeps some pod (its first or last
    # moves the split: rebalance.budget_of asks again then).
    drainers = {key: rng.randrange(1, 30) for key in bodies}
    answer = memo.compute(bodies, drainers, CFG.cluster_bandwidth, parse, CFG)
    for _ in range(200):
        key = ("ns", f"p{rng.randrange(20)}")
        drainers[key] = rng.randrange(1, 30)
        got = memo.recounted(key, answer[key], drainers[key])
        assert got == fresh_answer(bodies, drainers)[key]
        answer[key] = got  # recounted again from a recounted answer


class Drainer:
    def __init__(self, pod: str) -> None:
        self.pod = pod


@pytest.fixture
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the full asks: each a pass over every policy and its pods."""
    memo = JointBudgets()
    monkeypatch.setattr(rebalance, "_joint", memo)
    monkeypatch.setattr(rebalance, "changes", policy_changes.PolicyChanges())
    monkeypatch.setattr(rebalance, "_answers", answer_memo.AnswerMemo())
    full: list[int] = []
    real = memo.compute

    def counted(*args: Any, **kwargs: Any) -> Any:
        full.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(memo, "compute", counted)
    return full


def test_one_policy_reuses_the_answer_until_a_policy_changes(fresh_state: list[int]) -> None:
    policies = {("ns", f"p{i}"): [body(f"p{i}", 1)] for i in range(5)}
    pods: dict[tuple[str, str], list[Drainer]] = {("ns", "p1"): [Drainer("a")]}
    for key, (b,) in policies.items():
        rebalance.changes.seen(key, b)
    whole = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    pods[("ns", "p1")] = [Drainer("a"), Drainer("b"), Drainer("c")]
    one = rebalance.budget_of(CFG, policies, pods, ("ns", "p1"))  # type: ignore[arg-type]
    # No new joint split, and what a full ask gives now.
    assert len(fresh_state) == 1
    assert one == {("ns", "p1"): fresh_answer(
        {k: v[0] for k, v in policies.items()}, {("ns", "p1"): 3})[("ns", "p1")]}
    assert one[("ns", "p1")][0].drainers == 3
    assert one[("ns", "p1")][1] == whole[("ns", "p1")][1]
    # A status change is no change; a new generation is.
    asked = len(fresh_state)
    rebalance.changes.seen(("ns", "p1"), body("p1", 1))
    rebalance.budget_of(CFG, policies, pods, ("ns", "p1"))  # type: ignore[arg-type]
    assert len(fresh_state) == asked
    policies[("ns", "p2")] = [body("p2", 2)]  # a bigger checkpoint: the split moves
    rebalance.changes.seen(("ns", "p2"), policies[("ns", "p2")][0])
    moved = rebalance.budget_of(CFG, policies, pods, ("ns", "p1"))  # type: ignore[arg-type]
    assert len(fresh_state) == asked + 1
    assert moved == {("ns", "p1"): fresh_answer(
        {k: v[0] for k, v in policies.items()}, {("ns", "p1"): 3})[("ns", "p1")]}


def test_a_policys_first_pod_is_a_change_of_the_split(fresh_state: list[int]) -> None:
    policies = {("ns", f"p{i}"): [body(f"p{i}", 1)] for i in range(3)}
    pods: dict[tuple[str, str], list[Drainer]] = {("ns", "p0"): [Drainer("a")]}
    for key, (b,) in policies.items():
        rebalance.changes.seen(key, b)
    rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    asked = len(fresh_state)
    pods[("ns", "p2")] = [Drainer("b")]  # p2 was idle: now it takes part
    got = rebalance.budget_of(CFG, policies, pods, ("ns", "p2"))  # type: ignore[arg-type]
    assert len(fresh_state) == asked + 1
    assert got[("ns", "p2")][1].counted and got[("ns", "p2")][1].policies == 2
    del pods[("ns", "p0")]  # p0's last pod went
    got = rebalance.budget_of(CFG, policies, pods, ("ns", "p0"))  # type: ignore[arg-type]
    assert len(fresh_state) == asked + 2 and not got[("ns", "p0")][1].counted


def test_a_policy_gone_or_invalid_has_no_budget(fresh_state: list[int]) -> None:
    policies = {("ns", "p0"): [body("p0", 1)],
                ("ns", "bad"): [body("bad", 1, interval="never")]}
    for key, (b,) in policies.items():
        rebalance.changes.seen(key, b)
    rebalance.budgets(CFG, policies, {})  # type: ignore[arg-type]
    assert rebalance.budget_of(CFG, policies, {}, ("ns", "bad")) == {}  # type: ignore[arg-type]
    del policies[("ns", "p0")]
    rebalance.forget(("ns", "p0"))
    assert rebalance.budget_of(CFG, policies, {}, ("ns", "p0")) == {}  # type: ignore[arg-type]


def test_an_answer_asked_with_a_fresh_policy_is_not_reused(fresh_state: list[int]) -> None:
    policies = {("ns", "p0"): [body("p0", 1)]}
    rebalance.changes.seen(("ns", "p0"), policies[("ns", "p0")][0])
    parsed = rebalance.parse_policy(CFG, body("p0", 5), 1)
    rebalance.budgets(CFG, policies, {}, {("ns", "p0"): parsed})  # type: ignore[arg-type]
    assert rebalance._answers.last is None


class TellingIndex(dict):  # type: ignore[type-arg]
    """A policy index that changes one policy in the middle of a full ask's
    read, the way Kopf indexes an event (and its handler tells `changes`)
    while another thread is reading."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.change: tuple[tuple[str, str], dict[str, Any]] | None = None

    def get(self, key: Any, default: Any = None) -> Any:
        if self.change is not None and key == self.change[0]:
            changed, self.change = self.change, None
            super().__setitem__(changed[0], [changed[1]])
            rebalance.changes.seen(*changed)
        return super().get(key, default)


def test_an_answer_read_while_a_policy_changed_is_not_reused(fresh_state: list[int]) -> None:
    policies = TellingIndex({("ns", f"p{i}"): [body(f"p{i}", 1)] for i in range(3)})
    for key, (b,) in policies.items():
        rebalance.changes.seen(key, b)
    policies.change = (("ns", "p2"), body("p2", 7))  # lands while p0..p2 are read
    rebalance.budgets(CFG, policies, {})  # type: ignore[arg-type]
    asked = len(fresh_state)
    got = rebalance.budget_of(CFG, policies, {}, ("ns", "p0"))  # type: ignore[arg-type]
    assert len(fresh_state) == asked + 1  # asked again: the answer may predate p2's change
    assert got == {("ns", "p0"): fresh_answer({k: v[0] for k, v in policies.items()},
                                              {})[("ns", "p0")]}


def test_a_policy_the_index_no_longer_holds_gets_nothing(fresh_state: list[int]) -> None:
    policies = {("ns", "p0"): [body("p0", 1)], ("ns", "p1"): [body("p1", 1)]}
    for key, (b,) in policies.items():
        rebalance.changes.seen(key, b)
    rebalance.budgets(CFG, policies, {})  # type: ignore[arg-type]
    del policies[("ns", "p0")]  # Kopf drops it before the DELETED handler runs
    assert rebalance.budget_of(CFG, policies, {}, ("ns", "p0")) == {}  # type: ignore[arg-type]
    # A spec the index holds that the answer did not read: asked again.
    asked = len(fresh_state)
    policies[("ns", "p1")] = [body("p1", 2)]  # its event not told yet
    rebalance.budget_of(CFG, policies, {}, ("ns", "p1"))  # type: ignore[arg-type]
    assert len(fresh_state) == asked + 1


def test_an_answer_is_reused_for_a_moment_at_most_and_not_across_terms(
        fresh_state: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    policies = {("ns", "p0"): [body("p0", 1)]}
    rebalance.changes.seen(("ns", "p0"), policies[("ns", "p0")][0])
    rebalance.budgets(CFG, policies, {})  # type: ignore[arg-type]
    rebalance.budget_of(CFG, policies, {}, ("ns", "p0"))  # type: ignore[arg-type]
    assert len(fresh_state) == 1
    rebalance._new_term()  # another replica wrote meanwhile
    rebalance.budget_of(CFG, policies, {}, ("ns", "p0"))  # type: ignore[arg-type]
    assert len(fresh_state) == 2
    later = rebalance.time.monotonic() + rebalance.REUSE_S + 1
    monkeypatch.setattr(rebalance.time, "monotonic", lambda: later)
    rebalance.budget_of(CFG, policies, {}, ("ns", "p0"))  # type: ignore[arg-type]
    assert len(fresh_state) == 3
