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
from ckptdrain.operator import config, kube, policy
from ckptdrain.operator import share_channel as op

WANTED, BUDGET = 1000, 500  # published with a factor of 0.5, scale generation 3


def _channel(**over: Any) -> sh.Allocation:
    base: dict[str, Any] = {"policy": "p", "budget": BUDGET, "drainers": 2,
                            "active_ranks": "0-1", "writers": 4, "wanted": WANTED,
                            "scale_generation": 3}
    base.update(over)
    return sh.Allocation(**base)


def _scale(factor: float, generation: int) -> sh.Scale:
    return sh.scale_from_object({"metadata": {"generation": generation},
                                 "spec": sh.scale_spec(factor, 10_000)})


def test_a_newer_scale_moves_the_budget_an_older_or_equal_one_does_not() -> None:
    a = _channel()
    assert a.budget_under(None) == BUDGET  # no scale published (an older operator)
    assert a.budget_under(_scale(0.5, 3)) == BUDGET  # the one it was computed with
    assert a.budget_under(_scale(0.9, 2)) == BUDGET  # an older one: the channel knows better
    assert a.budget_under(_scale(0.25, 4)) == 250  # a smaller factor since
    assert a.budget_under(_scale(1.0, 5)) == WANTED  # the cap no longer binds
    assert a.share(_scale(0.25, 4)) == 125 and a.fallback_cap(_scale(0.25, 4)) == 62.5
    # An older operator's channel (no wanted budget, no generation): the scale never applies.
    assert _channel(wanted=None, scale_generation=None).budget_under(_scale(0.1, 9)) == BUDGET


def test_the_channel_round_trips_its_wanted_budget_and_scale_generation() -> None:
    a = _channel()
    assert sh.from_object(sh.body("ns", a, None)) == a
    for field, value in (("wantedBytes", 0), ("scaleGeneration", "3"), ("scaleGeneration", True)):
        obj = sh.body("ns", a, None)
        obj["spec"][field] = value
        with pytest.raises(InvalidInput) as err:
            sh.from_object(obj)
        assert err.value.field == f"spec.{field}"


def test_the_scale_object_round_trips_and_a_malformed_one_names_its_field() -> None:
    body = sh.scale_body("ns", sh.scale_spec(0.25, 4e9))
    assert body["metadata"]["name"] == sh.SCALE_NAME
    assert sh.scale_from_object({**body, "metadata": {"generation": 7}}) == \
        sh.Scale(factor=0.25, generation=7, cluster_cap=4_000_000_000)
    uncapped = sh.scale_body("ns", sh.scale_spec(1.0, None))
    assert "clusterCapBytes" not in uncapped["spec"]["clusterScale"]
    cases = [({"factor": 0}, "spec.clusterScale.factor"),
             ({"factor": 1.5}, "spec.clusterScale.factor"),
             ({"factor": "0.5"}, "spec.clusterScale.factor"),
             ({"factor": float("nan")}, "spec.clusterScale.factor"),
             ({"factor": 0.5, "clusterCapBytes": 0}, "spec.clusterScale.clusterCapBytes")]
    for scale, field in cases:
        with pytest.raises(InvalidInput) as err:
            sh.scale_from_object({"metadata": {"generation": 1}, "spec": {"clusterScale": scale}})
        assert err.value.field == field
    with pytest.raises(InvalidInput) as err:
        sh.scale_from_object({"metadata": {}, "spec": {"clusterScale": {"factor": 0.5}}})
    assert err.value.field == "metadata.generation"
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


def test_an_admitted_agent_follows_the_scale_without_its_channel_rewritten() -> None:
    file = Share(10_000.0, "file")
    assert resolve_channel(_view(None), 11.0, file) == Share(250.0, "channel")
    assert resolve_channel(_view(_scale(0.2, 4)), 11.0, file) == Share(100.0, "channel")
    # The fallback is capped by the scaled budget too: never over it while the cap binds.
    idle = resolve_channel(_view(_scale(0.2, 4), admitted=False, draining=False), 11.0, file)
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


