"""Opted-in pods no CheckpointPolicy selects: admission refuses them (Refuse,
the default) or admits them bare (Flag), and only on the apiserver's word;
the sweep flags those that run anyway, on the pod and on its controller;
the messages name the label and the two ways out."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
import urllib3
from prometheus_client import REGISTRY

from ckptdrain.operator import config
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import sweep, unselected, unselected_events
from ckptdrain.operator.apiserver import reads as apiserver_reads

REFUSE = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
FLAG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", unselected_pods="Flag")
LOG = logging.getLogger("test")


def policy(name: str, app: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": app}}, "model": {"parameters": "7B"},
                     "interval": "10m", "localTier": {"path": "/mnt/ckptdrain/n"},
                     "storage": {"uri": "s3://bucket/p"}}}


def opted_in(app: str) -> dict[str, Any]:
    return {"metadata": {"name": "w-0", "namespace": "ml",
                         "labels": {"app": app, "ckptdrain.io/inject": "true"}},
            "spec": {"containers": [{"name": "trainer", "image": "t"}],
                     "terminationGracePeriodSeconds": 3600}}


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The policies the apiserver lists (admission asks it when its view names none)."""
    found: list[dict[str, Any]] = []
    monkeypatch.setattr(apiserver_reads, "list_policies", lambda namespace: list(found))
    monkeypatch.setattr(apiserver_reads, "live_writers",
                        lambda namespace, name, rank, cached=False: [])
    return found


def admit(cfg: config.OperatorConfig, pod: dict[str, Any],
          candidates: list[dict[str, Any]] | None, warnings: list[str]) -> list[dict[str, Any]]:
    return asyncio.run(admission.admit_pod(pod, "ml", cfg, warnings, LOG, candidates, None))


def test_refused_only_on_the_apiservers_word(listed: list[dict[str, Any]]) -> None:
    # The view names no policy (one was created a moment ago); the apiserver
    # does: injected, never refused on a view that lags.
    listed.append(policy("llama", "llama"))
    ops = admit(REFUSE, opted_in("llama"), [], [])
    added = next(op["value"] for op in ops if op["path"] == "/spec/initContainers")
    assert "ckptdrain-agent" in [c["name"] for c in added]
    listed[:] = [policy("other", "other")]
    with pytest.raises(admission.Refused) as refused:
        admit(REFUSE, opted_in("llama"), [], [])
    assert refused.value.code == 422
    message = str(refused.value)
    assert message.startswith("metadata.labels: no CheckpointPolicy in ml selects this pod (w-0)")
    assert "ckptdrain.io/inject=true" in message
    assert "create a CheckpointPolicy in ml whose spec.selector matches" in message
    assert "remove the label ckptdrain.io/inject" in message


def test_the_refusal_shows_the_pods_labels_and_the_namespaces_selectors(
        listed: list[dict[str, Any]]) -> None:
    listed[:] = [policy(f"p{i}", f"app-{i}") for i in range(7)]
    with pytest.raises(admission.Refused) as refused:
        admit(REFUSE, opted_in("lama"), None, [])
    message = str(refused.value)
    assert '"app": "lama"' in message
    assert 'its policies: p0 selects {"matchLabels": {"app": "app-0"}}; p1 selects' in message
    assert "p4 selects" in message and "p5 selects" not in message
    assert "and 2 more" in message
    listed.clear()
    with pytest.raises(admission.Refused) as refused:
        admit(REFUSE, opted_in("lama"), None, [])
    assert "the namespace has no CheckpointPolicy" in str(refused.value)


def invalid(name: str, app: str) -> dict[str, Any]:
    body = policy(name, app)
    body["spec"]["interval"] = "often"
    return body


def test_an_invalid_policy_that_selects_the_pod_refuses_it_under_refuse(
        listed: list[dict[str, Any]]) -> None:
    listed.append(invalid("llama", "llama"))
    with pytest.raises(admission.Refused) as refused:
        admit(REFUSE, opted_in("llama"), None, [])
    message = str(refused.value)
    assert refused.value.code == 422
    assert message.startswith("metadata.labels: CheckpointPolicy llama in ml selects this "
                              "pod (w-0) but is invalid (")
    assert "interval" in message and "remove the label ckptdrain.io/inject" in message
    # Flag keeps the pod coming in bare, with a warning naming the policy.
    warnings: list[str] = []
    assert admit(FLAG, opted_in("llama"), None, warnings) == []
    assert warnings[0].startswith("ckptdrain: policy llama is invalid (")


def test_flag_admits_the_pod_bare_with_a_warning_that_says_what_to_do(
        listed: list[dict[str, Any]]) -> None:
    warnings: list[str] = []
    assert admit(FLAG, opted_in("llama"), None, warnings) == []
    assert len(warnings) == 1
    assert warnings[0].startswith("ckptdrain: no CheckpointPolicy in ml selects this pod; "
                                  "not injected")
    assert "remove the label ckptdrain.io/inject" in warnings[0]


