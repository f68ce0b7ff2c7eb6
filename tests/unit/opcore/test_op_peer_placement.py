"""The operator's peer placement: members from pods, the one ConfigMap per
policy, and the recovery point on the loss of any one node."""

from __future__ import annotations

import json
from typing import Any

from ckptdrain.contract.peers import ZONE_LABEL, parse
from ckptdrain.operator.peer_placement import (
    members,
    pairs_status,
    peers_configmap,
    recovery_point_on_node_loss,
)


def _pod(name: str, node: str | None, ip: str | None, created: str = "2026-01-01T00:00:00Z"
         ) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created},
            "spec": {"nodeName": node}, "status": {"podIP": ip}}


def test_members_are_scheduled_ranked_pods_with_their_zone() -> None:
    pods = [_pod("w-0", "n0", "10.1.0.5"), _pod("w-1", "n1", "fd00::7"),
            _pod("w-2", None, None), _pod("stranger", "n2", "10.1.0.9")]
    found = members(pods, {"n0": {ZONE_LABEL: "a"}, "n1": {ZONE_LABEL: "b"}},
                    {"w-0": 0, "w-1": 1, "w-2": 2}, 9109)
    assert [(m.rank, m.node, m.zone, m.address) for m in found] == [
        (0, "n0", "a", "10.1.0.5:9109"), (1, "n1", "b", "[fd00::7]:9109")]


def test_the_configmap_is_deterministic_and_readable_by_pods() -> None:
    pods = [_pod("w-0", "n0", "10.1.0.5"), _pod("w-1", "n1", "10.1.0.6")]
    found = members(pods, {}, {"w-0": 0, "w-1": 1}, 9109)
    one = peers_configmap("ml", "llama", found, None)
    assert one == peers_configmap("ml", "llama", found, None)
    view = parse(one["data"]["peers.json"].encode(), "ml/llama")
    assert view.holder_addresses(0) == ["10.1.0.6:9109"]
    assert pairs_status(json.loads(one["data"]["peers.json"])) == {"0": 1, "1": 0}


def test_recovery_point_on_node_loss_is_the_newest_step_surviving_any_one_node() -> None:
    node_of = {0: "n0", 1: "n1"}
    holder_of = {0: 1, 1: 0}
    local = {0: [30, 20], 1: [30, 20]}
    # Step 30 reached only writer 0's holder; step 20 both: 20 survives any loss.
    peer = {0: [30, 20], 1: [20]}
    assert recovery_point_on_node_loss(node_of, holder_of, local, peer, [10]) == 20
    # Without peer copies, losing a node falls back to the global step.
    assert recovery_point_on_node_loss(node_of, holder_of, local, {}, [10]) == 10
    assert recovery_point_on_node_loss(node_of, holder_of, local, {}, []) is None


def test_a_copy_on_a_holder_that_is_not_running_does_not_count() -> None:
    # Writer 1's holder (rank 2) has no pod: nobody serves its copies, so step 20
    # is lost with node n1 and only the global step 10 survives every node loss.
    node_of = {0: "n0", 1: "n1"}
    holder_of = {0: 1, 1: 2}
    local = {0: [20], 1: [20]}
    peer = {0: [20], 1: [20]}
    assert recovery_point_on_node_loss(node_of, holder_of, local, peer, [10]) == 10
