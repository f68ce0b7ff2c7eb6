"""Checkpoint recency: the document a workload carries (the newest step
surviving each failure domain, with its time), the walk from a pod to the
workload that owns it, and the pass that writes it only when it changed."""

from __future__ import annotations

import copy
import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ckptdrain.operator.recency import document, owners, publish
from ckptdrain.operator.recency import metrics as recency_metrics

T = {100: "2026-11-29T10:00:00Z", 200: "2026-11-29T10:15:00Z", 300: "2026-11-29T10:30:00Z"}


def rec(step: int) -> dict[str, Any]:
    return {"metadata": {"name": f"llama-s{step}", "creationTimestamp": T[step]},
            "spec": {"policy": "llama", "step": step, "writers": 2}}


RECORDS = [rec(100), rec(200), rec(300)]


def test_each_domain_gets_the_newest_step_surviving_it_and_that_steps_time() -> None:
    status = {"lastLocalStep": 300, "recoveryPointOnNodeLoss": 200, "lastGlobalStep": 100,
              "recoveryPointTime": "2026-11-29T10:20:00Z"}
    doc = document.document("llama", status, RECORDS)
    assert doc == {"policy": "llama", "pod": {"step": 300, "time": T[300]},
                   "node": {"step": 200, "time": T[200]},
                   "all": {"step": 100, "time": T[100]}}  # capture time, not completion
    assert document.encode(doc) == json.dumps(doc, separators=(",", ":"))


@pytest.mark.parametrize(("status", "steps"), [
    ({}, (None, None, None)),                                       # nothing yet
    ({"lastLocalStep": 200}, (200, None, None)),                    # local only
    ({"lastGlobalStep": 100}, (100, 100, 100)),                     # global survives all
    # Without the peer tier a node loss restores the global step.
    ({"lastLocalStep": 300, "lastGlobalStep": 200}, (300, 200, 200)),
    # A global step newer than the local one (local expired first) still counts for a pod.
    ({"lastLocalStep": 100, "recoveryPointOnNodeLoss": 100, "lastGlobalStep": 200},
     (200, 200, 200)),
])
def test_a_larger_loss_never_keeps_a_newer_step(status: dict[str, Any],
                                                steps: tuple[int | None, ...]) -> None:
    assert tuple(document.surviving_steps(status).values()) == steps
    doc = document.document("llama", status, RECORDS)
    assert tuple((doc.get(d) or {}).get("step") for d in document.DOMAINS) == steps


def test_a_step_without_its_record_waits_except_the_global_one() -> None:
    status = {"lastLocalStep": 300, "lastGlobalStep": 200,
              "recoveryPointTime": "2026-11-29T10:25:00Z"}
    doc = document.document("llama", status, [rec(100)])
    assert doc == {"policy": "llama", "node": {"step": 200, "time": "2026-11-29T10:25:00Z"},
                   "all": {"step": 200, "time": "2026-11-29T10:25:00Z"}}


# -- the walk ------------------------------------------------------------------


