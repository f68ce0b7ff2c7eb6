"""node/lease.py: who may take a writer's lease, and the spec written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ckptdrain.node import lease as lease_mod
from ckptdrain.node.kube import WriterLease
from ckptdrain.node.lease import (
    LEASE_SECONDS,
    MAX_LEASE_SECONDS,
    MICROTIME,
    ExpiryWatch,
    WriterFenced,
    lease_name,
    lease_seconds,
    lease_spec,
    may_take,
    recently_renewed,
)

NOW = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def held_by(holder: str, renewed: datetime, seconds: int = 60) -> dict[str, object]:
    return lease_spec(holder, seconds, renewed)


def test_free_own_or_long_unchanged_leases_may_be_taken() -> None:
    assert may_take({}, "me", 0.0)
    assert may_take(held_by("me", NOW), "me", 0.0)
    assert not may_take(held_by("other", NOW), "me", 59.0)
    assert may_take(held_by("other", NOW), "me", 61.0)
    # Written by another client without a duration: nothing to wait for.
    assert may_take({"holderIdentity": "other", "renewTime": "garbage"}, "me", 0.0)


def test_expiry_is_judged_by_this_process_not_by_the_holders_stamp() -> None:
    """A renewTime far in the past (the holder's clock behind ours, or ours
    ahead) is no evidence: only seeing the lease unchanged for its duration is."""
    watch = ExpiryWatch()
    stale_looking = {"metadata": {"resourceVersion": "7"},
                     "spec": held_by("other", NOW - timedelta(hours=2))}
    assert not may_take(stale_looking["spec"], "me", watch.unchanged_for(stale_looking, 1000.0))
    assert not may_take(stale_looking["spec"], "me", watch.unchanged_for(stale_looking, 1059.0))
    renewed = {"metadata": {"resourceVersion": "8"},
               "spec": held_by("other", NOW - timedelta(hours=2) + timedelta(seconds=20))}
    assert watch.unchanged_for(renewed, 1070.0) == 0.0  # a renewal restarts the count
    assert not may_take(renewed["spec"], "me", watch.unchanged_for(renewed, 1129.0))
    assert may_take(renewed["spec"], "me", watch.unchanged_for(renewed, 1131.0))


def test_a_renewal_vouches_for_half_the_time_a_taker_must_wait() -> None:
    assert not recently_renewed(None, 5.0)
    assert recently_renewed(100.0, 129.0)
    assert not recently_renewed(100.0, 130.0)


class FakeLeaseApi:
    """The lease calls WriterLease makes; `down` makes them fail like an
    unreachable apiserver."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.writes = 0
        self.down = False
        #: kube-node-lease/<node> -> its lease (the kubelets' heartbeats).
        self.nodes: dict[str, dict[str, Any]] = {}

    def _stored(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.writes += 1
        self.lease = {"metadata": {"name": body["metadata"]["name"],
                                   "annotations": dict(body["metadata"].get("annotations")
                                                       or {}),
                                   **({"ownerReferences": body["metadata"]["ownerReferences"]}
                                      if body["metadata"].get("ownerReferences") else {}),
                                   "resourceVersion": str(self.version)},
                      "spec": dict(body["spec"])}
        return {"metadata": dict(self.lease["metadata"]), "spec": dict(self.lease["spec"])}

    def create_namespaced_custom_object(self, *args: Any, **_: Any) -> dict[str, Any]:
        if self.down:
            raise ConnectionError("apiserver unreachable")
        return self._stored(args[-1])

    def get_namespaced_custom_object(self, *args: Any, **_: Any) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException
        if self.down:
            raise ConnectionError("apiserver unreachable")
        if args[2] == "kube-node-lease":
            if args[4] not in self.nodes:
                raise ApiException(status=404)
            return dict(self.nodes[args[4]])
        if self.lease is None:
            raise ApiException(status=404)
        return {"metadata": dict(self.lease["metadata"]), "spec": dict(self.lease["spec"])}

    def replace_namespaced_custom_object(self, *args: Any, **_: Any) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException
        if self.down:
            raise ConnectionError("apiserver unreachable")
        body = args[-1]
        assert self.lease is not None
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        return self._stored(body)


class Clocks:
    def __init__(self) -> None:
        self.mono = 500.0
        self.wall = NOW

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += timedelta(seconds=seconds)


def test_an_unrenewable_lease_stops_vouching_for_commits() -> None:
    api, clocks = FakeLeaseApi(), Clocks()
    lease = WriterLease("ns", "pol", 0, "pod-a", api=api, clock=lambda: clocks.wall,
                        monotonic=lambda: clocks.mono)
    lease.check()
    api.down = True
    clocks.advance(20)
    lease.check()  # a blip: the renewal 20 s ago still vouches
    clocks.advance(15)
    with pytest.raises(WriterFenced, match="could not be renewed"):
        lease.check()  # 35 s: no commit on an old renewal
    api.down = False
    lease.check()  # renewed again: commits resume


def test_a_skewed_clock_does_not_take_a_live_lease() -> None:
    api, a_clocks, b_clocks = FakeLeaseApi(), Clocks(), Clocks()
    b_clocks.wall += timedelta(hours=1)  # pod b's node runs an hour ahead
    a = WriterLease("ns", "pol", 0, "pod-a", api=api, clock=lambda: a_clocks.wall,
                    monotonic=lambda: a_clocks.mono)
    b = WriterLease("ns", "pol", 0, "pod-b", api=api, clock=lambda: b_clocks.wall,
                    monotonic=lambda: b_clocks.mono)
    a.check()
    with pytest.raises(WriterFenced, match="pod-a"):
        b.check()
    for _ in range(3):  # a keeps renewing: b never sees it unchanged for long
        a_clocks.advance(20)
        b_clocks.advance(20)
        a.check()
        with pytest.raises(WriterFenced, match="pod-a"):
            b.check()
    b_clocks.advance(61)  # a is gone: unchanged for the lease's duration
    b.check()
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "pod-b"


def test_spec_keeps_the_acquire_time_on_renewal() -> None:
    first = lease_spec("me", 60, NOW)
    later = lease_spec("me", 60, NOW + timedelta(seconds=20), str(first["acquireTime"]))
    assert later["acquireTime"] == NOW.strftime(MICROTIME) == "2026-01-02T03:04:05.678901Z"
    assert later["renewTime"] != first["renewTime"]


def test_names_are_per_policy_and_writer_and_valid() -> None:
    assert lease_name("llama", 3) == "ckptdrain-llama-w3"
    assert lease_name("Odd_Name.x", 0) == "ckptdrain-odd-name-x-w0"
    assert len(lease_name("p" * 300, 12345)) <= 253


def test_the_lease_lasts_three_commit_periods_within_bounds() -> None:
    assert lease_seconds(900) == 2700  # 15-minute global checkpoints
    assert lease_seconds(5) == LEASE_SECONDS
    assert lease_seconds(0) == LEASE_SECONDS
    assert lease_seconds(86400) == MAX_LEASE_SECONDS
    assert may_take(held_by("other", NOW, 2700), "me", 10.0, holder_node_gone=True)


def test_a_commit_soon_after_a_renewal_writes_nothing() -> None:
    api, clocks = FakeLeaseApi(), Clocks()
    lease = WriterLease("ns", "pol", 0, "pod-a", api=api, clock=lambda: clocks.wall,
                        monotonic=lambda: clocks.mono, seconds=2700)
    lease.check()
    assert api.writes == 1
    for _ in range(2):  # commits 10 s apart, within the 30 s a renewal vouches for
        clocks.advance(10)
        lease.check()
    assert api.writes == 1
    clocks.advance(900)  # the next global checkpoint: one renewal
    lease.check()
    assert api.writes == 2


def _two_nodes(seconds: int = 2700) -> tuple[FakeLeaseApi, Clocks, WriterLease, WriterLease]:
    api, clocks = FakeLeaseApi(), Clocks()
    for node in ("node-a", "node-b"):
        api.nodes[node] = {"metadata": {"resourceVersion": "1"},
                           "spec": {"holderIdentity": node, "renewTime": "t1"}}
    a = WriterLease("ns", "pol", 0, "pod-a", api=api, clock=lambda: clocks.wall,
                    monotonic=lambda: clocks.mono, seconds=seconds, node="node-a")
    b = WriterLease("ns", "pol", 0, "pod-b", api=api, clock=lambda: clocks.wall,
                    monotonic=lambda: clocks.mono, seconds=seconds, node="node-b")
    return api, clocks, a, b


def test_a_long_lease_fails_over_once_the_holder_is_gone_with_its_node() -> None:
    api, clocks, a, b = _two_nodes()
    a.check()
    assert api.lease is not None
    assert api.lease["metadata"]["annotations"]["ckptdrain.io/holder-node"] == "node-a pod-a"
    with pytest.raises(WriterFenced, match="pod-a"):
        b.check()
    for beat in range(2, 6):  # node-a's kubelet heartbeats: b keeps out, 80 s on
        clocks.advance(20)
        for node in ("node-a", "node-b"):
            api.nodes[node] = {"metadata": {"resourceVersion": str(beat)}, "spec": {}}
        with pytest.raises(WriterFenced, match="pod-a"):
            b.check()
    clocks.advance(61)  # node-a's heartbeats stopped a minute ago (b's own clock)
    api.nodes["node-b"] = {"metadata": {"resourceVersion": "9"}, "spec": {}}
    b.check()
    assert api.lease["spec"]["holderIdentity"] == "pod-b"
    assert api.lease["metadata"]["annotations"]["ckptdrain.io/holder-node"] == "node-b pod-b"
    # pod-a still runs (its kubelet died, not it): its renewal is old, so its
    # next commit renews first, and is fenced instead of writing beside b.
    with pytest.raises(WriterFenced, match="pod-b"):
        a.check()


def test_a_holder_that_renewed_lately_keeps_its_lease_even_if_its_node_looks_dead() -> None:
    api, clocks, a, b = _two_nodes()
    a.check()
    del api.nodes["node-a"]  # its node lease is gone (or its kubelet is cut off)
    with pytest.raises(WriterFenced):
        b.check()
    clocks.advance(50)
    a.check()  # 50 s on: a renews (a write), and may commit
    clocks.advance(20)  # node-a's lease missing for 70 s, but a renewed 20 s ago
    with pytest.raises(WriterFenced, match="pod-a"):
        b.check()
    clocks.advance(65)  # a fell silent: unchanged for 65 s since b saw it, node gone
    b.check()
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "pod-b"


def test_a_node_written_for_an_earlier_holder_is_no_evidence() -> None:
    api, clocks, a, b = _two_nodes()
    a.check()
    assert api.lease is not None
    api.lease["metadata"]["annotations"]["ckptdrain.io/holder-node"] = "node-x pod-old"
    with pytest.raises(WriterFenced):
        b.check()
    clocks.advance(120)
    with pytest.raises(WriterFenced):
        b.check()  # node-x does not exist, but the annotation is not pod-a's


def test_a_holder_on_this_node_or_unknown_node_waits_for_the_duration() -> None:
    api, clocks, a, _ = _two_nodes(seconds=120)
    a.check()
    same = WriterLease("ns", "pol", 0, "pod-c", api=api, clock=lambda: clocks.wall,
                       monotonic=lambda: clocks.mono, seconds=120, node="node-a")
    del api.nodes["node-a"]  # even so: this process runs on node-a, it is not gone
    with pytest.raises(WriterFenced):
        same.check()
    clocks.advance(121)
    same.check()


def test_the_lease_is_owned_by_its_pod_and_released_for_good() -> None:
    api, clocks = FakeLeaseApi(), Clocks()
    lease = WriterLease("ns", "pol", 0, "uid-a", api=api, clock=lambda: clocks.wall,
                        monotonic=lambda: clocks.mono, node="node-a", pod="pod-a")
    lease.check()
    assert api.lease is not None
    assert api.lease["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "pod-a", "uid": "uid-a"}]
    lease.release()
    assert api.lease["spec"].get("holderIdentity") is None
    assert "ckptdrain.io/holder-node" not in api.lease["metadata"]["annotations"]
    with pytest.raises(WriterFenced, match="released"):
        lease.check()  # a commit racing the release on another thread
    assert not lease.renew()


def _confirm(lease_rv: str = "7", holder: str = "uid-a", age_s: float = 100.0,
             heartbeat_age_s: float | None = 5.0, now: datetime | None = None) -> bool:
    now = now or datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    lease = {"metadata": {"resourceVersion": lease_rv}, "spec": {"holderIdentity": holder}}
    mine = {"metadata": {"resourceVersion": "7"}, "spec": {"holderIdentity": "uid-a"}}
    node = None if heartbeat_age_s is None else {"spec": {"renewTime": (
        now - timedelta(seconds=heartbeat_age_s)).strftime(lease_mod.MICROTIME)}}
    return lease_mod.confirmed(lease, mine, "uid-a", age_s, 300.0, node, now)


def test_reads_confirm_a_lease_only_as_left_with_a_live_node_and_time_to_spare() -> None:
    assert _confirm()
    assert not _confirm(lease_rv="8")                 # written by someone since
    assert not _confirm(holder="uid-b")               # another holder
    assert not _confirm(age_s=300.0 - lease_mod.TRUST_S + 0.1)  # too little duration left
    assert _confirm(age_s=300.0 - lease_mod.TRUST_S)
    assert not _confirm(heartbeat_age_s=None)         # no node lease read
    assert not _confirm(heartbeat_age_s=lease_mod.NODE_FRESH_S + 0.5)  # kubelet late
    assert _confirm(heartbeat_age_s=lease_mod.NODE_FRESH_S)
    assert not _confirm(heartbeat_age_s=-30.0)        # a heartbeat from the future
    # The margin: a fresh heartbeat keeps a taker's node test false longer
    # than a commit may take after its check.
    assert lease_mod.NODE_DEAD_S - lease_mod.NODE_FRESH_S > lease_mod.TRUST_S
