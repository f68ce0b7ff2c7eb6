"""The cluster scale (contract/share.py): one object per namespace carries the
factor every policy's budget is scaled by, so a new job under the cluster
cap is one write, not a rewrite of every policy's channel. Its format, how
an agent combines it with its channel, and what the operator writes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ckptdrain.agent.share import ChannelView, Share, resolve_channel
from ckptdrain.agent.share_channel import ShareChannel
from ckptdrain.contract import share as sh
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.apiserver import kube, leadership
from ckptdrain.operator.bandwidth import share_channel as op
from ckptdrain.operator.policy import allocation
from ckptdrain.operator.policy import spec as policy

WANTED, BUDGET = 1000, 500  # published with a factor of 0.5


def _channel(**over: Any) -> sh.Allocation:
    base: dict[str, Any] = {"policy": "p", "budget": BUDGET, "drainers": 2,
                            "active_ranks": "0-1", "writers": 4, "wanted": WANTED}
    base.update(over)
    return sh.Allocation(**base)


def _scale(factor: float) -> sh.Scale:
    return sh.scale_from_object({"spec": sh.scale_spec(factor, 10_000)})


def test_the_scale_only_ever_lowers_the_budget_the_channel_published() -> None:
    a = _channel()
    assert a.budget_under(None) == BUDGET  # no scale published (an older operator)
    assert a.budget_under(_scale(0.5)) == BUDGET  # the one it was computed with
    assert a.budget_under(_scale(0.25)) == 250  # a smaller factor since: one write did it
    # A larger factor (stale, hand-edited, or the cap freed before the channel
    # grew) never raises it: growth waits for the channel's own rewrite.
    assert a.budget_under(_scale(1.0)) == BUDGET
    assert a.share(_scale(0.25)) == 125 and a.fallback_cap(_scale(0.25)) == 62.5
    # A channel without a wanted budget (the operator keeps it whole): the scale never applies.
    assert _channel(wanted=None).budget_under(_scale(0.1)) == BUDGET


def test_the_channel_round_trips_its_wanted_budget() -> None:
    a = _channel()
    assert sh.from_object(sh.body("ns", a, None)) == a
    for value in (0, "3", True):
        obj = sh.body("ns", a, None)
        obj["spec"]["wantedBytes"] = value
        with pytest.raises(InvalidInput) as err:
            sh.from_object(obj)
        assert err.value.field == "spec.wantedBytes"


def test_the_scale_object_round_trips_and_a_malformed_one_names_its_field() -> None:
    body = sh.scale_body("ns", sh.scale_spec(0.25, 4e9))
    assert body["metadata"]["name"] == sh.SCALE_NAME
    assert sh.scale_from_object(body) == sh.Scale(factor=0.25, cluster_cap=4_000_000_000)
    uncapped = sh.scale_body("ns", sh.scale_spec(1.0, None))
    assert "clusterCapBytes" not in uncapped["spec"]["clusterScale"]
    cases = [({"factor": 0}, "spec.clusterScale.factor"),
             ({"factor": 1.5}, "spec.clusterScale.factor"),
             ({"factor": "0.5"}, "spec.clusterScale.factor"),
             ({"factor": float("nan")}, "spec.clusterScale.factor"),
             ({"factor": 0.5, "clusterCapBytes": 0}, "spec.clusterScale.clusterCapBytes")]
    for scale, field in cases:
        with pytest.raises(InvalidInput) as err:
            sh.scale_from_object({"spec": {"clusterScale": scale}})
        assert err.value.field == field
    with pytest.raises(InvalidInput) as err:
        sh.scale_from_object({"spec": {"policy": "p"}})
    assert err.value.field == "spec.clusterScale"
    with pytest.raises(InvalidInput):
        sh.scale_spec(0.0, None)


def test_no_policy_may_take_the_scale_objects_name() -> None:
    cfg = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
    spec = {"selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "1B"},
            "interval": "15m", "localTier": {"path": "/mnt/ckptdrain/nvme"},
            "storage": {"uri": "s3://bucket/prefix"}}
    assert policy.validate(spec, cfg, name="llama") == []
    errors = policy.validate(spec, cfg, name=sh.SCALE_NAME)
    assert [e.field for e in errors] == ["metadata.name"]


def _view(scale: sh.Scale | None, **over: Any) -> ChannelView:
    base: dict[str, Any] = {"established": True, "broken": False, "forbidden": False,
                            "allocation": _channel(), "received_at": 10.0, "admitted": True,
                            "draining": True, "waiting_since": None, "scale": scale}
    base.update(over)
    return ChannelView(**base)


def test_an_admitted_agent_follows_a_smaller_scale_without_its_channel_rewritten() -> None:
    file = Share(10_000.0, "file")
    assert resolve_channel(_view(None), 11.0, file) == Share(250.0, "channel")
    assert resolve_channel(_view(_scale(0.2)), 11.0, file) == Share(100.0, "channel")
    # The fallback is capped by the scaled budget too: never over it while the cap binds.
    idle = resolve_channel(_view(_scale(0.2), admitted=False, draining=False), 11.0, file)
    assert idle.rate == 50.0


class _Api:
    """The two objects an agent lists; the watch never delivers."""

    def __init__(self, objects: dict[str, dict[str, Any] | None]) -> None:
        self.objects = objects

    def list_namespaced_custom_object(self, *args: object, **kw: Any) -> dict[str, Any]:
        if kw.get("watch"):
            raise ConnectionError("no watch here")
        name = str(kw["field_selector"]).split("=", 1)[1]
        obj = self.objects.get(name)
        return {"metadata": {"resourceVersion": "5"}, "items": [obj] if obj else []}


def test_a_scale_not_seen_gone_or_unreadable_makes_the_channel_not_current() -> None:
    rich = Share(1e9, "file")  # a fallback far above the budget: only the channel limits
    channel = ShareChannel("ns", "p", rank=0, pod="w0", pending=lambda: 1,
                           reported=lambda: 0.0, api=_Api({}), clock=lambda: 5.0)
    channel._accept(sh.body("ns", _channel(), None) | {"metadata": {"resourceVersion": "1"}})
    assert channel.view().broken  # the scale watch has not listed yet
    channel.scale._accept({"metadata": {"resourceVersion": "2"},
                           "spec": sh.scale_spec(0.2, 1e9)})
    view = channel.view()
    assert not view.broken and view.scale == sh.Scale(0.2, 1_000_000_000)
    assert view.admitted and resolve_channel(view, 5.0, rich) == Share(100.0, "channel")
    for version, obj in (("3", {"spec": {"clusterScale": {"factor": 2}}}), ("4", None)):
        # Malformed, then deleted: not current, and the last good factor still
        # applies (the channel's budget left the shrink to it): the smaller of
        # its share (100) and the fallback, capped at the scaled budget over
        # the writers (1000 x 0.2 / 4).
        channel.scale._accept(None if obj is None else {"metadata": {"resourceVersion": version},
                                                        **obj})
        view = channel.view()
        assert view.broken and view.scale == sh.Scale(0.2, 1_000_000_000)
        assert resolve_channel(view, 5.0, rich).rate == 50.0
    # A channel that keeps its whole budget needs no scale.
    channel._accept(sh.body("ns", _channel(wanted=None), None)
                    | {"metadata": {"resourceVersion": "5"}})
    assert not channel.view().broken


class _Store:
    """kube.write_object as the apiserver answers it; `refuse` fails a namespace."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.refuse: set[str] = set()

    def write_object(self, plural: str, namespace: str, body: dict[str, Any],
                     patch: dict[str, Any] | None = None) -> dict[str, Any]:
        if namespace in self.refuse:
            raise RuntimeError("exceeded quota")
        key = (namespace, body["metadata"]["name"])
        self.writes.append(key)
        old = self.objects.get(key)
        self.objects[key] = {"spec": {**(old or {}).get("spec", {}), **(patch or body)["spec"]}}
        return self.objects[key]

    def read_own(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((namespace, name))

    def factor(self, namespace: str) -> float:
        return float(self.objects[(namespace, sh.SCALE_NAME)]["spec"]["clusterScale"]["factor"])


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = _Store()
    monkeypatch.setattr(kube, "write_object", fake.write_object)
    monkeypatch.setattr(kube, "read_own", fake.read_own)
    op.forget()
    yield fake
    op.forget()


def _view_of(namespaces: set[str], factor: float) -> op.ScaleView:
    return lambda: (set(namespaces), factor, 4e9)


def test_the_scale_is_written_to_every_namespace_when_it_moves_and_not_otherwise(
        store: _Store) -> None:
    cluster = _view_of({"a", "b"}, 1.0)
    assert op.publish_scale("a", 1.0, 4e9, cluster)
    assert op.publish_scale("b", 1.0, 4e9, cluster)
    assert sorted(store.writes) == [("a", sh.SCALE_NAME), ("b", sh.SCALE_NAME)]
    assert op.publish_scale("a", 0.5, 4e9, _view_of({"a", "b"}, 0.5))
    assert (store.factor("a"), store.factor("b"), len(store.writes)) == (0.5, 0.5, 4)
    # Due again after a heartbeat: rewritten (mends a hand edit or a deposed replica's write).
    op._scale.written_at = (op._scale.written_at or 0.0) - sh.HEARTBEAT_S
    store.objects[("b", sh.SCALE_NAME)]["spec"]["clusterScale"]["factor"] = 0.9
    assert op.publish_scale("a", 0.5, 4e9, _view_of({"a", "b"}, 0.5))
    assert store.factor("b") == 0.5


def test_a_pass_that_read_the_cluster_too_early_never_writes_its_older_factor(
        store: _Store) -> None:
    now = _view_of({"a"}, 0.5)  # a new policy arrived: the factor fell to 0.5
    assert op.publish_scale("a", 0.5, 4e9, now)
    # A pass whose view predates it asks for 1.0: the view taken under the lock wins.
    assert op.publish_scale("a", 1.0, 4e9, now, may_raise=True)
    assert store.factor("a") == 0.5 and len(store.writes) == 1


def test_a_larger_factor_waits_for_the_joint_pass_a_smaller_one_does_not(
        store: _Store) -> None:
    assert op.publish_scale("a", 0.5, 4e9, _view_of({"a"}, 0.5))
    # A policy wants less: the factor may rise, but only once the channels that
    # shrink are out, which the joint pass says with may_raise.
    assert op.publish_scale("a", 0.8, 4e9, _view_of({"a"}, 0.8))
    assert store.factor("a") == 0.5
    assert op.publish_scale("a", 0.8, 4e9, _view_of({"a"}, 0.8), may_raise=True)
    assert store.factor("a") == 0.8
    assert op.publish_scale("a", 0.3, 4e9, _view_of({"a"}, 0.3))  # lower: at once
    assert store.factor("a") == 0.3


def test_a_fresh_process_raises_no_factor_it_did_not_place_until_the_joint_pass_may(
        store: _Store) -> None:
    assert op.publish_scale("a", 0.3, 4e9, _view_of({"a"}, 0.3))
    op.forget()  # a restart: the scale stays, what this process wrote is gone
    assert op.publish_scale("a", 0.8, 4e9, _view_of({"a"}, 0.8))
    assert store.factor("a") == 0.3  # the one placed, not a raise
    assert op.publish_scale("a", 0.8, 4e9, _view_of({"a"}, 0.8), may_raise=True)
    assert store.factor("a") == 0.8


def test_a_scale_that_cannot_be_read_is_not_written_until_the_joint_pass_may_raise(
        store: _Store, monkeypatch: pytest.MonkeyPatch) -> None:
    def unreadable(*_: object) -> None:
        raise RuntimeError("apiserver unavailable")
    monkeypatch.setattr(kube, "read_own", unreadable)
    assert not op.publish_scale("a", 0.8, 4e9, _view_of({"a"}, 0.8))
    assert store.writes == []
    assert op.publish_scale("a", 0.8, 4e9, _view_of({"a"}, 0.8), may_raise=True)
    assert store.factor("a") == 0.8


def test_a_policys_own_pass_after_the_level_moved_writes_its_new_factor(
        store: _Store) -> None:
    def joint(*names: str) -> dict[Any, Any]:
        shares = allocation.cluster_shares({(n.lower(), n): 60e9 for n in names}, 40e9)
        return {key: (None, share, None) for key, share in shares.items()}
    before, after = joint("A", "B"), joint("A", "B", "C")
    assert op.publish_joint_scale("a", before, 40e9, lambda: before)
    # C joined: the factor in place is at another level, no reason to keep
    # it (A's claim says nothing under it), though A's pass sees only A.
    mine = {("a", "A"): after[("a", "A")]}
    assert op.publish_joint_scale("a", mine, 40e9, lambda: after)
    assert store.factor("a") == after[("a", "A")][1].factor < before[("a", "A")][1].factor


def test_no_cluster_cap_no_scale_and_a_deposed_replica_writes_nothing(store: _Store) -> None:
    assert not op.publish_scale("a", 1.0, None, _view_of({"a"}, 1.0))
    assert not op.publish_scale("a", 0.5, 4e9, _view_of({"a"}, 0.5), active=lambda: False)
    assert store.writes == []


def test_a_namespace_whose_scale_cannot_be_written_keeps_whole_budgets_alone(
        store: _Store) -> None:
    store.refuse = {"b"}
    logged: list[str] = []
    cluster = _view_of({"a", "b"}, 0.5)
    assert op.publish_scale("a", 0.5, 4e9, cluster, log=logged.append)
    assert not op.publish_scale("b", 0.5, 4e9, cluster, log=logged.append)
    assert store.factor("a") == 0.5 and any("in b not written" in m for m in logged)
    store.refuse = set()
    assert not op.publish_scale("b", 0.5, 4e9, cluster)  # not retried at every pass
    op._scale.failed_at["b"] -= sh.HEARTBEAT_S
    assert op.publish_scale("b", 0.5, 4e9, cluster)  # a heartbeat later
    assert store.factor("b") == 0.5


def test_a_channel_leaves_shrinks_to_the_scale_and_is_rewritten_when_it_grows(
        store: _Store) -> None:
    key = ("ns", "p")
    start = time.monotonic()  # what the channel stamps its writes with

    def publish(budget: float, wanted: float | None, at: float,
                drainers: list[op.Drainer] | None = None) -> bool:
        return op.publish(key, budget, None, drainers or [], 4, None, start + at,
                          lambda: "t", wanted=wanted)[0]

    def written() -> tuple[int, int | None]:
        spec = store.objects[("ns", "p")]["spec"]
        return spec["budgetBytes"], spec.get("wantedBytes")

    assert publish(500, 1000, 0.0) and written() == (500, 1000)
    assert not publish(250, 1000, 1.0)  # a shrink: the scale says it, no write
    assert not publish(400, 1000, 1.5)  # up again, still under what is written
    assert publish(600, 1000, 2.0) and written() == (600, 1000)  # grown past it
    assert publish(650, 1200, 2.5) and written() == (650, 1200)  # the policy wants more
    # Without a wanted budget (no scale in place, or an agent that cannot read one)
    # every change of budget is the channel's to say, shrinks too.
    assert publish(300, None, 3.0) and written() == (300, None)
    assert publish(200, None, 3.5) and written() == (200, None)
    # While anyone drains the heartbeat still comes, with the budget of the day.
    drainer = [op.Drainer("w0", 0)]
    assert publish(200, None, 4.0, drainer)  # counted: the channel's news
    assert publish(100, 1200, 4.0 + sh.HEARTBEAT_S + 1, drainer)
    assert written() == (100, 1200)


def test_a_new_term_writes_a_channel_the_other_replica_changed(store: _Store) -> None:
    """Standby, then active again: the other replica rewrote the channel
    meanwhile; what this one last wrote is no reason to skip the write."""
    key = ("ns", "p")
    now = time.monotonic()
    assert op.publish(key, 500, None, [], 4, None, now, lambda: "t")[0]
    store.objects[key]["spec"]["budgetBytes"] = 900  # the other replica's term
    assert not op.publish(key, 500, None, [], 4, None, now + 1, lambda: "t")[0]
    leadership.STATE.set(False)
    leadership.STATE.set(True)
    assert op.publish(key, 500, None, [], 4, None, now + 2, lambda: "t")[0]
    assert store.objects[key]["spec"]["budgetBytes"] == 500
