"""What a class's cap tells beyond the split itself: an idle policy's
prospective sharers, the in-class weights in the message, a reconcile's
freshly parsed policy under its class's cap, a class edit reaching a
policy's own pass, and the CRD's spelling of spec.bandwidthCap."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.unit.opcore.test_op_class_cap_status import (
    NOW,
    _class,
    _hungry,
    class_event_handler,
    constrained,
)

from ckptdrain.operator import class_events, config
from ckptdrain.operator.apiserver import class_view
from ckptdrain.operator.bandwidth import answer_memo, policy_changes, rebalance
from ckptdrain.operator.policy import allocation, class_bandwidth, status
from ckptdrain.operator.policy.class_shares import ClassCap
from ckptdrain.sizing import SizingInput

CRD = Path(__file__).resolve().parents[3] / "crds" / "checkpointclasses.yaml"


def ten_gbps() -> SizingInput:
    return SizingInput(checkpoint_bytes=900e9, interval_s=900, overlap=0.1)


def message(joint: dict[str, Any], key: str) -> str:
    sized, share = joint[key]
    return str(constrained(status.for_sizing(sized, 1, NOW, cluster=share))["message"])


def test_an_idle_policy_is_told_whom_it_will_share_its_class_cap_with() -> None:
    gold = ClassCap("gold", 8e9)
    joint = allocation.joint_sizing({"a": ten_gbps(), "b": ten_gbps()}, None, {"a"},
                                    classes={"a": gold, "b": gold})
    assert "split fairly (equal weights) with 1 other policy of the class with pods " \
        "wanting 10.0 GB/s together, allows 4.00 GB/s" in message(joint, "b")


def test_the_class_cap_message_names_the_weights_within_the_class() -> None:
    gold = ClassCap("gold", 8e9)
    joint = allocation.joint_sizing({"a": ten_gbps(), "b": ten_gbps()}, None,
                                    weights={"a": 3, "b": 1}, classes={"a": gold, "b": gold})
    assert "split fairly (weight 3 of 4) with 1 other policy of the class" in message(joint, "a")
    assert "allows 6.00 GB/s" in message(joint, "a")


@pytest.fixture
def wired(no_checkpoint_classes: class_view.ClassView, monkeypatch: pytest.MonkeyPatch
          ) -> Any:
    """A class event's handler with no apiserver, and the budgets' memo fresh."""
    monkeypatch.setattr(rebalance, "schedule", lambda *a, **k: None)
    monkeypatch.setattr(rebalance, "changes", policy_changes.PolicyChanges())
    monkeypatch.setattr(rebalance, "_answers", answer_memo.AnswerMemo())
    monkeypatch.setattr(class_events.leadership, "active", lambda: True)
    monkeypatch.setattr(class_events, "_bandwidth_seen", None)
    monkeypatch.setattr(class_events, "_class_statuses", lambda logger: None)
    monkeypatch.setattr(class_events, "start_recheck", lambda *a: None)
    cfg = config.OperatorConfig(allowed_root="/mnt/ckptdrain", cluster_bandwidth=2e9)
    policies = {("a", "A"): [_hungry("a", "A", checkpointClassName="gold")],
                ("b", "B"): [_hungry("b", "B")]}
    pods = {key: [object()] for key in policies}
    class_event = class_event_handler(cfg, pods)

    return cfg, policies, pods, class_event


def test_a_class_edit_reaches_a_policys_own_pass_that_reuses_the_last_answer(
        wired: Any) -> None:
    cfg, policies, pods, class_event = wired
    class_event(_class(bandwidthCap="500M"))
    assert rebalance.budget_of(cfg, policies, pods, ("b", "B"))[("b", "B")][1].budget \
        == pytest.approx(1.5e9)
    class_event(_class(bandwidthCap="1G"))
    assert rebalance.budget_of(cfg, policies, pods, ("b", "B"))[("b", "B")][1].budget \
        == pytest.approx(1e9)


def test_a_reconcile_sizes_its_freshly_parsed_policy_under_its_class_cap(wired: Any) -> None:
    cfg, policies, pods, class_event = wired
    class_event(_class(bandwidthCap="500M"))
    key = ("a", "A")
    fresh = {key: rebalance.parse_policy(cfg, policies[key][0], 1)}
    sized, share, _ = rebalance.budgets(cfg, policies, pods, fresh=fresh)[key]
    assert sized.allowed_bandwidth == pytest.approx(500e6)
    assert share.class_bound and share.class_part is not None
    got = status.for_sizing(sized, 1, NOW, cluster=share)
    assert constrained(got)["reason"] == "ClassCap"


def test_the_crds_bandwidth_cap_pattern_is_the_parsers() -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    field = spec["properties"]["bandwidthCap"]
    assert field["pattern"] == class_bandwidth.CAP_PATTERN
    assert re.fullmatch(field["pattern"], "10G")


def test_an_idle_policy_the_cluster_cap_cuts_is_told_of_the_cluster_cap_not_its_class() -> None:
    gold = ClassCap("gold", 8e9)  # 4 GB/s each in the class: the cluster's 3 cuts harder
    joint = allocation.joint_sizing({"a": ten_gbps(), "b": ten_gbps(), "c": ten_gbps()},
                                    9e9, {"b", "c"}, classes={"a": gold, "b": gold})
    sized, share = joint["a"]
    got = constrained(status.for_sizing(sized, 1, NOW, cluster=share))
    assert got["reason"] == "ClusterCap"
    assert got["message"].endswith("no pod of it runs, so it takes no part of the cluster cap "
                                   "yet: these are its figures once one does")


def test_the_cluster_cap_message_counts_the_others_at_what_their_class_leaves_them() -> None:
    gold = ClassCap("gold", 4e9)  # a and b: 2 GB/s each; c and d share the 16 left
    joint = allocation.joint_sizing({k: ten_gbps() for k in "abcd"}, 20e9,
                                    classes={"a": gold, "b": gold})
    assert "split fairly (equal weights) with 3 other policies with pods wanting 14.0 GB/s " \
        "together once their classes' caps cut them, allows 8.00 GB/s" in message(joint, "c")