def test_a_scale_not_seen_or_unreadable_makes_the_channel_not_current() -> None:
    channel = ShareChannel("ns", "p", rank=0, pod="w0", pending=lambda: 1,
                           reported=lambda: 0.0, api=_Api({}), clock=lambda: 5.0)
    channel._accept(sh.body("ns", _channel(), None) | {"metadata": {"resourceVersion": "1"}})
    assert channel.view().broken  # the scale watch has not listed yet
    channel.scale._accept({"metadata": {"resourceVersion": "2", "generation": 4},
                           "spec": sh.scale_spec(0.2, 1e9)})
    view = channel.view()
    assert not view.broken and view.scale == sh.Scale(0.2, 4, 1_000_000_000)
    assert view.admitted and resolve_channel(view, 5.0, Share(1e9, "file")).rate == 100.0
    channel.scale._accept({"metadata": {"resourceVersion": "3", "generation": 5},
                           "spec": {"clusterScale": {"factor": 2}}})
    view = channel.view()
    assert view.broken and view.scale is None  # a smaller factor could hide behind it
    # Not current: the smaller of the channel's share and the fallback.
    assert resolve_channel(view, 5.0, Share(100.0, "file")).rate == 100.0
    channel.scale._accept(None)  # deleted (or never published by an older operator)
    assert not channel.view().broken and channel.view().scale is None


class _Store:
    """kube.write_object as the apiserver answers it: generation moves with the spec."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []

    def write_object(self, plural: str, namespace: str, body: dict[str, Any],
                     patch: dict[str, Any] | None = None) -> dict[str, Any]:
        key = (namespace, body["metadata"]["name"])
        self.writes.append(key)
        old = self.objects.get(key)
        spec = {**(old or {}).get("spec", {}), **(patch or body)["spec"]}
        generation = 1 if old is None else old["metadata"]["generation"] \
            + (spec != old["spec"])
        self.objects[key] = {"metadata": {"generation": generation}, "spec": spec}
        return self.objects[key]


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = _Store()
    monkeypatch.setattr(kube, "write_object", fake.write_object)
    op.forget()
    yield fake
    op.forget()


def test_the_operator_writes_the_scale_once_per_namespace_and_only_when_it_moves(
        store: _Store) -> None:
    assert op.publish_scale(["a", "b", "a"], 1.0, 4e9) == {"a": 1, "b": 1}
    assert op.publish_scale(["a", "b"], 1.0, 4e9) == {"a": 1, "b": 1}
    assert len(store.writes) == 2  # unchanged: no write
    assert op.publish_scale(["a", "b"], 0.5, 4e9) == {"a": 2, "b": 2}
    assert len(store.writes) == 4
    op.forget()  # a new active replica writes once more, whatever it finds
    assert op.publish_scale(["a"], 0.5, 4e9) == {"a": 2}
    assert len(store.writes) == 5


def test_a_channel_is_not_rewritten_when_only_the_factor_moved(store: _Store) -> None:
    key, drainers = ("ns", "p"), [op.Drainer("w0", 0)]
    start = time.monotonic()  # what the channel stamps its writes with

    def publish(budget: float, wanted: float, generation: int, at: float) -> bool:
        return op.publish(key, budget, None, drainers, 4, None, start + at, lambda: "t",
                          wanted=wanted, scale_generation=generation)[0]

    assert publish(500, 1000, 3, 0.0)
    assert not publish(250, 1000, 4, 1.0)  # the scale says it: no write
    assert publish(300, 1200, 4, 2.0)  # the policy wants more: its own news
    written = store.objects[("ns", "p")]["spec"]
    assert (written["budgetBytes"], written["wantedBytes"], written["scaleGeneration"]) == \
        (300, 1200, 4)
    # The heartbeat still comes, with the budget and generation of the day.
    assert publish(150, 1200, 5, 2.0 + sh.HEARTBEAT_S)
    assert store.objects[("ns", "p")]["spec"]["scaleGeneration"] == 5
