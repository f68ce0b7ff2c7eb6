"""operator/policy/status.py built from the joint allocation (allocation.joint_sizing):
BandwidthConstrained tells what each policy gets under the cluster cap as it
is applied to every policy together, not what it would get alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ckptdrain.operator.policy import allocation, status
from ckptdrain.sizing import SizingInput

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
CAP = 40e9


def ten_gbps(name: str = "p") -> SizingInput:
    # 900 GB every 15 min at 10% overlap: 10 GB/s, alone well under the 40 GB/s cap
    return SizingInput(checkpoint_bytes=900e9, interval_s=900, overlap=0.1, cluster_cap=CAP)


def cond(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == kind)


def joint_status(count: int) -> dict[str, dict[str, Any]]:
    joint = allocation.joint_sizing({f"p{i}": ten_gbps() for i in range(count)}, CAP)
    return {k: status.for_sizing(s, 1, NOW, cluster=share) for k, (s, share) in joint.items()}


def test_ten_policies_under_a_40_gbps_cap_each_report_the_cluster_cap() -> None:
    got = joint_status(10)
    assert len(got) == 10
    for st in got.values():
        c = cond(st, "BandwidthConstrained")
        assert st["phase"] == "Constrained"
        assert c["status"] == "True" and c["reason"] == "ClusterCap"
        assert st["allowedBandwidth"] == "4.00 GB/s" and st["requiredBandwidth"] == "10.0 GB/s"
        assert st["effectiveOverlap"] == "25%"
        assert "40.0 GB/s" in c["message"] and "9 other policies" in c["message"]
        assert "wanting 90.0 GB/s together" in c["message"]
        assert "4.00 GB/s of the 10.0 GB/s" in c["message"]


def test_four_policies_that_fit_together_are_within_caps() -> None:
    for st in joint_status(4).values():
        assert st["phase"] == "Ready"
        assert cond(st, "BandwidthConstrained")["reason"] == "WithinCaps"
        assert st["allowedBandwidth"] == "10.0 GB/s"


def test_a_new_policy_moves_the_others_into_constrained_and_back() -> None:
    before = joint_status(4)["p0"]
    joint = allocation.joint_sizing({f"p{i}": ten_gbps() for i in range(5)}, CAP)
    later = NOW + timedelta(minutes=5)
    patch = status.with_cluster(before, *joint["p0"], 1, later)
    assert patch is not None and patch["phase"] == "Constrained"
    assert patch["allowedBandwidthBytes"] == 8_000_000_000
    c = cond(patch, "BandwidthConstrained")
    assert c["reason"] == "ClusterCap" and c["lastTransitionTime"] == "2026-01-02T03:09:05Z"
    assert [x["type"] for x in patch["conditions"]] == [x["type"] for x in before["conditions"]]
    # applied, the same allocation asks for nothing more
    assert status.with_cluster({**before, **patch}, *joint["p0"], 1, later) is None
    back = allocation.joint_sizing({f"p{i}": ten_gbps() for i in range(4)}, CAP)
    undo = status.with_cluster({**before, **patch}, *back["p0"], 1, later)
    assert undo is not None and undo["phase"] == "Ready"
    assert cond(undo, "BandwidthConstrained")["reason"] == "WithinCaps"


def test_a_stalled_policy_keeps_its_phase_when_the_cluster_moves() -> None:
    stalled = {**joint_status(4)["p0"], "phase": "Stalled"}
    joint = allocation.joint_sizing({f"p{i}": ten_gbps() for i in range(10)}, CAP)
    patch = status.with_cluster(stalled, *joint["p0"], 1, NOW)
    assert patch is not None and patch["phase"] == "Stalled"
    assert cond(patch, "BandwidthConstrained")["status"] == "True"


def test_an_invalid_or_unsized_policy_gets_no_cluster_patch() -> None:
    joint = allocation.joint_sizing({"p0": ten_gbps()}, CAP)
    assert status.with_cluster(status.for_invalid("x", 1, NOW), *joint["p0"], 1, NOW) is None
    assert status.with_cluster({}, *joint["p0"], 1, NOW) is None
