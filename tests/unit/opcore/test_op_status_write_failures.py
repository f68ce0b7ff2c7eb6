"""A policy status write that keeps losing to other writers (or fails) stops
no other policy's pass: the stall watchdog judges every policy and raises the
first failure at the end; policies a class event re-judges are reconciled as
passes of their own, retried, and the classes' statuses are written first."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from ckptdrain.operator import class_events
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.records import watchdog

LOG = logging.getLogger("test")


def _body(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "generation": 1,
                         "resourceVersion": "1"}, "spec": {}, "status": {}}


def test_one_policy_s_failing_stall_write_stops_no_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    judged: list[str] = []

    def check_one(key: tuple[str, str], *args: Any) -> None:
        judged.append(key[1])
        if key[1] == "busy":
            raise RuntimeError("policies ml/busy changed under 3 status writes in a row")

    monkeypatch.setattr(watchdog, "_check_one", check_one)
    policies = {("ml", "busy"): [_body("busy")], ("ml", "quiet"): [_body("quiet")]}
    joint = {key: (SimpleNamespace(), None, None) for key in policies}
    with pytest.raises(RuntimeError, match="busy"):
        watchdog.check(policies, {}, {}, joint)  # type: ignore[arg-type]
    assert judged == ["busy", "quiet"]


def test_a_class_event_reconciles_each_policy_as_a_retried_pass_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    done = threading.Event()

    def reconcile(body: Any, **_: Any) -> None:
        name = body["metadata"]["name"]
        calls.append(name)
        if calls.count("a") == 1 and name == "a":
            raise RuntimeError("policies ml/a changed under 5 status writes in a row")
        if "b" in calls and calls.count("a") == 2:
            done.set()

    statuses: list[bool] = []
    monkeypatch.setattr(class_events, "reconcile_policy", reconcile)
    monkeypatch.setattr(class_events, "stale", lambda cfg, body: True)
    monkeypatch.setattr(class_events, "_class_statuses", lambda logger: statuses.append(True))
    monkeypatch.setattr(class_events, "_rejudged", Coalescer("test", retry_delay=0.05))
    monkeypatch.setattr(class_events.class_view.CLASSES, "apply", lambda *a: None)
    monkeypatch.setattr(class_events, "start_recheck", lambda *a: None)  # no thread here
    monkeypatch.setattr(class_events, "_rebalance_if_bandwidth_moved", lambda *a: None)
    index = {("ml", "a"): [_body("a")], ("ml", "b"): [_body("b")]}
    kwargs = {name: {} for name in class_events.INDEXES} | {"checkpointpolicy_index": index}
    class_events.checkpointclass_event(event={"type": "MODIFIED", "object": {}},  # type: ignore[arg-type]
                                       memo=SimpleNamespace(config=None), logger=LOG,  # type: ignore[arg-type]
                                       **kwargs)
    assert statuses == [True]  # the classes' own statuses do not wait for the policies
    assert done.wait(10), calls
    assert sorted(calls) == ["a", "a", "b"]


def test_a_class_event_s_reconcile_runs_in_the_context_of_the_handler_that_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Kopf's settings and event queue live in context variables of its
    handlers; a reconcile posts its InvalidSpec Event with kopf.warn, which
    reads them. The Coalescer's worker threads have an empty context: the
    pass must carry the handler's."""
    from kopf._core.engines import posting

    seen: list[Any] = []
    done = threading.Event()

    def reconcile(body: Any, **_: Any) -> None:
        seen.append(posting.settings_var.get(None))
        done.set()

    monkeypatch.setattr(class_events, "reconcile_policy", reconcile)
    monkeypatch.setattr(class_events, "stale", lambda cfg, body: True)
    monkeypatch.setattr(class_events, "_rejudged", Coalescer("test", retry_delay=0.05))
    settings = object()
    token = posting.settings_var.set(settings)  # type: ignore[arg-type]
    try:
        index = {("ml", "a"): [_body("a")]}
        indexes = {name: {} for name in class_events.INDEXES} | {
            "checkpointpolicy_index": index}
        class_events._schedule(("ml", "a"), SimpleNamespace(config=None), LOG,  # type: ignore[arg-type]
                               indexes, "its class changed")
    finally:
        posting.settings_var.reset(token)
    assert done.wait(10)
    assert seen == [settings]
