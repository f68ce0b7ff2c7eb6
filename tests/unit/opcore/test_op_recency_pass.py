"""The recency pass (recency/publish.py) over a fake apiserver: one write per
workload when the document changes, Kueue Workloads found by label and
listed once per owner chain, one policy per shared workload, nothing from
a standby, failures left alone for RETRY_S, nothing kept for objects gone."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ckptdrain.operator import config
from ckptdrain.operator.apiserver import workload_objects
from ckptdrain.operator.kueue import report
from ckptdrain.operator.recency import after_pass, kueue, owners, publish
from ckptdrain.operator.recency import metrics as recency_metrics
from ckptdrain.operator.recency.document import ANNOTATION_RECENCY as ANNOTATION

T = {100: "2026-11-29T10:00:00Z", 200: "2026-11-29T10:15:00Z", 300: "2026-11-29T10:30:00Z"}
RECORDS = [{"metadata": {"name": f"llama-s{s}", "creationTimestamp": t},
            "spec": {"policy": "llama", "step": s, "writers": 2}} for s, t in T.items()]
KUEUE = "kueue.x-k8s.io/v1beta1"
CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")


def obj(api_version: str, kind: str, name: str, uid: str,
        owner: dict[str, Any] | None = None, controller: bool = True,
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": uid, "annotations": {},
                            "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                    "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"], "controller": controller}]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def ref_to(o: dict[str, Any]) -> owners.Ref:
    return owners.Ref(o["apiVersion"], o["kind"], o["metadata"]["name"], o["metadata"]["uid"])


TRAIN = obj("trainer.kubeflow.org/v1alpha1", "TrainJob", "t", "u-t")
JOBSET = obj("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "u-js", TRAIN)
JOB = obj("batch/v1", "Job", "js-workers-0", "u-j", JOBSET)
EVAL = obj("batch/v1", "Job", "js-eval-0", "u-e", JOBSET)
QUEUED = obj(KUEUE, "Workload", "jobset-js-1", "u-w", JOBSET, controller=False,
             labels={kueue.JOB_UID_LABEL: "u-js"})


class Api:
    """workload_objects as the pass calls it, over a dict of objects."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {(o["apiVersion"], o["metadata"]["name"]): o
                        for o in copy.deepcopy(list(objects))}
        self.version: str | None = KUEUE
        self.reads: list[str] = []
        self.lists: list[str] = []
        self.patches: list[tuple[str, str]] = []
        self.refuse: dict[str, int] = {}  # name -> status
        self.broken = False

    def read(self, api_version: str, plural: str, namespace: str, name: str
             ) -> dict[str, Any] | None:
        self.reads.append(name)
        if self.broken:
            raise ApiException(status=500)
        return self.objects.get((api_version, name))

    def annotate(self, api_version: str, plural: str, namespace: str, name: str, key: str,
                 value: str) -> bool:
        self.patches.append((name, value))
        if name in self.refuse:
            if self.refuse[name] == 404:
                return False
            raise ApiException(status=self.refuse[name])
        if (api_version, name) not in self.objects:
            return False  # 404
        self.objects[(api_version, name)]["metadata"]["annotations"][key] = value
        return True

    def list_in(self, api_version: str, plural: str, namespace: str,
                label_selector: str) -> list[dict[str, Any]] | None:
        self.lists.append(label_selector)
        if api_version != self.version:
            return None
        uids = label_selector.split(" in (", 1)[1].rstrip(")").split(",")
        return [o for (v, _), o in self.objects.items() if v == api_version
                and o["metadata"]["labels"].get(kueue.JOB_UID_LABEL) in uids]

    def served_version(self, group: str, plural: str) -> str | None:
        return self.version


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    fake = Api(TRAIN, JOBSET, JOB, EVAL, QUEUED,
               # Labelled for the JobSet by mistake, owned by nobody: never written.
               obj(KUEUE, "Workload", "stranger", "u-x", labels={kueue.JOB_UID_LABEL: "u-js"}))
    for name in ("read", "annotate", "list_in", "served_version"):
        monkeypatch.setattr(publish.workload_objects, name, getattr(fake, name))
    kueue.forget()
    yield fake
    for key in (KEY, EVAL_KEY):
        publish.forget(key)
    publish._new_term()
    publish._logged.clear()


def policy(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "llama", "namespace": "ns"}, "status": status}


LOG = logging.getLogger("test")
KEY, EVAL_KEY = ("ns", "llama"), ("ns", "zeval")


