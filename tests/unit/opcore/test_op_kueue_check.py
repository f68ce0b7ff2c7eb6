"""The Kueue check's edge (kueue/report.py check()) over fake reads and
writes: which pod sets are the policy's (a JobSet's labels count), a
Workload none of whose pod sets is found to be the policy's is said not
checked, the restore estimate from the bandwidth the operator allows, and
the condition and gauges removed once nothing of the policy's is queued."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.kueue import conflicts, report
from ckptdrain.operator.kueue.settings import WaitForPodsReady
from ckptdrain.operator.recency import owners

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
KEY = ("ml", "p")
KUEUE = "kueue.x-k8s.io/v1beta1"
LOG = logging.getLogger("test")
QUEUED = [owners.Owner(KUEUE, "Workload", "workloads", "jobset-js-1", "u-w")]


def body(selector: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ml", "generation": 1},
            "spec": {"selector": {"matchLabels": selector},
                     "model": {"checkpointBytes": "80GB"}, "interval": "15m",
                     "overlap": "10%", "writers": 8,
                     "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
                     "storage": {"uri": "s3://bucket/runs"}},
            "status": status}


def workload(labels: dict[str, str]) -> dict[str, Any]:
    """As Kueue makes it for JobSet js: the replicatedJob's template, which
    has none of the labels JobSet adds to the pods."""
    template = {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "trainer", "image": "t:1"}]}}
    return {"apiVersion": KUEUE, "kind": "Workload",
            "metadata": {"name": "jobset-js-1", "uid": "u-w", "ownerReferences": [
                {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "js",
                 "uid": "u-js", "controller": True}]},
            "spec": {"podSets": [{"name": "workers", "count": 2, "template": template}]},
            "status": {}}


class Edge:
    """The reads and writes check() makes, over one Workload and one policy."""

    def __init__(self) -> None:
        self.workload: dict[str, Any] | None = workload({"ckptdrain.io/inject": "true",
                                                          "app": "t"})
        self.version: str | None = KUEUE
        self.wait = WaitForPodsReady(True, 300.0)
        self.conditions: list[dict[str, Any]] = []
        self.writes = 0

    def write_status_from(self, plural: str, namespace: str, current: dict[str, Any],
                          change_of: Callable[[dict[str, Any]], dict[str, Any] | None],
                          attempts: int) -> bool:
        change = change_of({**current, "status": {"conditions": self.conditions}})
        if change is None:
            return False
        self.writes += 1
        self.conditions = change["conditions"]
        return True

    def condition(self) -> dict[str, Any] | None:
        return next((c for c in self.conditions if c["type"] == conflicts.CONDITION), None)


@pytest.fixture
def edge(monkeypatch: pytest.MonkeyPatch) -> Iterator[Edge]:
    fake = Edge()
    monkeypatch.setattr(report.recency_kueue, "served", lambda: fake.version)
    monkeypatch.setattr(report.reads, "workload",
                        lambda *_: copy.deepcopy(fake.workload))
    monkeypatch.setattr(report.reads, "flavor_labels", lambda *_: {})
    monkeypatch.setattr(report.reads, "wait_for_pods_ready",
                        lambda _: (fake.wait, ""))
    monkeypatch.setattr(report.kube, "write_status_from", fake.write_status_from)
    monkeypatch.setattr(report.kube, "post_event", lambda *_, **__: None)
    report.forget()
    yield fake
    report.forget()


def gauges() -> dict[str, float]:
    return {s.labels["reason"]: s.value for m in report.CONFLICTS.collect()
            for s in m.samples if (s.labels["namespace"], s.labels["policy"]) == KEY}


def test_a_selector_on_jobsets_labels_finds_the_replicated_jobs_pod_set(edge: Edge) -> None:
    # The pods carry jobset-name and replicatedjob-name; the template does not.
    selects = body({"jobset.sigs.k8s.io/jobset-name": "js",
                    "jobset.sigs.k8s.io/replicatedjob-name": "workers"})
    report.check(CFG, KEY, selects, QUEUED, LOG)
    found = edge.condition()
    assert found is not None and found["status"] == "False", found
    assert "workers: cpu 100m, memory 256Mi per pod × 2" in found["message"]
    assert gauges()[conflicts.QUOTA] == 1


def test_a_workload_none_of_whose_pod_sets_is_found_is_said_not_checked(edge: Edge) -> None:
    # Kubernetes' Job labels are on the pods only: no pod set can be told.
    edge.wait = WaitForPodsReady(False, None)
    report.check(CFG, KEY, body({"batch.kubernetes.io/job-name": "js-workers-0"}),
                 QUEUED, LOG)
    found = edge.condition()
    assert found is not None and found["status"] == "True"
    assert "no conflict with Kueue's settings known" not in found["message"]
    assert "Workload jobset-js-1 not checked: none of its pod sets" in found["message"]


def test_the_restore_estimate_uses_the_bandwidth_the_operator_allows(edge: Edge) -> None:
    # 80 GB at the 100 MB/s a cluster cap leaves: 800 s, plus retryDeadline's
    # 10m, against Kueue's 5m.
    report.check(CFG, KEY, body({"app": "t"}, allowedBandwidthBytes=100_000_000), QUEUED, LOG)
    found = edge.condition()
    assert found is not None
    assert "status.allowedBandwidthBytes" in found["message"], found["message"]
    assert "at 100 MB/s" in found["message"] and "23m20s" in found["message"], found["message"]
    facts = report.facts_of(report.rebalance.parse_policy(CFG, body({"app": "t"}), 1), {})
    assert facts.restore_s == pytest.approx(90.0) and "its sizing" in facts.restore_basis


@pytest.mark.parametrize("gone", ["job", "workload", "kueue"])
def test_the_condition_and_gauges_go_once_nothing_is_queued(edge: Edge, gone: str) -> None:
    report.check(CFG, KEY, body({"app": "t"}), QUEUED, LOG)
    assert edge.condition() is not None and gauges()
    if gone == "job":  # recency's pass without live pods hands over nothing
        report.check(CFG, KEY, body({"app": "t"}), [], LOG)
    elif gone == "workload":
        edge.workload = None
        report.check(CFG, KEY, body({"app": "t"}), QUEUED, LOG)
    else:
        edge.version = None
        report.check(CFG, KEY, body({"app": "t"}), QUEUED, LOG)
    assert edge.condition() is None and not gauges()
    writes = edge.writes
    report.check(CFG, KEY, body({"app": "t"}), [], LOG)
    assert edge.writes == writes  # nothing to remove: nothing written


def test_nothing_queued_asks_nothing_of_kueue(edge: Edge, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    def unavailable() -> str:
        raise AssertionError("Kueue's API looked for with nothing queued")

    monkeypatch.setattr(report.recency_kueue, "served", unavailable)
    report.check(CFG, KEY, body({"app": "t"}), [], LOG)  # raises nothing
    assert edge.writes == 0
