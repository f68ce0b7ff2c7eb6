"""Checkpoint recency on the workload, against a real apiserver: writers'
progress on their pods moves the policy's status, and the operator, running
with exactly the rules of docs/rbac.md and under the chart's recency write
policy, publishes the newest step surviving each failure domain on the
workload that owns the pods (and on its Kueue Workload), a few writes for
many checkpoints. No JobSet or Kueue controller runs here: their APIs are
served from minimal CRDs, which is all the operator needs of them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import (
    INJECT,
    JOB_INDEX,
    POLICIES,
    create,
    get,
    indexed_job,
    jobset_over_a_job,
    owned_by,
    pod,
    policy,
    render_chart,
    wait_for,
)
from documented_rbac import operator_rules
from kubernetes import client, config, watch
from operator_process import OperatorProcess, repo_root
from test_rbac import _bind
from tests.docs.blocks import parse
from urllib3.exceptions import ProtocolError

from ckptdrain.agent.kube import PodReport
from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.contract.api import timestamp
from ckptdrain.contract.record import State
from ckptdrain.operator.recency.publish import PUBLISH_DELAY_S
from support.apiserver import Cluster

SYSTEM_NS = "ckptdrain-system"
OPERATOR_SA = "ckptdrain"  # the chart's, release "ckptdrain": the policy's match
ANNOTATION = "ckptdrain.io/checkpoint-recency"
GRACE = {"terminationGracePeriodSeconds": 3600}


def _crd(group: str, version: str, kind: str, plural: str) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": version, "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {
                                       "type": "object",
                                       "x-kubernetes-preserve-unknown-fields": True}}}]}}


STUBS = [_crd("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
         _crd("kueue.x-k8s.io", "v1beta1", "Workload", "workloads"),
         _crd("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets")]


@pytest.fixture(scope="module")
def recency_operator(cluster: Cluster, operator: OperatorProcess,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator as the chart's ServiceAccount, with the documented rules
    and the chart's recency write policy in force, started after the JobSet
    and Workload APIs are served (Kueue is looked for once)."""
    cluster.kubectl("create", "namespace", SYSTEM_NS, check=False)
    stubs = json.dumps({"apiVersion": "v1", "kind": "List", "items": STUBS})
    cluster.kubectl("apply", "-f", "-", input=stubs)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/jobsets.jobset.x-k8s.io", "crd/workloads.kueue.x-k8s.io",
                    "crd/leaderworkersets.leaderworkerset.x-k8s.io")
    kubeconfig = _bind(cluster, "ClusterRole", OPERATOR_SA, SYSTEM_NS,
                       operator_rules(dev_mode=True))
    vap = render_chart("ckptdrain", SYSTEM_NS, ["operator-recency-policy.yaml"])
    cluster.kubectl("apply", "-f", "-", input=vap)
    operator.stop()
    limited = OperatorProcess(cluster, tmp_path_factory.mktemp("recency"),
                              KUBECONFIG=str(kubeconfig))
    try:
        _policy_in_force(cluster, kubeconfig)
        limited.start()
        yield limited
    finally:
        limited.stop()
        cluster.kubectl("delete", "-f", "-", input=vap, check=False)
        cluster.kubectl("delete", "-f", "-", input=stubs, check=False)
        operator.start()


def _policy_in_force(cluster: Cluster, kubeconfig: Path) -> None:
    """A new policy takes effect within moments: wait until it refuses (a
    dry run, so nothing changes before)."""
    cluster.kubectl("create", "namespace", "recency-probe", check=False)
    job = indexed_job(cluster, "recency-probe", "probe", 1)
    batch = client.BatchV1Api(config.new_client_from_config(str(kubeconfig)))
    wait_for(lambda: _refused(batch, job["metadata"]["name"], "recency-probe",
                              {"metadata": {"labels": {"x": "y"}}}, dry_run=True),
             what="the recency write policy in force")


def _refused(batch: client.BatchV1Api, name: str, namespace: str, body: dict[str, Any],
             dry_run: bool = False) -> str:
    """The apiserver's refusal of this merge patch ('' if accepted)."""
    try:
        batch.patch_namespaced_job(name, namespace, body,
                                   _content_type="application/merge-patch+json",
                                   **({"dry_run": "All"} if dry_run else {}))
    except client.exceptions.ApiException as err:
        assert err.status in (403, 422), err
        return str(err.body)
    return ""


@pytest.fixture
def core_api(cluster: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))


