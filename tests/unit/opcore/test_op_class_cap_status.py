"""A CheckpointClass's spec.bandwidthCap as the operator reads it and as a
policy's status tells it: the class reader refuses what the CRD refuses,
naming the field; BandwidthConstrained names the class and its cap where
that cap cuts the policy (ClassCap), the cluster cap where that one does
(ClusterCap); the cap reaches the joint split from the classes the operator
holds, and an edit of it asks for a joint pass."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.apiserver import class_view
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.policy import allocation, classes, status
from ckptdrain.operator.policy.class_shares import ClassCap
from ckptdrain.sizing import SizingInput

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _class(name: str = "gold", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
            "metadata": {"name": name, "creationTimestamp": "2026-11-01T00:00:00Z"},
            "spec": {"nodeTier": {"root": "/mnt/ckptdrain"}, **spec}}


@pytest.mark.parametrize(("cap", "bps"), [(10_000_000_000, 1e10), ("10G", 1e10),
                                          ("1.25Gi", 1.25 * 2**30), ("2.5", 2.5)])
def test_a_class_cap_is_read_in_bytes_per_second(cap: object, bps: float) -> None:
    assert classes.read(_class(bandwidthCap=cap)).bandwidth_cap == pytest.approx(bps)
    assert classes.read(_class()).bandwidth_cap is None


@pytest.mark.parametrize("cap", [0, -1, "0G", "0.0", "0.5", "0.0009k", "10000000000",
                                 "10GB/s", "1e9", 1.5, False, {"G": 10}])
def test_a_bad_class_cap_makes_the_class_invalid_naming_the_field(cap: object) -> None:
    with pytest.raises(classes.ClassInvalid) as invalid:
        classes.read(_class(bandwidthCap=cap, bandwidthWeight=0))
    fields = [e.field for e in invalid.value.errors]
    assert fields == ["spec.bandwidthWeight", "spec.bandwidthCap"]  # every problem named
    assert "CheckpointClass gold" in str(invalid.value) and "above zero" in str(invalid.value)


def ten_gbps() -> SizingInput:
    # 900 GB every 15 min at 10% overlap: 10 GB/s.
    return SizingInput(checkpoint_bytes=900e9, interval_s=900, overlap=0.1)


def constrained(st: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == status.CONSTRAINED)


def statuses(cluster_cap: float | None, counted: set[str] | None = None,
             ) -> dict[str, dict[str, Any]]:
    gold = ClassCap("gold", 8e9)
    joint = allocation.joint_sizing({"a": ten_gbps(), "b": ten_gbps(), "c": ten_gbps()},
                                    cluster_cap, counted, classes={"a": gold, "b": gold})
    return {k: status.for_sizing(s, 1, NOW, cluster=share) for k, (s, share) in joint.items()}


def test_a_policy_its_class_cap_cuts_says_so_naming_the_class_and_its_cap() -> None:
    got = statuses(None)
    a = constrained(got["a"])
    assert a["status"] == "True" and a["reason"] == "ClassCap"
    assert a["message"].startswith(
        "the cap of CheckpointClass gold (spec.bandwidthCap 8.00 GB/s, for its policies "
        "together), split fairly (equal weights) with 1 other policy of the class with pods "
        "wanting 10.0 GB/s together, allows 4.00 GB/s of the 10.0 GB/s required")
    assert got["a"]["phase"] == "Constrained"
    assert constrained(got["c"])["reason"] == "WithinCaps"


def test_where_the_cluster_cap_cuts_harder_it_is_the_cluster_cap_that_is_named() -> None:
    got = statuses(9e9)  # 3 GB/s each: under the class's 4
    for key in "abc":
        assert constrained(got[key])["reason"] == "ClusterCap"
        assert constrained(got[key])["message"].startswith("the cluster cap of 9.00 GB/s")


def test_an_idle_policy_of_a_capped_class_is_told_it_takes_no_part_yet() -> None:
    got = statuses(None, counted={"a", "c"})
    a = constrained(got["a"])  # the class's only policy with pods: its whole cap
    assert a["reason"] == "ClassCap" and "together) allows 8.00 GB/s" in a["message"]
    b = constrained(got["b"])  # once its pod runs, the two share it
    assert b["reason"] == "ClassCap" and "allows 4.00 GB/s" in b["message"]
    assert b["message"].endswith("no pod of it runs, so it takes no part of its class's cap "
                                 "yet: these are its figures once one does")


def _hungry(ns: str, name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "uid": f"u-{name}", "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "model": {"checkpointBytes": "900GB"}, "interval": "15m",
                     "localTier": {"path": "/mnt/ckptdrain/nvme"},
                     "storage": {"uri": "s3://bucket/prefix"}, **spec}}


def test_the_class_cap_reaches_the_split_and_its_edit_asks_for_a_joint_pass(
        no_checkpoint_classes: class_view.ClassView, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptdrain.operator import class_events

    cfg = config.OperatorConfig(allowed_root="/mnt/ckptdrain", cluster_bandwidth=2e9)
    policies = {("a", "A"): [_hungry("a", "A", checkpointClassName="gold")],
                ("a", "A2"): [_hungry("a", "A2", checkpointClassName="gold")],
                ("b", "B"): [_hungry("b", "B")]}
    pods = {key: [object()] for key in policies}

    def parts() -> dict[tuple[str, str], float]:
        return {key: budget[1].budget for key, budget in
                rebalance.budgets(cfg, policies, pods).items()}  # type: ignore[arg-type]

    scheduled: list[Any] = []
    monkeypatch.setattr(rebalance, "schedule", lambda key, *a, **k: scheduled.append(key))
    monkeypatch.setattr(class_events.leadership, "active", lambda: True)
    monkeypatch.setattr(class_events, "_bandwidth_seen", None)
    monkeypatch.setattr(class_events, "_class_statuses", lambda logger: None)  # no apiserver
    monkeypatch.setattr(class_events, "start_recheck", lambda *a: None)  # no thread here
    class_event = class_event_handler(cfg, pods)

    class_event(_class(bandwidthCap="500M"))
    assert parts() == {("a", "A"): pytest.approx(250e6), ("a", "A2"): pytest.approx(250e6),
                       ("b", "B"): pytest.approx(1.5e9)}  # what the class leaves
    assert scheduled[-1] == rebalance.JOINT
    scheduled.clear()
    class_event(_class(bandwidthCap="500M"))  # the same cap again: nothing moved
    assert scheduled == []
    class_event(_class(bandwidthCap="1G"))
    assert scheduled == [rebalance.JOINT]
    assert parts()[("b", "B")] == pytest.approx(1e9)


def class_event_handler(cfg: config.OperatorConfig, pods: dict[Any, Any]
                        ) -> Callable[[dict[str, Any]], None]:
    """The operator's class event handler, called as Kopf calls it on a
    MODIFIED class, with empty indexes but the pods given."""
    from ckptdrain.operator import class_events

    kwargs = {name: {} for name in class_events.INDEXES} | {
        "checkpointpolicy_index": {}, "pod_index": pods}

    def class_event(body: dict[str, Any]) -> None:
        class_events.checkpointclass_event(
            event={"type": "MODIFIED", "object": body},  # type: ignore[arg-type]
            memo=SimpleNamespace(config=cfg), logger=logging.getLogger("test"),  # type: ignore[arg-type]
            **kwargs)
    return class_event
