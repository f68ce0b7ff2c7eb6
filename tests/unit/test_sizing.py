"""The sizing model, pinned to numbers a reader can check by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ckptdrain import sizing
from ckptdrain.errors import InvalidInput


def test_405b_at_15m_and_10pct_needs_63_gb_per_s_exactly() -> None:
    s = sizing.compute(sizing.SizingInput(parameters=405e9, interval_s=900, overlap=0.1))
    assert s.checkpoint_bytes == 405e9 * 14 == 5.67e12
    assert s.required_bandwidth == pytest.approx(63e9, rel=1e-12)  # not 631 GB/s
    assert s.drain_seconds == pytest.approx(90)
    assert not s.bandwidth_constrained and s.effective_overlap == pytest.approx(0.1)


def test_interval_from_mtti_and_young_daly() -> None:
    s = sizing.compute(sizing.SizingInput(parameters=175e9, mtti_s=150 * 60, local_write_s=30))
    assert s.local_interval_s == pytest.approx(900)  # a tenth of MTTI
    assert s.young_daly_interval_s == pytest.approx(math.sqrt(2 * 30 * 9000))
    assert s.goodput is not None and 0 < s.goodput < 1


def test_global_every_stretches_the_interval() -> None:
    s = sizing.compute(sizing.SizingInput(parameters=405e9, interval_s=900, global_every=4))
    assert s.global_interval_s == 3600
    assert s.required_bandwidth == pytest.approx(63e9 / 4)


def test_binding_cap_reports_the_overlap_that_results() -> None:
    s = sizing.compute(sizing.SizingInput(parameters=405e9, interval_s=900, overlap=0.1,
                                          policy_cap=30e9, cluster_cap=21e9, drainers=3))
    assert s.bandwidth_constrained and s.binding_cap == "cluster"
    assert s.allowed_bandwidth == 21e9
    assert s.effective_overlap == pytest.approx(0.3)  # 5.67 TB / 21 GB/s = 270 s of 900 s
    assert s.per_drainer_bandwidth == pytest.approx(7e9)


def test_loose_cap_does_not_bind() -> None:
    s = sizing.compute(sizing.SizingInput(parameters=405e9, interval_s=900, policy_cap=100e9))
    assert not s.bandwidth_constrained and s.allowed_bandwidth == pytest.approx(63e9)


@pytest.mark.parametrize(("inp", "field"), [
    (sizing.SizingInput(interval_s=900), "model"),
    (sizing.SizingInput(parameters=1e9), "interval"),
    (sizing.SizingInput(parameters=-1, interval_s=900), "parameters"),
    (sizing.SizingInput(parameters=1e9, interval_s=900, overlap=2), "overlap"),
    (sizing.SizingInput(parameters=1e9, interval_s=900, drainers=0), "drainers"),
])
def test_bad_input_names_the_field(inp: sizing.SizingInput, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        sizing.compute(inp)
    assert err.value.field == field


def test_peer_bandwidth_is_the_model_with_the_local_interval_per_writer() -> None:
    from ckptdrain.sizing import peer_bandwidth

    # 405B × 14 B = 5.67 TB over 1,000 writers, local interval 5 min, overlap 10%:
    # each writer sends 5.67 GB within 30 s = 189 MB/s.
    assert peer_bandwidth(5.67e12, 300, 0.1, writers=1000) == pytest.approx(189e6)
    with pytest.raises(InvalidInput, match="writers"):
        peer_bandwidth(1e9, 300, 0.1, writers=0)


# The GKE example (docs/examples/policy-gke-gcs.yaml): 70B, local every 5 min,
# every 4th global (20 min), overlap 10% (a 2 min drain), MTTI 150 min.
GKE = sizing.SizingInput(parameters=70e9, interval_s=300, global_every=4, mtti_s=9000)


def test_goodput_restores_locally_when_the_nodes_survive_and_globally_when_one_is_lost() -> None:
    s = sizing.compute(GKE)
    assert s.drain_seconds == pytest.approx(120)
    # Every node intact: the newest local step, half a local interval lost.
    assert s.lost_work_node_intact_s == pytest.approx(150)
    # A node lost, no peer tier: the newest global step, half a global
    # interval lost plus the drain that made it global.
    assert s.node_loss_restores_from == "global"
    assert s.lost_work_node_lost_s == pytest.approx(600 + 120)
    assert s.lost_work_per_interruption_s == pytest.approx(0.95 * 150 + 0.05 * 720)
    assert s.goodput == pytest.approx(1 - 178.5 / 9000)  # 98.0%


def test_goodput_with_the_peer_tier_restores_a_lost_node_from_its_partners_copy() -> None:
    s = sizing.compute(dataclasses.replace(GKE, peer_tier=True))
    # Half a local interval plus the replication (10% of it) to the partner.
    assert s.node_loss_restores_from == "peer"
    assert s.lost_work_node_lost_s == pytest.approx(150 + 30)
    assert s.goodput == pytest.approx(1 - (0.95 * 150 + 0.05 * 180) / 9000)
    assert s.goodput > sizing.compute(GKE).goodput  # type: ignore[operator]


def test_goodput_weighs_the_two_cases_by_the_node_loss_fraction() -> None:
    every_node_lost = sizing.compute(dataclasses.replace(GKE, node_loss_fraction=1.0))
    none_lost = sizing.compute(dataclasses.replace(GKE, node_loss_fraction=0.0))
    assert every_node_lost.lost_work_per_interruption_s == pytest.approx(720)
    assert none_lost.lost_work_per_interruption_s == pytest.approx(150)
    with pytest.raises(InvalidInput, match="nodeLossFraction"):
        sizing.compute(dataclasses.replace(GKE, node_loss_fraction=1.5))
