"""A joint pass against the passes around it: a policy's own pass running
on another worker while the joint pass writes its shrinking channels, a
namespace whose scale could not be written, and whether the joint pass
marks the changes it covered (bandwidth/rebalance.py, policy_changes.py).
The Cluster harness of test_fair_transitions.py computes what every agent
applies after each write."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.opcore.test_fair_channel_state import (
    beside_b,
    classed,
    join,
    klass,
    status_already_says_new_budget,
)
from tests.unit.opcore.test_fair_transitions import (  # noqa: F401 (the cluster fixture)
    CAP,
    Cluster,
    cfg_of,
    cluster_fixture,
    pod,
    policy,
)

from ckptdrain.contract import share as sh
from ckptdrain.operator.apiserver import class_view, kube
from ckptdrain.operator.bandwidth import rebalance


def test_an_own_pass_during_the_joint_pass_holds_until_the_shrinks_are_out(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView,
        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = beside_b(cluster, no_checkpoint_classes, [klass("batch", cap="80M")],
                   A1="batch", A2="batch")
    # B's agent reads no claim: its channel's budget is all it applies.
    cluster.pods = {k: [pod(f"{k[1]}-0", follows_scale=k[1] != "B")] for k in cluster.policies}
    cluster.settle(cfg)  # A1 40M, A2 40M, B 20M
    cluster.worst = 0
    no_checkpoint_classes.apply("MODIFIED", klass("batch", cap="20M"))
    rebalance.changes.moved()
    real, seen = cluster.write_object, []

    def write(plural: str, ns: str, body: dict[str, Any], patch: Any = None) -> Any:
        out = real(plural, ns, body, patch)
        if body["metadata"]["name"] == "A1" and not seen:
            # The joint pass has cut A1, not yet A2: B's own pass runs now
            # on another worker.
            seen.append(rebalance.changes.joint_pending())
            cluster.pass_of(cfg, ("b", "B"))
        return out

    monkeypatch.setattr(kube, "write_object", write)
    cluster.joint(cfg)
    assert seen == [True]  # mid-pass, the change is not yet covered
    # Before: B's own pass wrote 80M beside A2's 40M (123M against 100M).
    assert cluster.worst <= CAP * 1.000001
    assert not rebalance.changes.joint_pending()  # the finished pass covered it
    cluster.settle(cfg)
    assert cluster.applied() == {("a", "A1"): pytest.approx(10e6),
                                 ("a", "A2"): pytest.approx(10e6),
                                 ("b", "B"): pytest.approx(80e6)}


def _scale_write_fails(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, ns: str) -> None:
    real = cluster.write_object

    def write(plural: str, namespace: str, body: dict[str, Any], patch: Any = None) -> Any:
        if body["metadata"]["name"] == sh.SCALE_NAME and namespace == ns:
            raise RuntimeError("apiserver unavailable")
        return real(plural, namespace, body, patch)

    monkeypatch.setattr(kube, "write_object", write)


def test_a_namespace_whose_scale_was_not_written_has_its_channels_cut(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = cfg_of()
    cluster.policies = {("a", "A"): [policy("a", "A", 900)], ("b", "B"): [policy("b", "B", 900)]}
    cluster.pods = {k: [pod(f"{k[1]}-0")] for k in cluster.policies}
    cluster.settle(cfg)  # half each, both channels carrying a claim
    cluster.worst = 0
    _scale_write_fails(cluster, monkeypatch, "a")
    status_already_says_new_budget(monkeypatch, "A")
    join(cluster, cfg, ("c", "C"))
    cluster.now += 1.01
    cluster.pass_of(cfg, ("c", "C"))
    # Before: A's channel was left at 50M with its claim, as if the factor
    # a third could not be written carried its cut (116.7M against 100M).
    assert cluster.worst <= CAP * 1.000001
    assert cluster.applied() == {k: pytest.approx(CAP / 3, rel=1e-6) for k in cluster.policies}


def test_an_own_pass_holds_at_what_the_claim_and_the_scale_let_its_agents_apply(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView) -> None:
    no_checkpoint_classes.replace([klass("gold", weight=1)], "1")
    cfg = cfg_of()
    cluster.policies = {("a", "A"): [classed("a", "A", "gold")]}
    cluster.pods = {("a", "A"): [pod("A-0")]}
    cluster.settle(cfg)  # A's channel says the whole cap, with its claim
    # B's agent reads no claim; then C joins: A is cut to a third by the
    # scale alone, its channel still saying 100M.
    cluster.policies[("b", "B")] = [classed("b", "B", None)]
    cluster.pods[("b", "B")] = [pod("B-0", follows_scale=False)]
    cluster.pass_of(cfg, ("b", "B"))
    cluster.now += 1.01
    cluster.pass_of(cfg, ("b", "B"))
    join(cluster, cfg, ("c", "C"))
    cluster.joint(cfg)
    assert cluster.applied() == {k: pytest.approx(CAP / 3, rel=1e-6) for k in cluster.policies}
    cluster.worst = 0
    # gold now weighs 2: A's own pass, before the joint one, may hold it at
    # claim × the scale's factor (a third), not at its channel's 100M.
    no_checkpoint_classes.apply("MODIFIED", klass("gold", weight=2))
    rebalance.changes.moved()
    cluster.pass_of(cfg, ("a", "A"))
    assert cluster.applied()[("a", "A")] == pytest.approx(CAP / 3, rel=1e-6)
    assert cluster.worst <= CAP * 1.000001