def obj(api_version: str, kind: str, name: str, uid: str,
        owner: dict[str, Any] | None = None, **notes: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": uid, "annotations": notes}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                    "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"], "controller": True}]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


class Cluster:
    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {(o["apiVersion"], o["metadata"]["name"]): o for o in objects}
        self.reads: list[str] = []

    def read(self, api_version: str, plural: str, namespace: str, name: str
             ) -> dict[str, Any] | None:
        self.reads.append(f"{plural}/{name}")
        return self.objects.get((api_version, name))


def ref_to(o: dict[str, Any]) -> owners.Ref:
    return owners.Ref(o["apiVersion"], o["kind"], o["metadata"]["name"], o["metadata"]["uid"])


TRAIN = obj("trainer.kubeflow.org/v1alpha1", "TrainJob", "t", "u-t")
JOBSET = obj("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "u-js", TRAIN)
JOB = obj("batch/v1", "Job", "js-workers-0", "u-j", JOBSET)
LWS = obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "lws", "u-l")
STS = obj("apps/v1", "StatefulSet", "lws", "u-s", LWS)
LEADER = obj("v1", "Pod", "lws-0", "u-p", STS)
WORKERS = obj("apps/v1", "StatefulSet", "lws-0", "u-ws", LEADER)
CRON = obj("batch/v1", "CronJob", "nightly", "u-c")
CRON_JOB = obj("batch/v1", "Job", "nightly-1", "u-cj", CRON)
RS = obj("apps/v1", "ReplicaSet", "web-1", "u-rs")


@pytest.mark.parametrize(("first", "top"), [
    (JOB, "t"),                  # pod -> Job -> JobSet -> TrainJob: the top-most
    (STS, "lws"),                # pod -> StatefulSet -> LWS: the set is never the owner
    (WORKERS, "lws"),            # a worker: its set is owned by the group's leader pod
    (CRON_JOB, "nightly-1"),     # a CronJob is not a workload kind: its Job is
    (RS, None),                  # nothing of a published kind: nowhere to publish
])
def test_the_walk_stops_at_the_top_most_workload(first: dict[str, Any],
                                                 top: str | None) -> None:
    cluster = Cluster(TRAIN, JOBSET, JOB, LWS, STS, LEADER, WORKERS, CRON, CRON_JOB, RS)
    found = owners.top_owner("ns", ref_to(first), cluster.read, document.ANNOTATION_RECENCY)
    assert (found.name if found else None) == top
    assert "replicasets/web-1" not in cluster.reads  # an unknown kind is never read


def test_a_reference_to_an_object_made_again_leads_nowhere() -> None:
    again = obj("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "u-other")
    found = owners.top_owner("ns", ref_to(JOB), Cluster(again, JOB).read, "a")
    assert found is not None and found.name == "js-workers-0"  # not the stranger JobSet


def test_the_walk_reports_the_annotation_the_workload_holds() -> None:
    held = obj("batch/v1", "Job", "j", "u-1", None,
               **{document.ANNOTATION_RECENCY: '{"policy":"llama"}'})
    found = owners.top_owner("ns", ref_to(held), Cluster(held).read,
                             document.ANNOTATION_RECENCY)
    assert found is not None and found.annotation == '{"policy":"llama"}'


# -- the pass ------------------------------------------------------------------


class Api:
    """workload_objects as the pass calls it, over a dict of objects."""

    def __init__(self, *objects: dict[str, Any], kueue: str | None = None) -> None:
        self.cluster = Cluster(*objects)
        self.kueue = kueue
        self.patches: list[tuple[str, str]] = []
        self.refuse: int | None = None

    def annotate(self, api_version: str, plural: str, namespace: str, name: str, key: str,
                 value: str) -> bool:
        if self.refuse:
            raise ApiException(status=self.refuse)
        self.patches.append((name, value))
        self.cluster.objects[(api_version, name)]["metadata"]["annotations"][key] = value
        return True

    def list_in(self, api_version: str, plural: str, namespace: str) -> list[dict[str, Any]]:
        return [o for o in self.cluster.objects.values() if o["kind"] == "Workload"]

    def served_version(self, group: str, plural: str) -> str | None:
        return self.kueue


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Api:
    fake = Api(*copy.deepcopy([TRAIN, JOBSET, JOB]),
               obj("kueue.x-k8s.io/v1beta1", "Workload", "jobset-js-1", "u-w", JOBSET),
               kueue="kueue.x-k8s.io/v1beta1")
    for name in ("read", "annotate", "list_in", "served_version"):
        monkeypatch.setattr(publish.workload_objects, name,
                            fake.cluster.read if name == "read" else getattr(fake, name))
    monkeypatch.setattr(publish, "_kueue", None)
    yield fake
    publish.forget(("ns", "llama"))
    publish._logged.clear()


def policy(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "llama", "namespace": "ns"}, "status": status}


LOG = logging.getLogger("test")
KEY = ("ns", "llama")


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
    assert api.cluster.reads.count("jobs/js-workers-0") == 1  # walked once


def test_no_pods_or_no_policy_writes_nothing(api: Api) -> None:
    assert publish.publish(KEY, policy(lastLocalStep=100), [], RECORDS, LOG) is None
    assert publish.publish(KEY, None, [ref_to(JOB)], RECORDS, LOG) is None
    assert api.patches == []


def test_a_refusal_is_logged_once_and_retried_later(api: Api,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    api.refuse = 403
    for _ in range(3):
        assert publish.publish(KEY, policy(lastLocalStep=100), [ref_to(JOB)], RECORDS,
                               LOG) == publish.RETRY_S
    assert sum("not published" in r.getMessage() for r in caplog.records) == 2  # two objects
    api.refuse = None
    assert publish.publish(KEY, policy(lastLocalStep=100), [ref_to(JOB)], RECORDS,
                           LOG) is None
    assert len(api.patches) == 2


def test_metrics_per_workload_go_with_its_last_pod(api: Api) -> None:
    publish.publish(KEY, policy(lastLocalStep=200, lastGlobalStep=100), [ref_to(JOB)],
                    RECORDS, LOG)
    labels = {"namespace": "ns", "workload_kind": "TrainJob", "workload": "t"}
    sample = recency_metrics.CHECKPOINT_TIME.labels(**labels, domain="all")._value.get()
    assert sample == datetime(2026, 11, 29, 10, tzinfo=UTC).timestamp()
    assert recency_metrics.CHECKPOINT_STEP.labels(**labels, domain="pod")._value.get() == 200
    publish.publish(KEY, policy(lastLocalStep=200), [], RECORDS, LOG)
    assert not [s for m in recency_metrics.CHECKPOINT_STEP.collect() for s in m.samples
                if s.labels.get("workload") == "t"]