def series(**labels: str) -> list[dict[str, str]]:
    return [s.labels for m in recency_metrics.CHECKPOINT_STEP.collect() for s in m.samples
            if labels.items() <= s.labels.items()]


def test_one_write_per_workload_when_the_document_changes(api: Api) -> None:
    pods = [ref_to(JOB)] * 8  # eight pods of one Job: one workload
    assert publish.publish(KEY, policy(lastLocalStep=100), pods, RECORDS, LOG) is None
    # The top-most owner and the Kueue Workload it owns, once each.
    assert sorted(n for n, _ in api.patches) == ["jobset-js-1", "t"]
    assert json.loads(api.patches[0][1])["pod"] == {"step": 100, "time": T[100]}
    publish.publish(KEY, policy(lastLocalStep=100), pods, RECORDS, LOG)
    assert len(api.patches) == 2  # unchanged: nothing written
    publish.publish(KEY, policy(lastLocalStep=200), pods, RECORDS, LOG)
    assert len(api.patches) == 4
    assert api.reads.count("js-workers-0") == 1  # walked once


def test_kueue_workloads_are_listed_by_the_chains_uids_once_per_chain(api: Api) -> None:
    for step in (100, 200, 300):
        publish.publish(KEY, policy(lastLocalStep=step), [ref_to(JOB)], RECORDS, LOG)
    # Never the whole namespace: only what Kueue made for an object of the chain.
    assert api.lists == [f"{kueue.JOB_UID_LABEL} in (u-j,u-js,u-t)"]
    assert "stranger" not in {n for n, _ in api.patches}  # its owner references decide
    assert [n for n, _ in api.patches].count("jobset-js-1") == 3
    # Another Job of the JobSet adds to the chain: listed again, once.
    publish.publish(KEY, policy(lastLocalStep=300), [ref_to(JOB), ref_to(EVAL)], RECORDS, LOG)
    publish.publish(KEY, policy(lastLocalStep=300), [ref_to(EVAL), ref_to(JOB)], RECORDS, LOG)
    assert api.lists[1:] == [f"{kueue.JOB_UID_LABEL} in (u-e,u-j,u-js,u-t)"]


