"""The operator's peer placement: members from pods, the one ConfigMap per
policy, and the recovery point on the loss of any one node."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from ckptdrain.contract.peers import ZONE_LABEL, parse
from ckptdrain.operator.peers import certs as peer_certs
from ckptdrain.operator.peers.placement import (
    ca_from_secret_data,
    ca_store_secret,
    members,
    pairs_status,
    peer_status,
    peers_configmap,
    pods_secret,
    publish,
    rank_of,
    recovery_on_node_loss,
    recovery_point_on_node_loss,
    status_when_off,
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


# -- what the operator's handlers call ---------------------------------------------

NOW = datetime(2026, 11, 26, tzinfo=UTC)
OWNER = {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointPolicy",
         "name": "llama", "uid": "u-1"}


def _labelled(name: str, writer: str | None) -> dict[str, Any]:
    labels = {} if writer is None else {"ckptdrain.io/writer": writer}
    return {"metadata": {"name": name, "labels": labels}}


def test_ranks_come_from_the_writer_label_and_only_valid_ones_count() -> None:
    pods = [_labelled("a", "0"), _labelled("b", "3"), _labelled("c", "4"),
            _labelled("d", "x"), _labelled("e", "²"), _labelled("f", None)]
    assert rank_of(pods, 4) == {"a": 0, "b": 3}
    # One writer: rank 0 without a label (the webhook sets none then).
    assert rank_of([_labelled("solo", None)], 1) == {"solo": 0}


def test_the_pods_secret_never_holds_the_ca_key() -> None:
    material = peer_certs.new_material("ml/llama", NOW)
    pods = pods_secret("ml", "llama", material, OWNER)
    assert pods["metadata"]["name"] == "llama-ckptdrain-peer"
    assert sorted(pods["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    assert pods["type"] == "kubernetes.io/tls"
    assert pods["metadata"]["ownerReferences"] == [OWNER]
    assert pods["metadata"]["labels"] == {"ckptdrain.io/policy": "llama"}
    for key, value in pods["data"].items():
        assert base64.b64decode(value) == material[key]


def test_the_ca_is_kept_by_policy_uid_and_read_back() -> None:
    ca = peer_certs.new_ca("ml/llama", NOW)
    kept = ca_store_secret("ckptdrain", "u-1", "ml/llama", ca)
    assert kept["metadata"]["name"] == "ckptdrain-peer-ca-u-1"
    assert kept["metadata"]["namespace"] == "ckptdrain"
    assert kept["metadata"]["labels"] == {"ckptdrain.io/peer-ca-for": "u-1"}
    assert "ownerReferences" not in kept["metadata"]  # not across namespaces
    assert ca_from_secret_data(kept["data"]) == ca
    assert ca_from_secret_data({"ca.crt": kept["data"]["ca.crt"]}) is None
    assert ca_from_secret_data({"ca.crt": "!!", "ca.key": "!!"}) is None
    assert ca_from_secret_data(None) is None


def test_incomplete_material_is_refused() -> None:
    material = peer_certs.new_material("ml/llama", NOW)
    del material["tls.key"]
    with pytest.raises(ValueError, match=r"tls\.key"):
        pods_secret("ml", "llama", material)
    with pytest.raises(ValueError, match=r"ca\.key"):
        ca_store_secret("ckptdrain", "u-1", "ml/llama", {"ca.crt": b"x"})


def _doc(*entries: tuple[int, str, int | None]) -> dict[str, Any]:
    return {"policy": "ml/llama", "writers": {
        str(r): {"node": n, "zone": None, "address": f"10.0.0.{r}:9109", "holder": h,
                 "previousHolder": None} for r, n, h in entries}}


@pytest.mark.parametrize(("doc", "expected", "error", "reason", "paired"), [
    (_doc((0, "n0", 1), (1, "n1", 0)), 2, None, "Paired", 2),
    (_doc((0, "n0", 1), (1, "n1", 0)), 4, None, "Partial", 2),
    (_doc((0, "n0", None), (1, "n0", None)), 2, None, "NoPartner", 0),
    (_doc((0, "n0", None)), 1, None, "NoPartner", 0),
    (_doc(), 2, None, "NoWriters", 0),
    (_doc((0, "n0", 1), (1, "n1", 0)), 2, "forbidden: secrets", "CredentialsFailed", 2),
])
def test_the_status_says_whether_every_writer_is_paired(
        doc: dict[str, Any], expected: int, error: str | None, reason: str,
        paired: int) -> None:
    status = peer_status("llama", doc, expected, error)
    assert (status["reason"], status["paired"], status["enabled"]) == (reason, paired, True)
    assert status["configMap"] == "llama-ckptdrain-peers"
    assert status["secret"] == "llama-ckptdrain-peer"
    if error:
        assert status["message"] == error


def test_the_status_lists_each_writer_and_its_holder() -> None:
    status = peer_status("llama", _doc((0, "n0", 1), (1, "n1", 0), (2, "n1", None)), 3)
    assert status["pairs"] == [{"writer": 0, "holder": 1}, {"writer": 1, "holder": 0},
                               {"writer": 2}]
    assert (status["reason"], status["writers"], status["paired"]) == ("Partial", 3, 2)


def _record(step: int, claims: dict[str, tuple[str, list[str]]], writers: int = 2,
            expired: bool = False, holders: dict[str, int] | None = None,
            **extra: Any) -> dict[str, Any]:
    """Claims as agents make them: from node n<writer>, naming the holder of
    a peer copy (by default PAIRED's: 0 and 1 hold each other's)."""
    holders = {"0": 1, "1": 0} if holders is None else holders
    status: dict[str, Any] = {"writers": {
        w: {"state": state, "tiers": tiers, "node": f"n{w}",
            **({"peerHolder": holders[w], "peerNode": f"n{holders[w]}"}
               if "peer" in tiers and w in holders else {}),
            **extra} for w, (state, tiers) in claims.items()}}
    if expired:
        status["state"] = "Expired"
    return {"metadata": {"name": f"llama-s{step}"},
            "spec": {"policy": "llama", "step": step, "writers": writers}, "status": status}


PAIRED = _doc((0, "n0", 1), (1, "n1", 0))


def test_from_records_a_step_both_partners_hold_survives_any_node() -> None:
    recs = [_record(10, {"0": ("Global", ["global", "local"]),
                         "1": ("Global", ["global", "local"])}),
            _record(20, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local", "peer"])}),
            _record(30, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local"])})]
    assert recovery_on_node_loss(PAIRED, recs, 2, local_keep=3, peer_keep=2) == 20
    # Without the peer tier's copies only the complete global step survives.
    no_peer = [_record(r["spec"]["step"], {w: (c["state"], [t for t in c["tiers"]
                                                         if t != "peer"])
                                          for w, c in r["status"]["writers"].items()})
               for r in recs]
    assert recovery_on_node_loss(PAIRED, no_peer, 2, 3, 2) == 10


def test_from_records_retention_and_expiry_are_respected() -> None:
    recs = [_record(s, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local", "peer"])})
            for s in (20, 30, 40)]
    assert recovery_on_node_loss(PAIRED, recs, 2, local_keep=2, peer_keep=2) == 40
    # Expired records count nowhere, even if a claim still says local.
    expired = [_record(40, {"0": ("Global", ["global", "local", "peer"]),
                            "1": ("Global", ["global", "local", "peer"])}, expired=True)]
    assert recovery_on_node_loss(PAIRED, expired, 2, 2, 2) is None


def test_from_records_only_the_newest_peer_copies_are_held() -> None:
    # Writer 1's holder keeps only the newest copy (30); step 20 is held nowhere
    # but writer 1's own node for writer 1, so it does not survive losing n1.
    recs = [_record(20, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local", "peer"])}),
            _record(30, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local"])})]
    assert recovery_on_node_loss(PAIRED, recs, 2, local_keep=2, peer_keep=2) == 20
    newer = [*recs, _record(40, {"1": ("Local", ["local", "peer"])})]
    assert recovery_on_node_loss(PAIRED, newer, 2, 2, peer_keep=1) is None


def test_from_records_a_writer_not_running_counts_only_global() -> None:
    recs = [_record(10, {"0": ("Global", ["global"]), "1": ("Global", ["global"])}),
            _record(20, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local", "peer"])})]
    only_zero = _doc((0, "n0", None))
    assert recovery_on_node_loss(only_zero, recs, 2, 2, 2) == 10
    assert recovery_on_node_loss(PAIRED, recs, 2, 2, 2) == 20


def test_from_records_a_copy_confirmed_by_another_holder_does_not_count() -> None:
    recs = [_record(20, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local", "peer"])},
                    peerHolder=7)]
    assert recovery_on_node_loss(PAIRED, recs, 2, 2, 2) is None
    recs = [_record(20, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local", "peer"])},
                    peerHolder=None)]
    assert recovery_on_node_loss(PAIRED, recs, 2, 2, 2) is None  # naming no holder: unknown
    recs = [_record(20, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local", "peer"])})]
    assert recovery_on_node_loss(PAIRED, recs, 2, 2, 2) == 20


def test_from_records_a_local_copy_on_a_node_the_writer_left_does_not_count() -> None:
    """Node n1 was lost and writer 1 came back on n2: writer 0's only copy of
    step 20 is now on n0 (its partner's copy died with n1), so losing n0
    would lose step 20; only the global step 10 survives any one node."""
    recs = [_record(10, {"0": ("Global", ["global", "local"]),
                         "1": ("Global", ["global", "local"])}),
            _record(20, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local", "peer"])})]
    moved = _doc((0, "n0", 1), (1, "n2", 0))
    assert recovery_on_node_loss(PAIRED, recs, 2, 2, 2) == 20
    assert recovery_on_node_loss(moved, recs, 2, 2, 2) == 10
    # Even when writer 1 has saved step 20 again on n2, the copy of writer
    # 0's step 20 that it held was on n1: writer 1 is still writer 0's holder,
    # but the copy counts nowhere.
    again = _record(20, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local", "peer"])})
    again["status"]["writers"]["1"]["node"] = "n2"
    assert recovery_on_node_loss(moved, [recs[0], again], 2, 2, 2) == 10
    again["status"]["writers"]["0"]["peerNode"] = "n2"  # writer 0 re-sent it to n2
    assert recovery_on_node_loss(moved, [recs[0], again], 2, 2, 2) == 20


def test_from_records_only_the_newest_local_steps_are_held() -> None:
    # Step 20 survives losing n0 only through writer 1's own local copy; with
    # local keep 1 the agent has removed it for step 30, which no partner holds.
    recs = [_record(20, {"0": ("Local", ["local", "peer"]), "1": ("Local", ["local", "peer"])}),
            _record(30, {"0": ("Local", ["local"]), "1": ("Local", ["local"])})]
    assert recovery_on_node_loss(PAIRED, recs, 2, local_keep=2, peer_keep=2) == 20
    assert recovery_on_node_loss(PAIRED, recs, 2, local_keep=1, peer_keep=2) is None


def _running(name: str, rank: int, node: str, ip: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z",
                         "labels": {"ckptdrain.io/writer": str(rank)}},
            "spec": {"nodeName": node}, "status": {"podIP": ip}}


def test_one_pass_pairs_across_zones_and_keeps_the_previous_holder() -> None:
    pods = [_running("w-0", 0, "n0", "10.0.0.1"), _running("w-1", 1, "n1", "10.0.0.2"),
            _running("w-2", 2, "n2", "10.0.0.3")]
    zones = {"n0": {ZONE_LABEL: "a"}, "n1": {ZONE_LABEL: "a"}, "n2": {ZONE_LABEL: "b"}}
    recs = [_record(20, {w: ("Local", ["local", "peer"]) for w in "012"}, writers=3,
                    holders={"0": 2, "1": 2, "2": 0})]
    cm, status = publish("ml", "llama", pods, zones, 9109, 3, 2, 2, recs, None, OWNER)
    doc = json.loads(cm["data"]["peers.json"])
    # Writer 0 (zone a) skips writer 1 (zone a too) for writer 2 (zone b).
    assert {r: e["holder"] for r, e in doc["writers"].items()} == {"0": 2, "1": 2, "2": 0}
    assert cm["metadata"]["ownerReferences"] == [OWNER]
    assert status["peer"]["reason"] == "Paired"
    assert status["recoveryPointOnNodeLoss"] == 20
    # Stable: the same pods give the same object (no write).
    assert publish("ml", "llama", pods, zones, 9109, 3, 2, 2, recs, doc, OWNER)[0] == cm
    # Writer 2's pod goes away: 0 and 1 are re-paired, the old holder remembered.
    cm2, status2 = publish("ml", "llama", pods[:2], zones, 9109, 3, 2, 2, recs, doc, OWNER)
    doc2 = json.loads(cm2["data"]["peers.json"])
    assert doc2["writers"]["0"]["holder"] == 1 and doc2["writers"]["0"]["previousHolder"] == 2
    assert status2["peer"]["reason"] == "Partial"
    # Writer 2 has no pod: only the global tier counts for it.
    assert status2["recoveryPointOnNodeLoss"] is None


def test_turning_the_tier_off_clears_its_status_once() -> None:
    assert status_when_off({}) is None
    assert status_when_off({"peer": {"enabled": False}}) is None
    change = status_when_off({"peer": {"enabled": True, "reason": "Paired"},
                              "recoveryPointOnNodeLoss": 20})
    assert change is not None and change["peer"]["enabled"] is False
    assert change["recoveryPointOnNodeLoss"] is None and change["peer"]["pairs"] is None


@settings(max_examples=200, deadline=None)
@given(placement=hst.lists(hst.tuples(hst.integers(0, 7), hst.integers(0, 3),
                                      hst.sampled_from(["a", "b", None])),
                           max_size=10))
def test_a_pass_is_stable_and_never_pairs_a_writer_with_its_own_node(
        placement: list[tuple[int, int, str | None]]) -> None:
    pods = [_running(f"w-{i}", rank, f"n{node}", f"10.0.{i}.1")
            for i, (rank, node, _) in enumerate(placement)]
    zones = {f"n{node}": {ZONE_LABEL: zone} for _, node, zone in placement if zone}
    cm, status = publish("ml", "llama", pods, zones, 9109, 8, 2, 2, [], None)
    doc = json.loads(cm["data"]["peers.json"])
    # Fed its own document back (the next event, a restarted operator): no change.
    again, _ = publish("ml", "llama", pods, zones, 9109, 8, 2, 2, [], doc)
    assert again == cm
    writers = doc["writers"]
    for entry in writers.values():
        if entry["holder"] is not None:
            assert writers[str(entry["holder"])]["node"] != entry["node"]
    # Every running writer has a holder exactly when more than one node runs writers.
    nodes = {e["node"] for e in writers.values()}
    if writers:
        assert (status["peer"]["paired"] == len(writers)) == (len(nodes) > 1)


def test_a_certificate_is_renewed_with_a_third_of_its_life_left() -> None:
    material = peer_certs.new_material("ml/llama", NOW)
    ends = peer_certs.not_after(material["tls.crt"])
    assert ends == (NOW + peer_certs.CERT_LIFETIME).replace(microsecond=0)
    assert not peer_certs.renewal_due(ends, NOW)
    assert not peer_certs.renewal_due(ends, ends - peer_certs.RENEW_BEFORE - timedelta(seconds=1))
    assert peer_certs.renewal_due(ends, ends - peer_certs.RENEW_BEFORE)
    assert peer_certs.renewal_due(None, NOW)  # not known: renewed


def test_a_ca_must_outlive_the_certificate_it_signs() -> None:
    ca = peer_certs.new_ca("ml/llama", NOW)
    assert peer_certs.ca_usable(ca, NOW)
    ends = peer_certs.not_after(ca["ca.crt"])
    assert not peer_certs.ca_usable(ca, ends - peer_certs.CERT_LIFETIME)
    assert not peer_certs.ca_usable({"ca.crt": ca["ca.crt"], "ca.key": b"junk"}, NOW)
    assert not peer_certs.ca_usable({"ca.key": ca["ca.key"]}, NOW)
