"""The cluster cap holds through the moves of a fair split: after every write
the operator makes (channels and scales), what the agents would apply,
min(channel budget, claim × their namespace's factor) for admitted drainers,
adds up to no more than the cap. The bandwidth passes run as the operator
runs them (bandwidth/rebalance.py); only the apiserver and the clock are fakes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from ckptdrain.contract import share as sh
from ckptdrain.operator import config
from ckptdrain.operator.apiserver import kube, leadership
from ckptdrain.operator.bandwidth import policy_changes, rebalance, share_channel
from ckptdrain.operator.policy import allocation

CAP = 100e6
LOG = logging.getLogger("test")
Key = tuple[str, str]


class Cluster:
    """The objects the operator wrote, the pods it indexes, and a clock."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.pods: dict[Key, list[allocation.DrainingPod]] = {}
        self.policies: dict[Key, list[dict[str, Any]]] = {}
        self.worst = 0.0
        #: The most each policy's agents applied after any write.
        self.peak: dict[Key, float] = {}
        self.now = 1000.0

    def write_object(self, plural: str, namespace: str, body: dict[str, Any],
                     patch: dict[str, Any] | None = None) -> dict[str, Any]:
        key = (namespace, body["metadata"]["name"])
        old = self.objects.get(key, {}).get("spec", {})
        self.objects[key] = {"spec": {**old, **(patch or body)["spec"]}}
        applied = self.applied()
        self.worst = max(self.worst, sum(applied.values()))
        for policy_key, rate in applied.items():
            self.peak[policy_key] = max(self.peak.get(policy_key, 0.0), rate)
        return self.objects[key]

    def read_own(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((namespace, name))

    def applied(self) -> dict[Key, float]:
        """What each policy's admitted drainers take together."""
        out = {}
        for (ns, name), obj in self.objects.items():
            spec = obj["spec"]
            if name == sh.SCALE_NAME or not self.pods.get((ns, name)) \
                    or not (spec.get("activeRanks") or spec.get("activePods")):
                continue
            budget, claim = spec["budgetBytes"], spec.get("wantedBytes")
            scale = self.objects.get((ns, sh.SCALE_NAME))
            if claim is not None and scale is not None:
                budget = min(budget, claim * scale["spec"]["clusterScale"]["factor"])
            out[(ns, name)] = budget
        return out

    def pass_of(self, cfg: config.OperatorConfig, key: Key) -> None:
        """A policy's own pass, as a pod event schedules it."""
        self.now += 0.5
        rebalance.run(key, cfg, self.policies, self.pods, LOG)  # type: ignore[arg-type]

    def joint(self, cfg: config.OperatorConfig) -> None:
        self.now += 0.5
        rebalance.changes.moved()
        rebalance.rebalance_moved(cfg, self.policies, self.pods, LOG)  # type: ignore[arg-type]

    def settle(self, cfg: config.OperatorConfig) -> None:
        for _ in range(3):
            self.now += 2.0
            self.joint(cfg)
            for key in list(self.policies):
                self.pass_of(cfg, key)


def policy(ns: str, name: str, gb: float, interval: str = "15m", generation: int = 1
           ) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}",
                         "generation": generation},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "model": {"checkpointBytes": f"{gb}GB"}, "interval": interval,
                     "localTier": {"path": "/mnt/ckptdrain/nvme"},
                     "storage": {"uri": "s3://bucket/prefix"}}}


def pod(name: str, follows_scale: bool = True) -> allocation.DrainingPod:
    return allocation.DrainingPod(pod=name, pending_bytes=1e9, writer="0",
                                  follows_scale=follows_scale)


def fresh_process() -> None:
    """What a restarted operator remembers: nothing (the objects stay)."""
    share_channel.forget()
    rebalance._joint_last.clear()
    rebalance._answers.clear()
    rebalance._joint = type(rebalance._joint)()


