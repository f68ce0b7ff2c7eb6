"""admission/census.py's pass over one namespace: each policy's census from
the pod index, written only when it changes and only at the resourceVersion
it was computed from, one policy's failed write stopping no other; and when
passes run (pod events that change nothing the census sees schedule none,
a new term of leadership counts every namespace)."""

from __future__ import annotations

import copy
import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from ckptdrain.operator.admission import census
from ckptdrain.operator.admission import protection as pr
from ckptdrain.operator.apiserver import kube
from ckptdrain.operator.policy import readiness
from ckptdrain.operator.policy import status as st
from ckptdrain.sizing import SizingInput, compute

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LOG = logging.getLogger("test")


def _policy(name: str, generation: int = 1, version: str = "1") -> dict[str, Any]:
    status = st.for_sizing(compute(SizingInput(parameters=1e9, interval_s=900)), generation,
                           NOW)
    return {"metadata": {"name": name, "namespace": "ml", "generation": generation,
                         "resourceVersion": version},
            "spec": {"selector": {"matchLabels": {"app": name}}}, "status": status}


class Apiserver:
    """Policies as the apiserver holds them: a status merge patch applies only
    at the current resourceVersion, and bumps it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *bodies: dict[str, Any]) -> None:
        self.stored = {b["metadata"]["name"]: copy.deepcopy(b) for b in bodies}
        self.written: dict[str, dict[str, Any]] = {}
        self.fail: set[str] = set()
        monkeypatch.setattr(kube, "patch_status_at", self.patch)
        monkeypatch.setattr(kube, "read_own", self.read)

    def patch(self, plural: str, namespace: str, name: str, change: dict[str, Any],
              version: str) -> str:
        if name in self.fail:
            raise kube.ApiException(status=500, reason="etcd leader changed")
        body = self.stored.get(name)
        if body is None:
            return "gone"
        if body["metadata"]["resourceVersion"] != version:
            return "conflict"
        body["status"].update(copy.deepcopy(change))  # a merge patch: lists replaced
        body["metadata"]["resourceVersion"] = str(int(version) + 1)
        self.written[name] = change
        return "ok"

    def read(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.stored.get(name)
        return copy.deepcopy(found) if found else None


def test_a_pass_writes_each_policy_once_and_then_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    policies = {("ml", "a"): [_policy("a")], ("ml", "b"): [_policy("b")],
                ("other", "c"): [_policy("c")]}
    server = Apiserver(monkeypatch, *(b[0] for b in policies.values()))
    pods = {"ml": [
        pr.PodView("bare", labels={"app": "a"}),
        pr.PodView("a-0", policy="a", injected=True, agent=pr.RUNNING, phase="Running"),
        pr.PodView("b-0", policy="b", injected=True, agent=pr.RUNNING, phase="Running"),
        pr.PodView("b-1", policy="b", injected=True, agent=pr.WAITING,
                   created=NOW),
        pr.PodView("b-2", policy="b", injected=True, agent=pr.WAITING, scheduled=False)]}
    assert census.count_namespace("ml", pods["ml"], policies, LOG, NOW) == 2  # type: ignore[arg-type]
    written = server.written
    assert written["a"]["pods"] == {"selected": 2, "protected": 1, "starting": 0,
                                    "waiting": 0, "unprotected": 1, "observedGeneration": 1}
    assert written["a"]["phase"] == "Unprotected" and "bare" in next(
        c for c in written["a"]["conditions"] if c["type"] == "Ready")["message"]
    assert written["b"] == {"pods": {"selected": 3, "protected": 1, "starting": 1,
                                     "waiting": 1, "unprotected": 0,
                                     "observedGeneration": 1}}
    assert "c" not in written  # another namespace's policy
    # The index catches up with the apiserver: the next pass has nothing to write.
    for key, name in ((("ml", "a"), "a"), (("ml", "b"), "b")):
        policies[key] = [copy.deepcopy(server.stored[name])]
    written.clear()
    assert census.count_namespace("ml", pods["ml"], policies, LOG, NOW) == 0  # type: ignore[arg-type]
    assert written == {}


def test_a_stale_copy_never_reverts_a_newer_invalid_verdict(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The index still holds the valid policy; the user's edit made it
    # invalid and the sizing pass already wrote InvalidSpec (version 2).
    stale = _policy("p")
    fresh = copy.deepcopy(stale)
    fresh["metadata"].update(generation=2, resourceVersion="2")
    fresh["status"].update(st.for_invalid("spec.interval: bad", 2, NOW,
                                          stale["status"]["conditions"]))
    server = Apiserver(monkeypatch, fresh)
    pods = [pr.PodView("bare", labels={"app": "p"})]
    census.count_namespace("ml", pods, {("ml", "p"): [stale]}, LOG, NOW)  # type: ignore[arg-type]
    stored = server.stored["p"]["status"]
    assert stored["phase"] == "Invalid"
    ready = next(c for c in stored["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert stored["pods"]["unprotected"] == 1  # the counts are still written
    assert not readiness.needs_count(server.stored["p"])


def test_failed_writes_stop_no_other_and_the_pass_raises(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    policies = {("ml", "a"): [_policy("a")], ("ml", "b"): [_policy("b")]}
    server = Apiserver(monkeypatch, policies[("ml", "a")][0], policies[("ml", "b")][0])
    server.fail.add("a")
    with pytest.raises(kube.ApiException):  # its Coalescer retries the pass
        census.count_namespace("ml", [], policies, LOG, NOW)  # type: ignore[arg-type]
    assert list(server.written) == ["b"]
    assert "writing the pod census of policy ml/a failed" in caplog.text


def test_a_policy_changing_under_every_write_fails_the_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = Apiserver(monkeypatch, _policy("a", version="9"))
    body = _policy("a", version="1")
    monkeypatch.setattr(kube, "read_own", lambda *a: copy.deepcopy(body))
    with pytest.raises(RuntimeError, match="changed under 3 status writes"):
        census.count_namespace("ml", [], {("ml", "a"): [body]}, LOG, NOW)  # type: ignore[arg-type]
    assert server.written == {}


def test_the_starting_limit_is_the_passes_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    server = Apiserver(monkeypatch, _policy("a"))
    pods = [pr.PodView("a-0", policy="a", injected=True, agent=pr.WAITING,
                       created=NOW - timedelta(minutes=3))]
    census.count_namespace("ml", pods, {("ml", "a"): [_policy("a")]}, LOG,  # type: ignore[arg-type]
                           NOW, limit_s=120)
    assert server.written["a"]["pods"]["unprotected"] == 1


def test_only_pod_events_that_change_the_census_schedule_a_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scheduled: list[str] = []
    monkeypatch.setattr(census, "_schedule", lambda namespace, logger: scheduled.append(
        namespace))
    monkeypatch.setattr(census, "_start", lambda *a: None)
    monkeypatch.setattr(census, "_store", census.PodStore())
    body = {"metadata": {"name": "w-0", "labels": {"app": "a"},
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n"}, "status": {"phase": "Running"}}

    def event(kind: str, pod: dict[str, Any]) -> None:
        census.pod_census_event(type=kind, namespace="ml", name="w-0", body=pod,  # type: ignore[arg-type]
                                memo=SimpleNamespace(config=None), logger=LOG,
                                checkpointpolicy_index={})

    event("ADDED", body)
    progressed = copy.deepcopy(body)
    progressed["metadata"]["annotations"] = {"ckptdrain.io/progress": "step=7"}
    event("MODIFIED", progressed)  # nothing the census sees
    assert scheduled == ["ml"]
    relabelled = copy.deepcopy(body)
    relabelled["metadata"]["labels"] = {"app": "b"}
    event("MODIFIED", relabelled)
    event("DELETED", relabelled)
    event("DELETED", relabelled)  # already gone
    assert scheduled == ["ml", "ml", "ml"]


def test_a_new_term_and_the_period_schedule_every_namespace_through_the_coalescer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(census._passes, "schedule",
                        lambda key, run, logger, delay: asked.append(key) or True)
    monkeypatch.setattr(census, "_wiring", {
        "policies": {("b", "x"): [{}], ("a", "y"): [{}], ("a", "z"): [{}]}})
    census._schedule_all()
    assert asked == ["a", "b"]
    # A new term lists the pods first (the pass then counts every namespace).
    assert census._new_term in census.leadership.STATE._resets
    assert census._schedule_all not in census.leadership.STATE._resets


def test_the_list_drops_pods_deleted_unseen_and_then_counts_every_namespace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = census.PodStore()
    for name in ("ghost", "live"):
        store.see("ml", name, pr.PodView(name, labels={"app": "a"}), 0.0)
    monkeypatch.setattr(census, "_store", store)
    monkeypatch.setattr(census, "_wiring", {"config": SimpleNamespace(namespace=""),
                                            "policies": {("ml", "a"): [{}]}})
    listed: list[tuple[str | None, str]] = []

    def list_pods(scope: str | None, selector: str) -> set[tuple[str, str]]:
        listed.append((scope, selector))
        # A pod created while the LIST runs: its event lands before the answer.
        store.see("ml", "new", pr.PodView("new", labels={"app": "a"}), 10**9)
        return {("ml", "live")}

    monkeypatch.setattr(kube, "list_pod_names", list_pods)
    asked: list[Any] = []
    monkeypatch.setattr(census._passes, "schedule",
                        lambda key, run, logger, delay: asked.append(key) or True)
    monkeypatch.setattr(census, "_hold", census.TermHold())
    census._new_term()  # a new term holds every count until the LIST
    assert asked == [census.RECONCILE_KEY] and census._hold.is_set()
    counted: list[str] = []
    monkeypatch.setattr(census, "count_namespace", lambda ns, *a, **k: counted.append(ns))
    census._count("ml", LOG)  # a pass a resuming watch asked for: it waits
    assert counted == []
    asked.clear()
    census.reconcile()
    assert not census._hold.is_set()
    assert listed == [(None, "ckptdrain.io/inject=true")]
    assert sorted(v.name for v in store.views("ml")) == ["live", "new"]
    assert asked == ["ml"]


def test_a_failed_list_still_counts_and_raises_for_a_retry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(census, "_wiring", {"config": SimpleNamespace(namespace="ml"),
                                            "policies": {("ml", "a"): [{}]}})

    def fail(scope: str | None, selector: str) -> set[tuple[str, str]]:
        raise kube.ApiException(status=500)

    monkeypatch.setattr(kube, "list_pod_names", fail)
    asked: list[Any] = []
    monkeypatch.setattr(census._passes, "schedule",
                        lambda key, run, logger, delay: asked.append(key) or True)
    with pytest.raises(kube.ApiException):
        census.reconcile()
    assert asked == ["ml"]


def test_a_policy_s_events_recount_it_only_when_its_status_calls_for_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scheduled: list[str] = []
    monkeypatch.setattr(census, "_schedule", lambda namespace, logger: scheduled.append(
        namespace))
    monkeypatch.setattr(census, "_start", lambda *a: None)
    body = _policy("p")

    def event(kind: str = "MODIFIED") -> None:
        census.policy_census_event(type=kind, namespace="ml", name="p", body=body,  # type: ignore[arg-type]
                                   memo=SimpleNamespace(config=None), logger=LOG,
                                   checkpointpolicy_index={})

    event()
    assert scheduled == ["ml"]  # never counted
    body["status"]["pods"] = readiness.pods_field({"selected": 0, "protected": 0,
                                                   "starting": 0, "waiting": 0,
                                                   "unprotected": 0}, 1)
    event()
    assert scheduled == ["ml"]  # self-consistent: no recount
    event("ADDED")
    assert scheduled == ["ml", "ml"]
    event("DELETED")
    assert scheduled == ["ml", "ml"]


def test_a_hold_ends_with_a_warning_when_the_list_never_does(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    hold = census.TermHold(clock=lambda: now[0])
    hold.begin()
    now[0] = census.HOLD_LOG_EVERY_S
    with caplog.at_level(logging.INFO, logger="ckptdrain.census"):
        assert hold.held()
        assert "waits for the LIST" in caplog.text
        now[0] = census.HOLD_LIMIT_S
        assert not hold.held() and not hold.is_set()
    assert any(r.levelno == logging.WARNING and "counts again" in r.getMessage()
               for r in caplog.records)


def test_a_list_begun_before_a_new_term_does_not_end_its_hold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(census, "_wiring", {"config": SimpleNamespace(namespace="ml"),
                                            "policies": {("ml", "a"): [{}]}})
    monkeypatch.setattr(census, "_hold", census.TermHold())
    monkeypatch.setattr(census, "_store", census.PodStore())
    monkeypatch.setattr(census._passes, "schedule", lambda *a, **k: True)

    def list_pods(scope: str | None, selector: str) -> set[tuple[str, str]]:
        census._new_term()  # the replica stood by and came back while this LIST ran
        return set()

    monkeypatch.setattr(kube, "list_pod_names", list_pods)
    census.reconcile()
    assert census._hold.is_set()  # the new term's own LIST ends it
    monkeypatch.setattr(kube, "list_pod_names", lambda scope, selector: set())
    census.reconcile()
    assert not census._hold.is_set()


def test_a_standby_does_not_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(census, "_wiring", {"config": SimpleNamespace(namespace="ml"),
                                            "policies": {("ml", "a"): [{}]}})
    monkeypatch.setattr(census.leadership, "active", lambda: False)
    listed: list[str | None] = []
    monkeypatch.setattr(kube, "list_pod_names",
                        lambda scope, selector: listed.append(scope) or set())
    census.reconcile()
    assert listed == []


def test_a_sizing_pass_during_a_hold_leaves_a_counted_policy_s_pods_as_they_were(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = census.PodStore()
    store.see("ml", "ghost", pr.PodView("ghost", labels={"app": "a"}), 0.0)  # deleted unseen
    monkeypatch.setattr(census, "_store", store)
    monkeypatch.setattr(census, "_hold", census.TermHold())
    census._hold.begin()
    selector = {"matchLabels": {"app": "a"}}
    assert census.policy_census("ml", "p", selector, NOW, counted_before=True) is None
    # Never counted: counted now, ghosts only adding to its unprotected pods.
    assert census.policy_census("ml", "p", selector, NOW).unprotected == ("ghost",)
    census._hold.release(census._hold.term())
    assert census.policy_census("ml", "p", selector, NOW, counted_before=True) is not None