def test_a_gone_kueue_workload_is_forgotten_and_listed_again(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    publish.publish(KEY, policy(lastLocalStep=100), [ref_to(JOB)], RECORDS, LOG)
    api.refuse["jobset-js-1"] = 404
    # Gone: neither logged nor retried; the next pass lists again.
    assert publish.publish(KEY, policy(lastLocalStep=200), [ref_to(JOB)], RECORDS,
                           LOG) is None
    assert len(api.lists) == 1 and not caplog.records
    del api.objects[(KUEUE, "jobset-js-1")]
    api.refuse.clear()
    publish.publish(KEY, policy(lastLocalStep=300), [ref_to(JOB)], RECORDS, LOG)
    assert len(api.lists) == 2 and api.patches[-1][0] == "t"


def test_kueue_is_looked_for_again_when_its_version_moves(api: Api) -> None:
    publish.publish(KEY, policy(lastLocalStep=100), [ref_to(JOB)], RECORDS, LOG)
    moved = copy.deepcopy(QUEUED)
    moved["apiVersion"] = "kueue.x-k8s.io/v1beta2"
    api.objects = {k: v for k, v in api.objects.items() if k[0] != KUEUE}
    api.objects[(moved["apiVersion"], "jobset-js-1")] = moved
    api.version = moved["apiVersion"]
    # Its patch under the old version answers 404: forgotten, listed again;
    # that list answers 404: Kueue is looked for again, at once.
    publish.publish(KEY, policy(lastLocalStep=200), [ref_to(JOB)], RECORDS, LOG)
    assert not moved["metadata"]["annotations"]
    publish.publish(KEY, policy(lastLocalStep=300), [ref_to(JOB)], RECORDS, LOG)
    assert json.loads(moved["metadata"]["annotations"][ANNOTATION])["pod"]["step"] == 300


def test_a_workload_shared_by_two_policies_is_written_by_the_first(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    """A JobSet's trainer Job under `llama`, its eval Job under `zeval`:
    passes that alternate never ping-pong the annotation."""
    for step in (100, 200):
        publish.publish(KEY, policy(lastLocalStep=step), [ref_to(JOB)], RECORDS, LOG)
        evaluated = {"metadata": {"name": "zeval"}, "status": {"lastLocalStep": 300}}
        publish.publish(EVAL_KEY, evaluated, [ref_to(EVAL)], RECORDS, LOG)
    values = [json.loads(v) for n, v in api.patches if n == "t"]
    assert [(v["policy"], v["pod"]["step"]) for v in values] == [("llama", 100),
                                                                 ("llama", 200)]
    shared = [r.getMessage() for r in caplog.records if "selected by policies" in r.getMessage()]
    assert shared == ["the pods of TrainJob/t are selected by policies llama and zeval; "
                      "its recency is llama's"]
    # Each policy its own series; neither removes the other's.
    assert {s["policy"] for s in series(workload="t", domain="pod")} == {"llama", "zeval"}
    publish.publish(KEY, policy(lastLocalStep=200), [], RECORDS, LOG)
    assert {s["policy"] for s in series(workload="t", domain="pod")} == {"zeval"}
    # The first policy's pods are gone: the other writes it now.
    publish.publish(EVAL_KEY, evaluated, [ref_to(EVAL)], RECORDS, LOG)
    assert json.loads(api.patches[-1][1])["policy"] == "zeval"


def test_a_standby_writes_nothing_asks_for_nothing_and_clears_its_gauges(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    publish.publish(KEY, policy(lastLocalStep=100), [ref_to(JOB)], RECORDS, LOG)
    assert series(workload="t", policy="llama")
    monkeypatch.setattr(publish.leadership, "active", lambda: False)
    api.refuse["t"] = 403  # a retry pending from before
    assert publish.publish(KEY, policy(lastLocalStep=200), [ref_to(JOB)], RECORDS,
                           LOG) is None
    assert len(api.patches) == 2 and not series(workload="t")


def test_a_failure_is_left_alone_for_retry_s_whatever_asks_sooner(
        api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clock = [1000.0]
    monkeypatch.setattr(publish.time, "monotonic", lambda: clock[0])
    api.refuse["t"] = 403
    for step in (100, 200, 300):  # policy events, seconds apart
        assert publish.publish(KEY, policy(lastLocalStep=step), [ref_to(JOB)], RECORDS,
                               LOG) == publish.RETRY_S
        clock[0] += 5
    assert [n for n, _ in api.patches].count("t") == 1
    assert sum("not published" in r.getMessage() for r in caplog.records) == 1
    clock[0] += publish.RETRY_S
    api.refuse.clear()
    assert publish.publish(KEY, policy(lastLocalStep=300), [ref_to(JOB)], RECORDS,
                           LOG) is None
    assert json.loads(api.patches[-1][1])["pod"]["step"] == 300


def test_a_failed_walk_is_not_walked_again_before_retry_s(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(publish.time, "monotonic", lambda: clock[0])
    monkeypatch.setitem(publish._pods, "pod-uid", (KEY, "u-j"))  # as its pod event left
    api.broken = True
    for _ in range(3):
        assert publish.publish(KEY, policy(lastLocalStep=100), [ref_to(JOB)], RECORDS,
                               LOG) == publish.RETRY_S
        clock[0] += 5
    assert api.reads == ["js-workers-0"]
    api.broken = False
    clock[0] += publish.RETRY_S
    assert publish.publish(KEY, policy(lastLocalStep=100), [ref_to(JOB)], RECORDS,
                           LOG) is None
    assert "t" in {n for n, _ in api.patches}


def test_a_gone_workload_is_forgotten_not_retried(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    api.refuse["t"] = 404
    assert publish.publish(KEY, policy(lastLocalStep=100), [ref_to(JOB)], RECORDS,
                           LOG) is None
    assert not caplog.records


def test_nothing_is_kept_for_objects_no_longer_in_use(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    api.refuse["jobset-js-1"] = 403
    publish.publish(KEY, policy(lastLocalStep=100), [ref_to(JOB)], RECORDS, LOG)
    assert publish._written and publish._logged and publish._failed
    publish.publish(KEY, policy(lastLocalStep=100), [], RECORDS, LOG)  # its pods gone
    assert not (publish._written or publish._logged or publish._failed
                or publish._claims or publish._queued)


def test_metrics_per_workload_go_with_its_last_pod(api: Api) -> None:
    publish.publish(KEY, policy(lastLocalStep=200, lastGlobalStep=100), [ref_to(JOB)],
                    RECORDS, LOG)
    labels = {"namespace": "ns", "policy": "llama", "workload_kind": "TrainJob",
              "workload": "t"}
    sample = recency_metrics.CHECKPOINT_TIME.labels(**labels, domain="all")._value.get()
    assert sample == datetime(2026, 11, 29, 10, tzinfo=UTC).timestamp()
    assert recency_metrics.CHECKPOINT_STEP.labels(**labels, domain="pod")._value.get() == 200
    publish.publish(KEY, policy(lastLocalStep=200), [], RECORDS, LOG)
    assert not series(workload="t")


# -- the apiserver calls -----------------------------------------------------------


class Custom:
    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages
        self.calls: list[dict[str, Any]] = []

    def list_namespaced_custom_object(self, *args: Any, **kw: Any) -> dict[str, Any]:
        self.calls.append(kw)
        return self.pages[len(self.calls) - 1]

    def patch_namespaced_custom_object(self, *args: Any, **kw: Any) -> None:
        self.calls.append(kw)

    def get_namespaced_custom_object(self, *args: Any, **kw: Any) -> dict[str, Any]:
        self.calls.append(kw)
        return {}


def test_workloads_are_listed_by_selector_in_pages_and_every_call_times_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    custom = Custom([{"items": [{"n": 1}], "metadata": {"continue": "c1"}},
                     {"items": [{"n": 2}], "metadata": {}}])
    monkeypatch.setattr(workload_objects.kube, "_custom", lambda: custom)
    assert workload_objects.list_in(KUEUE, "workloads", "ns", "a in (b)") == [{"n": 1},
                                                                              {"n": 2}]
    assert [c["_continue"] for c in custom.calls] == [None, "c1"]
    assert {c["label_selector"] for c in custom.calls} == {"a in (b)"}
    assert {c["limit"] for c in custom.calls} == {workload_objects.PAGE}
    workload_objects.annotate("batch/v1", "jobs", "ns", "j", "k", "v")
    workload_objects.read("batch/v1", "jobs", "ns", "j")
    assert all(c["_request_timeout"] == workload_objects.TIMEOUT_S for c in custom.calls)


def test_a_failing_kueue_check_never_breaks_the_pass_nor_its_retry(
        api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def unavailable() -> str:
        raise ApiException(status=503, reason="Service Unavailable")

    monkeypatch.setattr(report.recency_kueue, "served", unavailable)
    monkeypatch.setattr(after_pass, "HOOKS", [])
    report.start(CFG)
    api.refuse["t"] = 403  # one write refused: the pass wants another after RETRY_S
    pods = [ref_to(JOB)]
    with caplog.at_level(logging.WARNING):
        for step in (100, 200):
            again = publish.publish(KEY, policy(lastLocalStep=step), pods, RECORDS, LOG)
            assert again == publish.RETRY_S
    # Kueue's Workload written on both passes all the same.
    assert [n for n, _ in api.patches].count("jobset-js-1") == 2
    said = [r.getMessage() for r in caplog.records if "after the recency pass" in r.getMessage()]
    assert len(said) == 1 and "ApiException" in said[0], said  # once per policy


def test_a_pass_without_live_pods_still_runs_the_hooks_with_nothing_queued(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, list[owners.Owner]]] = []
    monkeypatch.setattr(after_pass, "HOOKS", [lambda key, body, queued, _: seen.append(
        (key, queued))])
    publish.publish(KEY, policy(lastLocalStep=100), [ref_to(JOB)], RECORDS, LOG)
    assert seen[-1] == (KEY, [owners.Owner(KUEUE, "Workload", "workloads", "jobset-js-1",
                                           "u-w", None)])
    publish.publish(KEY, policy(lastLocalStep=100), [], RECORDS, LOG)  # the job ended
    assert seen[-1] == (KEY, [])


def test_a_kueue_list_that_fails_leaves_what_the_hooks_said(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[owners.Owner]] = []
    monkeypatch.setattr(after_pass, "HOOKS", [lambda key, body, queued, _: seen.append(queued)])
    publish.publish(KEY, policy(lastLocalStep=100), [ref_to(JOB)], RECORDS, LOG)
    assert len(seen) == 1 and seen[0]
    publish._new_term()  # the chain is listed again
    kueue.forget()

    def unavailable(*_: Any) -> None:
        raise ApiException(status=503)

    monkeypatch.setattr(publish.workload_objects, "list_in", unavailable)
    again = publish.publish(KEY, policy(lastLocalStep=200), [ref_to(JOB)], RECORDS, LOG)
    assert again == publish.RETRY_S
    assert len(seen) == 1  # not told "nothing queued": the condition would go and come back