def test_a_policy_that_selects_the_pod_is_never_unselected() -> None:
    selectors = [{"matchLabels": {"app": "a"}},
                 {"matchExpressions": [{"key": "team", "operator": "In", "values": ["x"]}]}]
    assert not unselected.selected_by_none({"app": "a"}, selectors)
    assert not unselected.selected_by_none({"team": "x", "app": "b"}, selectors)
    assert unselected.selected_by_none({"app": "b", "team": "y"}, selectors)
    assert unselected.selected_by_none({"app": "a"}, [])


def test_the_events_say_what_runs_unprotected_and_how_to_fix_it() -> None:
    on_pod = unselected.pod_event("ml")
    assert "no CheckpointPolicy in ml selects it" in on_pod
    assert "delete the pod" in on_pod and "remove the label ckptdrain.io/inject" in on_pod
    on_owner = unselected.owner_event("ml", 1, "train-0-abc")
    assert on_owner.startswith("pod train-0-abc is labelled ckptdrain.io/inject=true")
    assert "pod template" in on_owner
    assert unselected.owner_event("ml", 2000, "train-0-abc").startswith(
        "2000 of its pods (e.g. train-0-abc) are labelled ckptdrain.io/inject=true")


Posted = list[tuple[str, str, str, str, str | None, str]]


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> Posted:
    """The Events the sweep posts, on an apiserver that holds none from us yet."""
    out: Posted = []

    def post_event(body: dict[str, Any], kind: str, reason: str, message: str,
                   type_: str = "Warning", api_version: str = "") -> None:
        meta = body["metadata"]
        assert type_ == "Warning"
        if reason == "Unselected":
            # Posting them never holds the sweep's lock: other sweeps go on.
            assert sweep._lock.acquire(blocking=False)
            sweep._lock.release()
        out.append((reason, api_version, kind, meta["name"], meta.get("uid"), message))

    unselected_events.forget()
    monkeypatch.setattr(sweep.kube, "post_event", post_event)
    monkeypatch.setattr(sweep.kube, "events_posted", lambda namespace, reason: set())
    monkeypatch.setattr(sweep.kube, "patch_status_at", lambda *args: "ok")
    return out


def test_the_sweep_flags_each_unselected_pod_and_its_controller_once(posted: Posted) -> None:
    job = ("batch/v1", "Job", "train", "job-uid")
    pods = {"sw": [sweep.BarePod("w-0", "u-sel", {"app": "llama"}),
                   sweep.BarePod("x-0", "u-job", {"app": "lama"}, owner=job),
                   sweep.BarePod("y-0", "u-alone", {"app": "lama"})]}
    policies = {("sw", "llama"): [policy("llama", "llama")]}
    for _ in range(2):  # a second pass posts nothing again
        sweep.sweep_namespace("sw", pods, policies, LOG)
    unselected_events = sorted(e[:5] for e in posted if e[0] == "Unselected")
    assert unselected_events == [("Unselected", "batch/v1", "Job", "train", "job-uid"),
                                 ("Unselected", "v1", "Pod", "x-0", "u-job"),
                                 ("Unselected", "v1", "Pod", "y-0", "u-alone")]
    assert [e[3] for e in posted if e[0] == "Unprotected"] == ["w-0"]
    assert gauge("sw") == 2
    # A policy now selects them (or they went): the series goes, nothing is posted.
    policies[("sw", "lama")] = [policy("lama", "lama")]
    sweep.sweep_namespace("sw", pods, policies, LOG)
    assert gauge("sw") is None
    assert len([e for e in posted if e[0] == "Unselected"]) == 3


def test_a_job_of_many_unselected_pods_gets_one_event_with_their_count(
        posted: Posted) -> None:
    job = ("batch/v1", "Job", "train", "job-uid")
    pods = {"big": [sweep.BarePod(f"train-{i}", f"u-{i}", {"app": "lama"}, owner=job)
                    for i in range(2000)]}
    sweep.sweep_namespace("big", pods, {("big", "llama"): [policy("llama", "llama")]}, LOG)
    on_job = [e for e in posted if e[2] == "Job"]
    assert len(on_job) == 1
    assert on_job[0][5].startswith("2000 of its pods (e.g. train-0) are labelled")
    assert len([e for e in posted if e[2] == "Pod"]) == 2000


