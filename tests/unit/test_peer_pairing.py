"""Placement of partner copies: another node, another zone when possible,
stable, re-paired when a holder goes away; and the document pods read."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.contract.peers import Member, document, holders, parse
from ckptdrain.errors import IntegrityError


def test_each_writer_is_held_on_another_node_and_zone_when_possible() -> None:
    members = [Member(0, "n0", "a"), Member(1, "n1", "a"), Member(2, "n2", "b"),
               Member(3, "n3", "b")]
    pairs = holders(members)
    assert pairs == {0: 2, 1: 2, 2: 0, 3: 0}


def test_without_zones_the_next_writer_on_another_node_holds() -> None:
    members = [Member(0, "n0"), Member(1, "n0"), Member(2, "n1")]
    assert holders(members) == {0: 2, 1: 2, 2: 0}


def test_all_on_one_node_means_no_holder() -> None:
    assert holders([Member(0, "n0"), Member(1, "n0")]) == {0: None, 1: None}


@given(st.lists(st.tuples(st.sampled_from("nmop"), st.sampled_from(["a", "b", None])),
                min_size=1, max_size=12))
def test_a_holder_is_never_on_the_same_node(placement: list[tuple[str, str | None]]) -> None:
    members = [Member(i, node, zone) for i, (node, zone) in enumerate(placement)]
    pairs = holders(members)
    by_rank = {m.rank: m for m in members}
    for rank, holder in pairs.items():
        if holder is None:
            assert all(m.node == by_rank[rank].node for m in members)
        else:
            assert by_rank[holder].node != by_rank[rank].node
    # Stable: the same placement in another order gives the same pairs.
    assert holders(reversed(members)) == pairs


def test_a_writer_whose_holder_left_is_re_paired_and_remembers_the_old_one() -> None:
    before = document("ns/p", [Member(0, "n0", address="10.0.0.1:9109"),
                               Member(1, "n1", address="10.0.0.2:9109"),
                               Member(2, "n2", address="10.0.0.3:9109")])
    assert before["writers"]["0"]["holder"] == 1
    # Writer 1's pod moved to n0 (its node was lost): 0 is now held by 2.
    after = document("ns/p", [Member(0, "n0", address="10.0.0.1:9109"),
                              Member(1, "n0", address="10.0.0.9:9109"),
                              Member(2, "n2", address="10.0.0.3:9109")], previous=before)
    view = parse(json.dumps(after).encode(), "ns/p")
    assert view.holder(0) == 2
    assert view.holder_addresses(0) == ["10.0.0.3:9109", "10.0.0.9:9109"]
    assert view.held_for(2) == [0, 1]


def test_a_writer_whose_pod_is_gone_keeps_its_holders_for_its_restore() -> None:
    """Writer 0's node is lost: its pod is not running, its copies are on
    writer 1's node. The document keeps writer 0's holder (no address of its
    own), so its replacement's restore asks writer 1's peer server."""
    a, b = Member(0, "n0", "za", "10.0.0.1:9109"), Member(1, "n1", "zb", "10.0.1.1:9109")
    before = document("ns/p", [a, b])
    after = document("ns/p", [b], before, expected=2)
    assert after["writers"]["0"] == {"node": None, "zone": None, "address": None,
                                     "holder": 1, "previousHolder": None}
    view = parse(json.dumps(after).encode(), "ns/p")
    assert view.holder_addresses(0) == ["10.0.1.1:9109"] and view.address(0) is None
    assert view.held_for(1) == [0]
    # The replacement runs (on another node): a member again, same holder.
    back = document("ns/p", [Member(0, "n2", "za", "10.0.2.1:9109"), b], after, expected=2)
    assert back["writers"]["0"]["address"] == "10.0.2.1:9109"
    assert back["writers"]["0"]["holder"] == 1
    # A policy that shrank drops the ranks it no longer has.
    assert "0" not in document("ns/p", [b], before, expected=0)["writers"]


def test_the_status_counts_only_running_writers() -> None:
    from ckptdrain.operator.peers.placement import pairs_status, peer_status
    before = document("ns/p", [Member(0, "n0", None, "a:1"), Member(1, "n1", None, "b:1")])
    after = document("ns/p", [Member(1, "n1", None, "b:1")], before, expected=2)
    assert pairs_status(after) == {"1": None}
    status = peer_status("p", after, 2)
    assert (status["writers"], status["reason"]) == (1, "NoPartner")


def test_a_document_of_another_policy_is_refused() -> None:
    data = json.dumps(document("ns/p", [Member(0, "n0")])).encode()
    with pytest.raises(IntegrityError, match="ns/p"):
        parse(data, "ns/q")
    with pytest.raises(IntegrityError):
        parse(b"[]", "ns/p")


@pytest.mark.parametrize("doc", [
    {"policy": "ns/p", "writers": {"\u00b2": {"holder": 0}}},   # isdigit(), not int()
    {"policy": "ns/p", "writers": {"\u0663": {"holder": 0}}},   # an Arabic-Indic 3
    {"policy": "ns/p", "writers": {"1": {"holder": 0}, "01": {"holder": 0}}},
])
def test_a_rank_that_is_not_plain_decimal_is_an_integrity_error(doc: dict) -> None:
    # Anything but IntegrityError escapes PeerConfig.view (the replicator's
    # thread would die; restore would crash instead of skipping the peer tier).
    with pytest.raises(IntegrityError):
        parse(json.dumps(doc).encode(), "ns/p")


def test_a_boolean_holder_names_nobody() -> None:
    doc = {"policy": "ns/p", "writers": {"0": {"holder": True, "previousHolder": True},
                                         "1": {"address": "10.0.0.2:9109"}}}
    view = parse(json.dumps(doc).encode(), "ns/p")
    assert view.holder(0) is None
    assert view.holder_addresses(0) == []
