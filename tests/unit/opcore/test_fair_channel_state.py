"""The cluster cap (and a class's) holds when a policy's status already says
its new budget before the joint pass runs, when a channel holds more than its
policy's last joint budget, and when a policy's own pass runs before the
joint pass a change asked for: channel writes follow what each channel last
said, not the status (bandwidth/joint_order.py). The Cluster harness of
test_fair_transitions.py computes what every agent applies after each write."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.opcore.test_fair_transitions import (  # noqa: F401 (the cluster fixture)
    CAP,
    Cluster,
    cfg_of,
    cluster_fixture,
    pod,
    policy,
)

from ckptdrain.operator.apiserver import class_view
from ckptdrain.operator.bandwidth import allocation_status, rebalance

Key = tuple[str, str]


def klass(name: str, cap: str | None = None, weight: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeTier": {"root": "/mnt/ckptdrain"}}
    if cap is not None:
        spec["bandwidthCap"] = cap
    if weight is not None:
        spec["bandwidthWeight"] = weight
    return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
            "metadata": {"name": name, "creationTimestamp": "2026-11-01T00:00:00Z"},
            "spec": spec}


def classed(ns: str, name: str, cls: str | None, generation: int = 1) -> dict[str, Any]:
    body = policy(ns, name, 900, generation=generation)
    if cls:
        body["spec"]["checkpointClassName"] = cls
    return body


def beside_b(cluster: Cluster, classes_view: class_view.ClassView,
             classes: list[dict[str, Any]], **in_a: str | None) -> Any:
    """The shape most of these cases share: `classes` in the view, the policies
    `in_a` (name: class) in namespace a, and a classless B in namespace b; the
    operator's configuration. Pods are the case's own."""
    classes_view.replace(classes, "1")
    cluster.policies = {**{("a", name): [classed("a", name, cls)] for name, cls in in_a.items()},
                        ("b", "B"): [classed("b", "B", None)]}
    return cfg_of()


def status_already_says_new_budget(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The policy's own reconcile wrote its status from the new budget
    before the joint pass (policy_reconcile.py)."""
    real = allocation_status.disagrees
    monkeypatch.setattr(allocation_status, "disagrees", lambda body, sized, share: False
                        if body["metadata"]["name"] == name else real(body, sized, share))


def test_a_policy_moved_into_a_capped_class_is_cut_although_its_status_says_so(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView,
        monkeypatch: pytest.MonkeyPatch) -> None:
    no_checkpoint_classes.replace([klass("batch", cap="10M")], "1")
    cfg = cfg_of()
    cluster.policies = {("a", "A"): [classed("a", "A", None)],
                        ("b", "B"): [classed("b", "B", None)]}
    cluster.pods = {k: [pod(f"{k[1]}-0")] for k in cluster.policies}
    cluster.settle(cfg)
    cluster.worst = 0
    cluster.policies[("a", "A")] = [classed("a", "A", "batch", generation=2)]
    rebalance.changes.seen(("a", "A"), cluster.policies[("a", "A")][0])
    status_already_says_new_budget(monkeypatch, "A")
    cluster.joint(cfg)
    # Before: A's channel kept 50M (no status disagreed) while B grew to 90M.
    assert cluster.applied() == {("a", "A"): pytest.approx(10e6), ("b", "B"): pytest.approx(90e6)}
    assert cluster.worst <= CAP * 1.000001