def test_after_a_restart_objects_already_flagged_by_us_are_not_flagged_again(
        posted: Posted, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str]] = []

    def events_posted(namespace: str, reason: str) -> set[str]:
        asked.append((namespace, reason))
        return {"u-0", "job-uid"}  # from before the restart

    monkeypatch.setattr(sweep.kube, "events_posted", events_posted)
    job = ("batch/v1", "Job", "train", "job-uid")
    pods = {"rs": [sweep.BarePod(f"train-{i}", f"u-{i}", {"app": "lama"}, owner=job)
                   for i in range(2)]}
    for _ in range(2):
        sweep.sweep_namespace("rs", pods, {}, LOG)
    assert [e[3] for e in posted] == ["train-1"]
    assert asked == [("rs", "Unselected")]  # once per namespace, not per pass or object


def test_a_failed_post_is_logged_retried_later_and_never_stops_the_others(
        posted: Posted, monkeypatch: pytest.MonkeyPatch) -> None:
    real = sweep.kube.post_event
    broken = {"a-0"}

    def post_event(body: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        if body["metadata"]["name"] in broken:
            raise urllib3.exceptions.MaxRetryError(None, "/api", "connection refused")
        real(body, *args, **kwargs)

    monkeypatch.setattr(sweep.kube, "post_event", post_event)
    pods = {"fl": [sweep.BarePod("a-0", "u-a", {"app": "x"}),
                   sweep.BarePod("b-0", "u-b", {"app": "x"})]}
    sweep._sweep_logged("fl", pods, {}, LOG)
    assert [e[3] for e in posted] == ["b-0"]
    broken.clear()
    sweep._sweep_logged("fl", pods, {}, LOG)
    assert [e[3] for e in posted] == ["b-0", "a-0"]


def test_a_cluster_scoped_controller_gets_no_event(posted: Posted) -> None:
    node = ("v1", "Node", "gpu-1", "node-uid")
    pods = {"mirror": [sweep.BarePod("static-gpu-1", "u-m", {"app": "x"}, owner=node)]}
    sweep.sweep_namespace("mirror", pods, {}, LOG)
    assert [(e[2], e[3]) for e in posted] == [("Pod", "static-gpu-1")]


def test_a_replica_that_stops_reconciling_drops_its_gauges(
        posted: Posted, monkeypatch: pytest.MonkeyPatch) -> None:
    pods = {"lead": [sweep.BarePod("a-0", "u-a", {"app": "x"})]}
    active = [True]
    monkeypatch.setattr(sweep.leadership, "active", lambda: active[0])
    sweep._periodic_pass(pods, {}, LOG)
    assert gauge("lead") == 1
    active[0] = False
    sweep._periodic_pass(pods, {}, LOG)
    assert gauge("lead") is None


def test_the_periodic_sweep_survives_any_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    passes: list[int] = []
    done = threading.Event()

    def periodic_pass(*args: Any) -> None:
        passes.append(1)
        if len(passes) == 1:
            raise ValueError("something no one foresaw")
        done.set()
        # Hold the (daemon) loop here: once the patch is undone it would run
        # the real pass every 10 ms, as a standby, and drop later tests' gauges.
        threading.Event().wait()

    monkeypatch.setattr(sweep, "_periodic_pass", periodic_pass)
    monkeypatch.setattr(sweep, "_periodic_started", threading.Event())
    cfg = config.OperatorConfig(allowed_root="/mnt/ckptdrain", watchdog_s=0.01)
    sweep._start_periodic(cfg, {}, {}, LOG)
    assert done.wait(5)


def test_a_pod_that_finished_or_goes_leaves_the_index() -> None:
    # Kopf keeps an object's previous entry when its indexer returns None.
    job = {"metadata": {"name": "w-0", "uid": "u", "labels": {"ckptdrain.io/inject": "true"}},
           "spec": {"containers": [{"name": "t", "image": "t"}]}}
    running = sweep.unprotected_index(namespace="ml", name="w-0", body=job,
                                      meta=job["metadata"], status={"phase": "Running"})
    assert running["ml"].name == "w-0"
    for status, meta in (({"phase": "Succeeded"}, job["metadata"]),
                         ({"phase": "Failed"}, job["metadata"]),
                         ({"phase": "Running"},
                          {**job["metadata"], "deletionTimestamp": "2026-11-29T00:00:00Z"})):
        assert sweep.unprotected_index(namespace="ml", name="w-0", body=job, meta=meta,
                                       status=status) == {}


def test_an_injected_pod_whose_policy_was_deleted_is_flagged_until_it_is_back(
        posted: Posted, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep.leadership, "active", lambda: True)
    job = ("batch/v1", "Job", "train", "job-uid")
    injected = {"gone": [sweep.BarePod("train-0", "u-0", {}, owner=job, policy="llama"),
                         sweep.BarePod("train-1", "u-1", {}, owner=job, policy="llama"),
                         sweep.BarePod("kept-0", "u-k", {}, policy="kept")]}
    policies: dict[tuple[str, str], list[dict[str, Any]]] = {
        ("gone", "kept"): [policy("kept", "kept")]}
    clock = [1000.0]
    monkeypatch.setattr(sweep, "_clock", lambda: clock[0])
    # No bare pod anywhere: the periodic pass still finds the namespace; the
    # policy has just gone missing, a replace may bring it back.
    sweep._periodic_pass({}, policies, LOG, injected, orphan_grace_s=30)
    assert posted == []
    clock[0] += 30  # missing for a whole period: flagged
    sweep._periodic_pass({}, policies, LOG, injected, orphan_grace_s=30)
    assert sorted(e[3] for e in posted) == ["train", "train-0", "train-1"]
    on_pod = next(e[5] for e in posted if e[3] == "train-0")
    assert on_pod.startswith("labelled ckptdrain.io/inject=true and injected for "
                             "CheckpointPolicy llama, which no longer exists in gone")
    on_job = next(e[5] for e in posted if e[3] == "train")
    assert on_job.startswith("2 of its pods (e.g. train-0) are labelled "
                             "ckptdrain.io/inject=true and injected for CheckpointPolicy llama")
    assert gauge("gone") == 2
    # The policy is back: nothing more to flag, the series goes.
    policies[("gone", "llama")] = [policy("llama", "llama")]
    sweep._periodic_pass({}, policies, LOG, injected, orphan_grace_s=30)
    assert gauge("gone") is None
    assert len(posted) == 3


def test_a_policy_replaced_within_the_grace_flags_nothing(
        posted: Posted, monkeypatch: pytest.MonkeyPatch) -> None:
    """kubectl replace --force: DELETED, a fast sweep, then the policy again."""
    clock = [0.0]
    monkeypatch.setattr(sweep, "_clock", lambda: clock[0])
    injected = {"rp": [sweep.BarePod("train-0", "u-r0", {}, policy="llama")]}
    back = {("rp", "llama"): [policy("llama", "llama")]}
    sweep.sweep_namespace("rp", {}, {}, LOG, injected, orphan_grace_s=30)  # deleted
    clock[0] += 2
    sweep.sweep_namespace("rp", {}, back, LOG, injected, orphan_grace_s=30)  # re-created
    # Deleted again later: the grace starts over, it does not count from the first.
    clock[0] += 60
    sweep.sweep_namespace("rp", {}, {}, LOG, injected, orphan_grace_s=30)
    assert posted == [] and gauge("rp") is None
    clock[0] += 30
    sweep.sweep_namespace("rp", {}, {}, LOG, injected, orphan_grace_s=30)
    assert [e[3] for e in posted] == ["train-0"] and gauge("rp") == 1


def test_a_policy_whose_status_write_fails_stops_neither_the_others_nor_the_unselected(
        posted: Posted, monkeypatch: pytest.MonkeyPatch) -> None:
    patched: list[str] = []

    def patch_status_at(plural: str, namespace: str, name: str, change: Any,
                        version: str) -> str:
        if name == "broken":
            raise sweep.kube.ApiException(status=500, reason="etcd timeout")
        patched.append(name)
        return "ok"

    monkeypatch.setattr(sweep.kube, "patch_status_at", patch_status_at)
    pods = {"pf": [sweep.BarePod("a-0", "u-pa", {"app": "a"}),
                   sweep.BarePod("b-0", "u-pb", {"app": "b"}),
                   sweep.BarePod("lone-0", "u-pl", {"app": "none"})]}
    policies = {("pf", "broken"): [policy("broken", "a")], ("pf", "fine"): [policy("fine", "b")]}
    assert sweep.sweep_namespace("pf", pods, policies, LOG) == {"broken": 1, "fine": 1}
    assert patched == ["fine"]
    assert sorted((e[0], e[3]) for e in posted) == [
        ("Unprotected", "b-0"), ("Unselected", "lone-0")]
    assert gauge("pf") == 1
    # The failed policy's pod gets its Event when the write goes through.
    monkeypatch.setattr(sweep.kube, "patch_status_at", lambda *args: "ok")
    sweep.sweep_namespace("pf", pods, policies, LOG)
    assert ("Unprotected", "a-0") in [(e[0], e[3]) for e in posted]


def test_the_injected_index_holds_live_pods_with_their_policy() -> None:
    meta = {"name": "w-0", "uid": "u", "annotations": {"ckptdrain.io/policy": "llama",
                                                       "ckptdrain.io/injected": "true"}}
    body = {"metadata": meta}
    live = sweep.injected_pods_index(namespace="ml", name="w-0", body=body, meta=meta,
                                     status={"phase": "Running"})
    assert (live["ml"].name, live["ml"].policy) == ("w-0", "llama")
    assert sweep.injected_pods_index(namespace="ml", name="w-0", body=body, meta=meta,
                                     status={"phase": "Succeeded"}) == {}


def gauge(namespace: str) -> float | None:
    return REGISTRY.get_sample_value("ckptdrain_unselected_pods", {"namespace": namespace})