def _writers(cluster: Cluster, core: client.CoreV1Api, namespace: str, app: str,
             job: dict[str, Any], count: int) -> list[PodReport]:
    out = []
    for rank in range(count):
        name = f"{job['metadata']['name']}-{rank}"
        body = pod(name, {"app": app, **INJECT, JOB_INDEX: str(rank)}, rank, **GRACE)
        made = create(cluster, namespace, owned_by(body, job))
        assert made.returncode == 0, made.stderr
        out.append(PodReport(namespace, name, rank, count, api=core))
    return out


def _checkpoint(writers: list[PodReport], step: int, state: State) -> None:
    for w in writers:
        w.report(CheckpointEvent(step, state, 1_000_000))
        assert w.publish(0)


def _recency(cluster: Cluster, namespace: str, *what: str) -> dict[str, Any] | None:
    text = (get(cluster, namespace, *what)["metadata"].get("annotations") or {}).get(ANNOTATION)
    return None if text is None else dict(json.loads(text))


def _made(cluster: Cluster, namespace: str, record: str) -> str:
    return str(get(cluster, namespace, "ckpt", record)["metadata"]["creationTimestamp"])


class Writes:
    """Every change of the annotation on one Job, as a watch sees it."""

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.values: list[str] = []
        api = client.BatchV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
        version = api.read_namespaced_job(name, namespace).metadata.resource_version
        self._thread = threading.Thread(target=self._run, args=(api, namespace, name, version),
                                        daemon=True)
        self._thread.start()

    def _run(self, api: client.BatchV1Api, namespace: str, name: str, version: str) -> None:
        w = watch.Watch()
        try:
            for event in w.stream(api.list_namespaced_job, namespace,
                                  field_selector=f"metadata.name={name}",
                                  resource_version=version, timeout_seconds=90):
                value = (event["object"].metadata.annotations or {}).get(ANNOTATION)
                if value is not None and (not self.values or self.values[-1] != value):
                    self.values.append(value)
        except ProtocolError:
            pass  # the apiserver stopped (the session's end): the count is taken by then


