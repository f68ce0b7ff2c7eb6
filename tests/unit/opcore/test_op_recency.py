"""Checkpoint recency: the document a workload carries (the newest step
surviving each failure domain, with its time) and the walk from a pod to the
workload that owns it. The pass that writes it: test_op_recency_pass.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ckptdrain.operator.recency import document, owners

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


def test_a_step_without_its_record_shows_the_larger_domains_entry() -> None:
    """Step 300's record is not at hand: the pod domain says what surely
    survives a pod loss (the node domain's step), never that nothing does."""
    status = {"lastLocalStep": 300, "lastGlobalStep": 200,
              "recoveryPointTime": "2026-11-29T10:25:00Z"}
    doc = document.document("llama", status, [rec(100)])
    entry = {"step": 200, "time": "2026-11-29T10:25:00Z"}
    assert doc == {"policy": "llama", "pod": entry, "node": entry, "all": entry}


def test_a_peer_step_without_its_record_falls_back_to_the_global_one() -> None:
    status = {"lastLocalStep": 300, "recoveryPointOnNodeLoss": 300, "lastGlobalStep": 100}
    doc = document.document("llama", status, [rec(100)])
    assert [doc[d]["step"] for d in document.DOMAINS] == [100, 100, 100]
    doc = document.document("llama", status, RECORDS)
    assert [doc[d]["step"] for d in document.DOMAINS] == [300, 300, 100]


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
