"""What a new job costs in writes where a namespace's policies weigh
differently (their classes' weights), and the namespace factor's rule:
the heaviest draining policy's factor, every channel claiming its own part
of it (bandwidth/share_channel.py `namespace_factors`, `claims`)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.opcore.test_fair_channel_state import beside_b, classed, klass
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
from ckptdrain.operator.bandwidth import rebalance, share_channel
from ckptdrain.operator.policy import allocation

C = int(allocation.CLAIM)


def test_a_job_joining_among_mixed_weights_rewrites_its_own_channel_only(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sh, "HEARTBEAT_S", 1e9)  # no heartbeat in the count
    no_checkpoint_classes.replace([klass("gold", weight=2)], "1")
    cfg = cfg_of()
    for i in range(60):  # 6 namespaces, half of each one's policies gold
        key = (f"n{i % 6}", f"P{i}")
        cluster.policies[key] = [classed(*key, "gold" if (i // 6) % 2 else None)]
        cluster.pods[key] = [pod(f"P{i}-0")]
    cluster.settle(cfg)
    writes: list[tuple[str, str]] = []
    real = cluster.write_object

    def count(plural: str, ns: str, body: dict[str, Any], patch: Any = None) -> Any:
        writes.append((ns, body["metadata"]["name"]))
        return real(plural, ns, body, patch)

    monkeypatch.setattr(kube, "write_object", count)
    cluster.worst = 0
    cluster.policies[("x", "NEW")] = [policy("x", "NEW", 900)]
    cluster.pods[("x", "NEW")] = [pod("NEW-0")]
    cluster.pass_of(cfg, ("x", "NEW"))
    channels = [w for w in writes if w[1] != sh.SCALE_NAME]
    # Before: every gold policy lost its claim, 31 channels rewritten.
    assert channels == [("x", "NEW")]
    assert len(writes) - len(channels) <= 7  # one scale per namespace
    assert cluster.worst <= CAP * 1.000001


def test_a_namespaces_factor_is_its_heaviest_draining_policys_and_each_claims_its_part(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView) -> None:
    no_checkpoint_classes.replace([klass("gold", weight=2), klass("heavy", weight=3)], "1")
    cfg = cfg_of()
    cluster.policies = {("a", "LIGHT"): [classed("a", "LIGHT", None)],
                        ("a", "GOLD"): [classed("a", "GOLD", "gold")],
                        ("a", "IDLE"): [classed("a", "IDLE", "heavy")],  # no pods
                        ("b", "B"): [classed("b", "B", None)]}
    cluster.pods = {k: [pod(f"{k[1]}-0")] for k in cluster.policies if k[1] != "IDLE"}
    cluster.settle(cfg)
    level = CAP / 4  # weights 1 + 2 + 1 draining
    scale = cluster.objects[("a", sh.SCALE_NAME)]["spec"]["clusterScale"]["factor"]
    assert scale == pytest.approx(2 * level / C)  # GOLD's, not LIGHT's nor IDLE's
    assert share_channel.written(("a", "GOLD"))[1] == C  # type: ignore[index]
    assert share_channel.written(("a", "LIGHT"))[1] == C // 2  # type: ignore[index]
    assert cluster.applied() == {("a", "LIGHT"): pytest.approx(level),
                                 ("a", "GOLD"): pytest.approx(2 * level),
                                 ("b", "B"): pytest.approx(level)}
    # Every claim a whole number the API keeps (int64).
    assert all(o["spec"].get("wantedBytes", 0) <= 2**63 - 1 for o in cluster.objects.values())


def test_the_heaviest_policy_starting_and_stopping_moves_its_namespaces_claims_within_the_cap(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView) -> None:
    cfg = beside_b(cluster, no_checkpoint_classes, [klass("gold", weight=3)],
                   LIGHT=None, GOLD="gold")
    cluster.pods = {("a", "LIGHT"): [pod("LIGHT-0")], ("b", "B"): [pod("B-0")]}
    cluster.settle(cfg)  # half each; LIGHT claims C
    cluster.worst = 0
    cluster.pods[("a", "GOLD")] = [pod("GOLD-0")]
    cluster.pass_of(cfg, ("a", "GOLD"))
    cluster.now += 1.01
    cluster.settle(cfg)
    assert share_channel.written(("a", "LIGHT"))[1] == int(C / 3)  # type: ignore[index]
    assert cluster.applied() == {("a", "LIGHT"): pytest.approx(20e6),
                                 ("a", "GOLD"): pytest.approx(60e6),
                                 ("b", "B"): pytest.approx(20e6)}
    del cluster.pods[("a", "GOLD")]
    cluster.pass_of(cfg, ("a", "GOLD"))
    cluster.settle(cfg)
    assert share_channel.written(("a", "LIGHT"))[1] == C  # type: ignore[index]
    assert cluster.applied() == {("a", "LIGHT"): pytest.approx(50e6),
                                 ("b", "B"): pytest.approx(50e6)}
    assert cluster.worst <= CAP * 1.000001


def test_a_lighter_policys_own_pass_takes_its_namespaces_scale_as_it_is(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sh, "HEARTBEAT_S", 1e9)
    cfg = beside_b(cluster, no_checkpoint_classes, [klass("gold", weight=2)],
                   LIGHT=None, GOLD="gold")
    cluster.pods = {k: [pod(f"{k[1]}-0")] for k in cluster.policies}
    cluster.settle(cfg)
    asked: list[int] = []
    real = rebalance.budgets
    monkeypatch.setattr(rebalance, "budgets", lambda *a, **k: asked.append(1) or real(*a, **k))
    cluster.pass_of(cfg, ("a", "LIGHT"))
    # Its own factor is not its namespace's (GOLD's), yet the scale in place
    # is at its level: no pass over every policy to choose it again.
    assert asked == []
    assert share_channel.written(("a", "LIGHT"))[1] == C // 2  # type: ignore[index]