@pytest.fixture(name="cluster")
def cluster_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    c = Cluster()
    monkeypatch.setattr(kube, "write_object", c.write_object)
    monkeypatch.setattr(kube, "read_own", c.read_own)
    monkeypatch.setattr(kube, "patch_status", lambda *a, **k: None)
    monkeypatch.setattr(kube, "post_event", lambda *a, **k: None)
    monkeypatch.setattr(rebalance.time, "monotonic", lambda: c.now)
    monkeypatch.setattr(share_channel.time, "monotonic", lambda: c.now)
    monkeypatch.setattr(rebalance._rebalances, "schedule", lambda *a, **k: None)
    monkeypatch.setattr(rebalance, "changes", policy_changes.PolicyChanges())
    leadership.STATE.set(True)
    fresh_process()
    yield c
    fresh_process()


def cfg_of(**weights: int) -> config.OperatorConfig:
    return config.OperatorConfig(allowed_root="/mnt/ckptdrain", cluster_bandwidth=CAP,
                                 bandwidth_weights=tuple(sorted(weights.items())))


def test_a_policy_that_wants_less_by_its_own_change_is_rewritten(cluster: Cluster) -> None:
    cfg = cfg_of()
    cluster.policies = {("a", "A"): [policy("a", "A", 3.6)], ("b", "B"): [policy("b", "B", 900)]}
    cluster.pods = {("a", "A"): [pod("a-0")], ("b", "B"): [pod("b-0")]}
    cluster.settle(cfg)
    assert cluster.applied() == {("a", "A"): pytest.approx(40e6), ("b", "B"): pytest.approx(60e6)}
    # A's interval 15m -> 60m: it wants 10 MB/s; the cap does not cut it, so
    # no factor says so: its channel must, before B grows into the room.
    cluster.policies[("a", "A")] = [policy("a", "A", 3.6, interval="60m", generation=2)]
    rebalance.changes.seen(("a", "A"), cluster.policies[("a", "A")][0])
    cluster.joint(cfg)
    assert cluster.applied() == {("a", "A"): pytest.approx(10e6), ("b", "B"): pytest.approx(90e6)}
    assert cluster.worst <= CAP * 1.000001


def test_new_weights_after_a_restart_never_overshoot(cluster: Cluster) -> None:
    cluster.policies = {("a", "A"): [policy("a", "A", 900)], ("b", "B"): [policy("b", "B", 900)]}
    cluster.pods = {("a", "A"): [pod("a-0")], ("b", "B"): [pod("b-0")]}
    cluster.settle(cfg_of(a=4))
    assert cluster.applied() == {("a", "A"): pytest.approx(80e6), ("b", "B"): pytest.approx(20e6)}
    fresh_process()
    cfg = cfg_of()  # a=4 dropped: equal parts now
    cluster.pass_of(cfg, ("b", "B"))  # B's pass first: it grows
    cluster.now += 1.01
    cluster.pass_of(cfg, ("b", "B"))
    cluster.settle(cfg)
    assert cluster.applied() == {("a", "A"): pytest.approx(50e6), ("b", "B"): pytest.approx(50e6)}
    assert cluster.worst <= CAP * 1.000001


def test_a_first_pod_is_counted_after_every_other_channel_shrank(cluster: Cluster) -> None:
    cfg = cfg_of()
    cluster.policies = {("a", "A"): [policy("a", "A", 900)], ("b", "B"): [policy("b", "B", 900)]}
    # B's agent does not read the scale: only a rewrite of its channel shrinks it.
    cluster.pods = {("b", "B"): [pod("b-0", follows_scale=False)]}
    cluster.settle(cfg)
    assert cluster.applied() == {("b", "B"): pytest.approx(100e6)}
    cluster.pods[("a", "A")] = [pod("a-0")]  # A was idle: its first pod
    cluster.pass_of(cfg, ("a", "A"))
    cluster.now += 1.01
    cluster.pass_of(cfg, ("a", "A"))  # A's drainer admitted
    assert cluster.applied() == {("a", "A"): pytest.approx(50e6), ("b", "B"): pytest.approx(50e6)}
    assert cluster.worst <= CAP * 1.000001