def test_a_jobs_pods_checkpointing_publish_on_the_job_in_few_writes(
        cluster: Cluster, recency_operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    apply(policy("llama", writers=2, storage={"uri": "s3://bucket/runs", "keep": 3}))
    wait_for(lambda: get(cluster, namespace, POLICIES, "llama").get("status", {}).get("phase"))
    job = indexed_job(cluster, namespace, "llama", 2)
    writers = _writers(cluster, core_api, namespace, "llama", job, 2)

    # Both writers hold step 100 on their nodes: it survives losing a pod only.
    _checkpoint(writers, 100, State.LOCAL)
    doc = wait_for(lambda: (d := _recency(cluster, namespace, "job", "llama"))
                   and "pod" in d and d, what="the Job's recency")
    assert doc == {"policy": "llama",
                   "pod": {"step": 100, "time": _made(cluster, namespace, "llama-s100")}}

    # A second checkpoint, complete globally: it survives everything.
    _checkpoint(writers, 200, State.GLOBAL)
    doc = wait_for(lambda: (d := _recency(cluster, namespace, "job", "llama"))
                   and (d.get("all") or {}).get("step") == 200 and d, what="step 200")
    made = _made(cluster, namespace, "llama-s200")
    assert doc == {"policy": "llama", "pod": {"step": 200, "time": made},
                   "node": {"step": 200, "time": made}, "all": {"step": 200, "time": made}}

    # Many checkpoints in a burst (60 pod patches): a few writes on the Job,
    # at most one per PUBLISH_DELAY_S while it lasts (3 for a burst under
    # 10 s; a loaded machine may stretch it), one after, never one each.
    writes = Writes(cluster, namespace, "llama")
    began = time.monotonic()
    for step in range(301, 331):
        _checkpoint(writers, step, State.GLOBAL)
    most = max(3, 2 + int((time.monotonic() - began) // PUBLISH_DELAY_S))
    wait_for(lambda: (_recency(cluster, namespace, "job", "llama") or {}).get("all", {})
             .get("step") == 330, timeout_s=60, what="the burst's last step")
    wait_for(lambda: writes.values and json.loads(writes.values[-1])["all"]["step"] == 330,
             what="the watch to see it")
    print(f"{len(writes.values)} write(s) for 30 checkpoints (at most {most})")
    assert 1 <= len(writes.values) <= most < 30, writes.values

    # Its metrics, per workload and domain: set once the pass has written the
    # annotation, so waited for.
    def step_gauge() -> float | None:
        line = re.search(r'ckptdrain_workload_checkpoint_step\{domain="all",namespace="'
                         + namespace + r'",policy="llama",workload="llama",'
                         r'workload_kind="Job"\} (\S+)', recency_operator.metrics())
        return float(line[1]) if line else None
    wait_for(lambda: step_gauge() == 330, what="the step gauge at 330")
    log = recency_operator.tail(200_000)
    assert not re.search(r"(?i)forbidden|checkpoint recency not published", log), log[-3000:]

    # docs/recency.md's reader: work at risk per domain, from the annotation.
    lines = _run_the_docs_example(cluster, namespace).splitlines()
    assert [line.split("\t")[:2] for line in lines] == [
        ["pod", "step 330"], ["node", "step 330"], ["all", "step 330"]]
    assert all(0 <= int(line.split("\t")[2].removesuffix("s at risk")) < 600 for line in lines)


def test_a_step_done_again_after_a_restart_shows_when_it_was_done_again(
        cluster: Cluster, recency_operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    """The job failed after step 200 completed, restored step 100 and reached
    200 again: the record of 200 is the failed run's, and the recency must
    date the step by its new capture, not by that record's creation."""
    apply(policy("redo", writers=2, storage={"uri": "s3://bucket/runs", "keep": 3}))
    wait_for(lambda: get(cluster, namespace, POLICIES, "redo").get("status", {}).get("phase"))
    job = indexed_job(cluster, namespace, "redo", 2)
    writers = _writers(cluster, core_api, namespace, "redo", job, 2)
    _checkpoint(writers, 100, State.GLOBAL)
    _checkpoint(writers, 200, State.GLOBAL)
    wait_for(lambda: ((_recency(cluster, namespace, "job", "redo") or {}).get("all") or {})
             .get("step") == 200, what="step 200 complete")
    first = _made(cluster, namespace, "redo-s200")
    time.sleep(1.5)  # the API's times are whole seconds: the runs must differ
    again = timestamp(datetime.now(UTC))
    # The new run captures step 200 on both nodes: not global yet.
    _checkpoint(writers, 200, State.LOCAL)
    doc = wait_for(lambda: (d := _recency(cluster, namespace, "job", "redo"))
                   and (d.get("all") or {}).get("step") == 100 and d, what="step 200 redone")
    record = get(cluster, namespace, "ckpt", "redo-s200")
    assert record["metadata"]["creationTimestamp"] == first
    captured = record["status"]["capturedTime"]
    assert captured >= again > first, (captured, again, first)
    assert doc["pod"] == {"step": 200, "time": captured}
    assert doc["all"] == {"step": 100, "time": _made(cluster, namespace, "redo-s100")}


def _run_the_docs_example(cluster: Cluster, namespace: str) -> str:
    """The page's kubectl | jq block, for the Job `llama` of `namespace`
    (the page says `-n ml`), against this apiserver."""
    block = next(b for b in parse(repo_root() / "docs" / "recency.md")
                 if b.kind == "cluster" and ANNOTATION in b.text)
    assert "get job llama -n ml " in block.text
    return _bash(cluster, block.text.replace(" -n ml ", f" -n {namespace} "))


def _bash(cluster: Cluster, script: str) -> str:
    """A page's shell block, with this apiserver's kubectl, as a user runs it."""
    env = {**cluster.env(), "PATH": f"{Path(cluster.binaries.kubectl).parent}:"
                                    f"{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _run_the_victim_list(cluster: Cluster) -> str:
    """The page's list of Kueue Workloads by work at risk, as written."""
    block = next(b for b in parse(repo_root() / "docs" / "recency.md")
                 if b.kind == "cluster" and "get workloads.kueue.x-k8s.io -A" in b.text)
    return _bash(cluster, block.text)


def test_a_jobset_and_its_kueue_workload_carry_it_not_the_job_between(
        cluster: Cluster, recency_operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    apply(policy("js", writers=2, storage={"uri": "s3://bucket/runs", "keep": 3}))
    wait_for(lambda: get(cluster, namespace, POLICIES, "js").get("status", {}).get("phase"))
    owner, job = jobset_over_a_job(cluster, namespace, "js", 2)
    # Kueue labels a Workload with its job's uid; the operator lists by it.
    # The second carries the label by mistake but names no owner: never written.
    labels = {"kueue.x-k8s.io/job-uid": owner["uid"]}
    for name, refs in [("jobset-js-1", [owner]), ("someone-else", [])]:
        made = create(cluster, namespace, {
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name, "ownerReferences": refs, "labels": labels},
            "spec": {"queueName": "q"}})
        assert made.returncode == 0, made.stderr
    writers = _writers(cluster, core_api, namespace, "js", job, 2)
    _checkpoint(writers, 7, State.GLOBAL)

    doc = wait_for(lambda: (d := _recency(cluster, namespace, "jobsets.jobset.x-k8s.io", "js"))
                   and "all" in d and d, what="the JobSet's recency")
    assert doc["all"] == {"step": 7, "time": _made(cluster, namespace, "js-s7")}
    wait_for(lambda: _recency(cluster, namespace, "workloads.kueue.x-k8s.io", "jobset-js-1")
             == doc, what="the Kueue Workload's recency")
    assert _recency(cluster, namespace, "job", "js-workers-0") is None  # not the top
    assert _recency(cluster, namespace, "workloads.kueue.x-k8s.io", "someone-else") is None

    # docs/recency.md's victim list: the Workload, its step, seconds at risk.
    mine = [line.split("\t") for line in _run_the_victim_list(cluster).splitlines()
            if line.split("\t")[1] == namespace]
    assert len(mine) == 1, mine
    at_risk, _, name, step = mine[0]
    assert (name, step) == ("jobset-js-1", "7")
    assert 0 <= int(at_risk) < 600


def _owned(body: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    body["metadata"]["ownerReferences"] = [{
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
        "controller": True}]
    return body


def _statefulset(name: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"serviceName": name, "selector": {"matchLabels": {"set": name}},
                     "template": {"metadata": {"labels": {"set": name}}, "spec": {
                         "containers": [{"name": "trainer", "image": "trainer:1"}]}}}}


def test_a_leaderworkersets_workers_reach_it_through_their_leader(
        cluster: Cluster, recency_operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    """LWS: a group's worker StatefulSet is owned by the group's leader pod,
    whose own StatefulSet the LeaderWorkerSet owns."""
    apply(policy("lws", writers=2, identity={"rankLabel": "rank"},
                 storage={"uri": "s3://bucket/runs", "keep": 3}))
    wait_for(lambda: get(cluster, namespace, POLICIES, "lws").get("status", {}).get("phase"))

    def made(body: dict[str, Any]) -> dict[str, Any]:
        done = create(cluster, namespace, body)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    lws = made({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                "metadata": {"name": "lws"}, "spec": {"replicas": 1}})
    leaders = made(_owned(_statefulset("lws"), lws))
    leader = made(_owned(pod("lws-0", {"app": "other"}), leaders))
    workers = made(_owned(_statefulset("lws-0"), leader))
    reports = []
    for rank in range(2):
        name = f"lws-0-{rank + 1}"
        made(_owned(pod(name, {"app": "lws", "rank": str(rank), **INJECT}, **GRACE), workers))
        reports.append(PodReport(namespace, name, rank, 2, api=core_api))
    _checkpoint(reports, 5, State.GLOBAL)
    doc = wait_for(lambda: (d := _recency(cluster, namespace,
                                          "leaderworkersets.leaderworkerset.x-k8s.io", "lws"))
                   and "all" in d and d, what="the LeaderWorkerSet's recency")
    assert doc["all"] == {"step": 5, "time": _made(cluster, namespace, "lws-s5")}
    for kind, name in [("statefulset", "lws"), ("statefulset", "lws-0"), ("pod", "lws-0")]:
        assert _recency(cluster, namespace, kind, name) is None  # links, never written


def test_the_operators_account_may_change_nothing_else_on_a_workload(
        cluster: Cluster, recency_operator: OperatorProcess, namespace: str) -> None:
    kubeconfig = cluster.kubeconfig_for(SYSTEM_NS, OPERATOR_SA)
    batch = client.BatchV1Api(config.new_client_from_config(str(kubeconfig)))
    indexed_job(cluster, namespace, "theirs", 2, labels={"team": "a"})
    cluster.kubectl("annotate", "-n", namespace, "job", "theirs", "team=a")
    ours = {"metadata": {"annotations": {ANNOTATION: '{"policy":"p"}'}}}
    assert _refused(batch, "theirs", namespace, ours) == ""
    for body in [
        {"metadata": {"labels": {"team": "b"}}},                    # labels
        {"metadata": {"annotations": {"team": "b"}}},               # another annotation
        {"metadata": {"annotations": {"team": None}}},              # removing one
        {"metadata": {"finalizers": ["example.com/hold"]}},         # finalizers
        {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                                           "name": "x", "uid": "u"}]}},
        {"spec": {"suspend": False}},                               # the spec
    ]:
        assert "ckptdrain operator" in _refused(batch, "theirs", namespace, body), body
    meta = get(cluster, namespace, "job", "theirs")["metadata"]
    assert meta["labels"]["team"] == "a" and meta["annotations"]["team"] == "a"
    assert json.loads(meta["annotations"][ANNOTATION]) == {"policy": "p"}
