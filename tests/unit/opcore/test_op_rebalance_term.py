"""operator/bandwidth/rebalance.py across a leadership hand-over: the figures of the
last joint pass are forgotten when this replica becomes active again, so a
status the other replica wrote is not judged stale against them, and the
next pass orders its shrinks and raises against budgets as they now are."""

from __future__ import annotations

from typing import Any

from ckptdrain.operator.apiserver import leadership
from ckptdrain.operator.bandwidth import rebalance


def test_a_new_term_forgets_the_last_joint_pass() -> None:
    key = ("ml", "llama")
    last: Any = ("sizing of the last pass", "cluster share of the last pass")
    rebalance._joint_last[key] = last
    try:
        leadership.STATE.set(False)
        assert rebalance._joint_last[key] == last  # standing by changes nothing
        leadership.STATE.set(True)
        assert key not in rebalance._joint_last
        body = {"status": {"conditions": [{"type": "BandwidthConstrained"}]}}
        assert not rebalance.stale(key, body)
    finally:
        rebalance._joint_last.pop(key, None)
        leadership.STATE.set(True)
