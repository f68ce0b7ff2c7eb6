"""The sizing model, pinned to numbers a reader can check by hand."""

from __future__ import annotations

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