def test_a_policy_shrunk_by_its_own_change_is_rewritten_although_its_status_says_so(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = cfg_of()
    cluster.policies = {("a", "A"): [policy("a", "A", 3.6)], ("b", "B"): [policy("b", "B", 900)]}
    cluster.pods = {k: [pod(f"{k[1]}-0")] for k in cluster.policies}
    cluster.settle(cfg)
    cluster.worst = 0
    cluster.policies[("a", "A")] = [policy("a", "A", 3.6, interval="60m", generation=2)]
    rebalance.changes.seen(("a", "A"), cluster.policies[("a", "A")][0])
    status_already_says_new_budget(monkeypatch, "A")
    cluster.joint(cfg)
    assert cluster.applied() == {("a", "A"): pytest.approx(10e6), ("b", "B"): pytest.approx(90e6)}
    assert cluster.worst <= CAP * 1.000001


def join(c: Cluster, cfg: Any, key: Key, cls: str | None = None) -> None:
    """A policy's first pod: counted, then admitted a second later."""
    c.policies[key] = [classed(*key, cls)]
    c.pods[key] = [pod(f"{key[1]}-0")]
    c.pass_of(cfg, key)
    c.now += 1.01
    c.pass_of(cfg, key)


def test_a_channel_above_its_class_cap_is_cut_before_the_scale_rises(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView) -> None:
    no_checkpoint_classes.replace([klass("batch")], "1")
    cfg = cfg_of()
    cluster.policies = {("a", "A"): [classed("a", "A", "batch")]}
    cluster.pods = {("a", "A"): [pod("A-0")]}
    cluster.settle(cfg)  # alone: its channel says 100M
    join(cluster, cfg, ("b", "B"))
    join(cluster, cfg, ("c", "C"))
    cluster.joint(cfg)  # a third each: the factor carries A's cut, its channel still says 100M
    no_checkpoint_classes.apply("MODIFIED", klass("batch", cap="40M"))
    cluster.joint(cfg)
    cluster.peak.clear()
    del cluster.pods[("b", "B")], cluster.pods[("c", "C")]
    cluster.pass_of(cfg, ("b", "B"))  # the joint pass: A alone again, under its class's 40M
    assert cluster.applied() == {("a", "A"): pytest.approx(40e6)}
    # Before: the factor rose to 1 with A's channel still at 100M.
    assert cluster.peak[("a", "A")] <= 40e6 * 1.000001


def test_an_own_pass_before_the_joint_one_does_not_grow_a_channel_its_agents_read_alone(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView) -> None:
    cfg = beside_b(cluster, no_checkpoint_classes, [klass("batch", cap="80M")],
                   A1="batch", A2="batch")
    # B's agent predates the claim: its channel alone bounds it.
    cluster.pods = {k: [pod(f"{k[1]}-0", follows_scale=k[1] != "B")] for k in cluster.policies}
    cluster.settle(cfg)
    cluster.worst = 0
    no_checkpoint_classes.apply("MODIFIED", klass("batch", cap="20M"))
    rebalance.changes.moved()  # as the class event does, before the joint pass it schedules
    cluster.pass_of(cfg, ("b", "B"))  # a pod event of B's lands first
    # Before: B's channel said 80M with A1's and A2's still at a third each.
    assert cluster.worst <= CAP * 1.000001
    cluster.joint(cfg)
    assert cluster.applied() == {("a", "A1"): pytest.approx(10e6), ("a", "A2"): pytest.approx(10e6),
                               ("b", "B"): pytest.approx(80e6)}
    assert cluster.worst <= CAP * 1.000001


def test_a_heavier_class_beside_a_lighter_policy_of_its_namespace_gets_its_whole_budget(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView) -> None:
    cfg = beside_b(cluster, no_checkpoint_classes, [klass("gold", weight=3)],
                   A1="gold", A2=None)
    cluster.pods = {k: [pod(f"{k[1]}-0")] for k in cluster.policies}
    cluster.settle(cfg)
    # Before: namespace a's factor was A2's (weight 1): A1's agents took 20M of its 60M.
    assert cluster.applied() == {("a", "A1"): pytest.approx(60e6),
                                 ("a", "A2"): pytest.approx(20e6),
                                 ("b", "B"): pytest.approx(20e6)}
    assert cluster.worst <= CAP * 1.000001


def test_a_lighter_policy_never_drains_at_a_heavier_policys_factor(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView) -> None:
    no_checkpoint_classes.replace([klass("gold", weight=3)], "1")
    cfg = cfg_of()
    cluster.policies = {("a", "A1"): [classed("a", "A1", None)],
                        ("a", "A2"): [classed("a", "A2", "gold")]}
    cluster.pods = {("a", "A1"): [pod("A1-0")]}
    cluster.settle(cfg)  # A1 alone: its channel says 100M
    join(cluster, cfg, ("a", "A2"), "gold")
    cluster.settle(cfg)
    join(cluster, cfg, ("b", "B"))
    cluster.settle(cfg)
    # Before: namespace a's factor was A2's (weight 3) while A1's channel,
    # its cut left to the factor, still said 100M: A1 drained at 75M beside
    # A2's 75M (150M), then at 60M.
    assert cluster.applied() == {("a", "A1"): pytest.approx(20e6),
                                 ("a", "A2"): pytest.approx(60e6),
                                 ("b", "B"): pytest.approx(20e6)}
    assert cluster.worst <= CAP * 1.000001


def test_a_policys_own_pass_that_drops_its_claim_does_not_raise_what_its_agents_apply(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView) -> None:
    cfg = beside_b(cluster, no_checkpoint_classes, [klass("gold", weight=3)],
                   A1=None, A2="gold")
    cluster.pods = {k: [pod(f"{k[1]}-0")] for k in cluster.policies}
    cluster.settle(cfg)  # A1 20M (namespace a's factor is its), A2 60M, B 20M
    cluster.worst = 0
    # The process's own watch of classes brings the edit before the class
    # handler tells the budgets (no change told, no joint pass asked yet).
    no_checkpoint_classes.apply("MODIFIED", klass("gold", weight=1))
    cluster.now += rebalance.REUSE_S + 1
    cluster.pass_of(cfg, ("a", "A1"))  # a third each now; A2's channel still says 60M
    # Before: A1's channel lost its claim and said 33M beside A2's 60M.
    assert cluster.worst <= CAP * 1.000001
    cluster.joint(cfg)
    assert cluster.applied() == {k: pytest.approx(CAP / 3, rel=1e-6) for k in cluster.policies}
    assert cluster.worst <= CAP * 1.000001