def test_channels_of_the_release_before_are_cut_not_raised_by_the_first_scale(
        cluster: Cluster) -> None:
    # What an operator that scaled every policy by one factor left: A (wants
    # 150 MB/s) at 75 and B (wants 50) at 25, their channels claiming what
    # they wanted and the scale 0.5.
    cluster.policies = {("a", "A"): [policy("a", "A", 135)], ("b", "B"): [policy("b", "B", 45)]}
    cluster.pods = {("a", "A"): [pod("a-0")], ("b", "B"): [pod("b-0")]}
    for (ns, name), budget, wanted in ((("a", "A"), 75e6, 150e6), (("b", "B"), 25e6, 50e6)):
        cluster.objects[(ns, name)] = {"spec": {
            "budgetBytes": int(budget), "wantedBytes": int(wanted), "drainers": 1,
            "activeRanks": "0", "writers": 1}}
        cluster.objects[(ns, sh.SCALE_NAME)] = {"spec": sh.scale_spec(0.5, CAP)}
    assert sum(cluster.applied().values()) == pytest.approx(100e6)
    cfg = cfg_of()
    cluster.pass_of(cfg, ("b", "B"))
    cluster.now += 1.01
    cluster.pass_of(cfg, ("b", "B"))
    cluster.settle(cfg)
    assert cluster.applied() == {("a", "A"): pytest.approx(50e6), ("b", "B"): pytest.approx(50e6)}
    assert cluster.worst <= CAP * 1.000001


def test_each_namespace_gets_its_own_factor(cluster: Cluster) -> None:
    cluster.policies = {("a", "A"): [policy("a", "A", 900)], ("b", "B"): [policy("b", "B", 900)]}
    cluster.pods = {("a", "A"): [pod("a-0")], ("b", "B"): [pod("b-0")]}
    cluster.settle(cfg_of(a=3))
    factors = {ns: cluster.objects[(ns, sh.SCALE_NAME)]["spec"]["clusterScale"]["factor"]
               for ns in ("a", "b")}
    assert factors["a"] == pytest.approx(3 * factors["b"])
    assert cluster.applied() == {("a", "A"): pytest.approx(75e6), ("b", "B"): pytest.approx(25e6)}


def test_a_class_cap_lowered_under_the_cluster_cap_rewrites_its_policies_channels(
        cluster: Cluster, no_checkpoint_classes: Any) -> None:
    """No factor says a class's cut (the factor is the cluster's level), so
    the channels of the class's policies must: left to the scale, they
    would keep draining at their old budgets, past both caps."""
    def batch(cap: str) -> dict[str, Any]:
        return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
                "metadata": {"name": "batch", "creationTimestamp": "2026-11-01T00:00:00Z"},
                "spec": {"nodeTier": {"root": "/mnt/ckptdrain"}, "bandwidthCap": cap}}

    no_checkpoint_classes.replace([batch("80M")], "1")
    cfg = cfg_of()
    classed = [("a", "A1"), ("a", "A2")]
    cluster.policies = {key: [{**policy(*key, 900), "spec": {
        **policy(*key, 900)["spec"], "checkpointClassName": "batch"}}] for key in classed}
    cluster.policies[("b", "B")] = [policy("b", "B", 900)]
    cluster.pods = {key: [pod(f"{key[1]}-0")] for key in cluster.policies}
    cluster.settle(cfg)
    third = pytest.approx(100e6 / 3)
    assert cluster.applied() == {("a", "A1"): third, ("a", "A2"): third, ("b", "B"): third}
    no_checkpoint_classes.apply("MODIFIED", batch("20M"))
    cluster.joint(cfg)  # what the class event asks for
    assert cluster.applied() == {("a", "A1"): pytest.approx(10e6),
                                 ("a", "A2"): pytest.approx(10e6),
                                 ("b", "B"): pytest.approx(80e6)}
    assert cluster.worst <= CAP * 1.000001
