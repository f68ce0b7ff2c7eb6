"""operator/policy/identity.py: a pod's writer rank and count from its workload's
labels, with label sets as each project's controller writes them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.operator.policy import identity
from ckptdrain.operator.policy.identity import Owners, RankMissing, Rule, derive


def pod(labels: dict[str, str], annotations: dict[str, str] | None = None,
        owner: tuple[str, str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "labels": labels, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": owner[0], "kind": owner[1],
                                    "name": owner[2], "controller": True}]
    return {"metadata": meta}


def job(completions: int, owner_kind: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "j"}
    if owner_kind:
        meta["ownerReferences"] = [{"apiVersion": "x/v1", "kind": owner_kind, "name": "o",
                                    "controller": True}]
    return {"metadata": meta, "spec": {"completions": completions, "parallelism": completions,
                                       "completionMode": "Indexed"}}


def jobset(rjobs: list[tuple[str, int, int]], owner_kind: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "js"}
    if owner_kind:
        meta["ownerReferences"] = [{"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                    "kind": owner_kind, "name": "tj", "controller": True}]
    return {"metadata": meta, "spec": {"replicatedJobs": [
        {"name": n, "replicas": r, "template": {"spec": {"completions": c, "parallelism": c}}}
        for n, r, c in rjobs]}}


def jobset_pod(rjob: str, job_index: int, global_index: int, completion: int,
               replicas: int, global_replicas: int) -> dict[str, Any]:
    """The labels JobSet's labelAndAnnotateObject and the Job controller set."""
    labels = {
        "jobset.sigs.k8s.io/jobset-name": "js",
        "jobset.sigs.k8s.io/replicatedjob-name": rjob,
        "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
        "jobset.sigs.k8s.io/global-replicas": str(global_replicas),
        "jobset.sigs.k8s.io/job-index": str(job_index),
        "jobset.sigs.k8s.io/job-global-index": str(global_index),
        "jobset.sigs.k8s.io/job-key": "0f1e2d",
        "jobset.sigs.k8s.io/restart-attempt": "0",
        "batch.kubernetes.io/job-completion-index": str(completion),
        "batch.kubernetes.io/job-name": f"js-{rjob}-{job_index}",
    }
    return pod(labels, {"batch.kubernetes.io/job-completion-index": str(completion)},
               owner=("batch/v1", "Job", f"js-{rjob}-{job_index}"))


def test_indexed_job_rank_is_the_completion_index_and_writers_its_completions() -> None:
    # Since 1.28 the index is a label too; before, only the annotation.
    for p in (pod({"batch.kubernetes.io/job-completion-index": "2"},
                  {"batch.kubernetes.io/job-completion-index": "2"}),
              pod({}, {"batch.kubernetes.io/job-completion-index": "2"})):
        found = derive(p, owners=Owners(job=job(4)))
        assert (found.kind, found.rank, found.writers) == ("Job", 2, 4)
    assert derive(pod({}, {"batch.kubernetes.io/job-completion-index": "2"})).writers is None


def test_jobset_global_rank_over_replicated_jobs_of_different_sizes() -> None:
    # leader: 1 Job × 1 pod; workers: 2 Jobs × 2 pods → ranks 0 | 1 2 | 3 4.
    spec = jobset([("leader", 1, 1), ("workers", 2, 2)])
    ranks = {}
    for rjob, job_index, global_index, size in (("leader", 0, 0, 1), ("workers", 0, 1, 2),
                                                 ("workers", 1, 2, 2)):
        for c in range(size):
            found = derive(jobset_pod(rjob, job_index, global_index, c, 1, 3),
                           owners=Owners(job=job(size, "JobSet"), jobset=spec))
            ranks[(rjob, job_index, c)] = found.rank
            assert found.writers == 5 and found.kind == "JobSet"
    assert sorted(ranks.values()) == [0, 1, 2, 3, 4]
    assert ranks[("workers", 1, 1)] == 4


def test_jobset_without_its_spec_uses_the_global_index_and_this_jobs_size() -> None:
    # Two replicated Jobs × 2 Jobs × 2 pods: the job-index restarts at 0 in
    # each replicated Job, the global index does not.
    seen = []
    for rjob, offset in (("a", 0), ("b", 2)):
        for j in range(2):
            for c in range(2):
                found = derive(jobset_pod(rjob, j, offset + j, c, 2, 4),
                               owners=Owners(job=job(2, "JobSet")))
                seen.append(found.rank)
                assert found.writers is None and "assumed 2 pods" in found.source
    assert sorted(seen) == list(range(8))


def test_jobset_without_global_index_or_job_size_names_what_is_missing() -> None:
    old = jobset_pod("a", 1, 1, 0, 2, 2)
    del old["metadata"]["labels"]["jobset.sigs.k8s.io/job-global-index"]
    with pytest.raises(RankMissing, match="job-global-index is missing") as error:
        derive(old, owners=Owners(job=job(2)))
    assert error.value.kind == "JobSet"
    with pytest.raises(RankMissing, match="size of the pod's Job"):
        derive(jobset_pod("a", 1, 1, 0, 2, 2))
    # With the JobSet's spec, a pre-v0.6 pod (no global index) is still exact.
    found = derive(old, owners=Owners(jobset=jobset([("a", 2, 2)])))
    assert (found.rank, found.writers) == (2, 4)


def test_trainjob_counts_only_the_node_replicated_job() -> None:
    spec = jobset([("dataset-initializer", 1, 1), ("model-initializer", 1, 1),
                   ("node", 1, 4)], owner_kind="TrainJob")
    found = derive(jobset_pod("node", 0, 2, 3, 1, 3), owners=Owners(jobset=spec))
    assert (found.kind, found.rank, found.writers) == ("TrainJob", 3, 4)
    with pytest.raises(RankMissing, match=r"dataset-initializer.*not one of the replicated Jobs"):
        derive(jobset_pod("dataset-initializer", 0, 0, 0, 1, 3), owners=Owners(jobset=spec))


PYTORCH = {"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1},
                                            "Worker": {"replicas": 3}}}}


def pytorch_pod(role: str, index: int) -> dict[str, Any]:
    return pod({"training.kubeflow.org/job-name": "bert",
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-type": role,
                "training.kubeflow.org/replica-index": str(index)},
               owner=("kubeflow.org/v1", "PyTorchJob", "bert"))


def test_pytorchjob_master_is_rank_zero_and_workers_follow() -> None:
    ranks = [derive(pytorch_pod(r, i), owners=Owners(pytorchjob=PYTORCH)).rank
             for r, i in (("master", 0), ("worker", 0), ("worker", 1), ("worker", 2))]
    assert ranks == [0, 1, 2, 3]
    assert derive(pytorch_pod("worker", 2), owners=Owners(pytorchjob=PYTORCH)).writers == 4
    workers_only = {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}}
    assert derive(pytorch_pod("worker", 0), owners=Owners(pytorchjob=workers_only)).rank == 0


def test_pytorchjob_worker_without_the_job_refuses_to_guess() -> None:
    assert derive(pytorch_pod("master", 0)).rank == 0
    with pytest.raises(RankMissing, match="whether a Master exists"):
        derive(pytorch_pod("worker", 1))
    with pytest.raises(RankMissing, match="expected master or worker"):
        derive(pytorch_pod("ps", 0), owners=Owners(pytorchjob=PYTORCH))


def lws_pod(group: int, worker: int, size: int = 4) -> dict[str, Any]:
    return pod({"leaderworkerset.sigs.k8s.io/name": "vllm",
                "leaderworkerset.sigs.k8s.io/group-index": str(group),
                "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
                "leaderworkerset.sigs.k8s.io/group-key": "689ce1b5"},
               {"leaderworkerset.sigs.k8s.io/size": str(size)})


def test_leaderworkerset_rank_is_group_times_size_plus_worker() -> None:
    lws = {"spec": {"replicas": 3}}
    ranks = {derive(lws_pod(g, w), owners=Owners(leaderworkerset=lws)).rank
             for g in range(3) for w in range(4)}
    assert ranks == set(range(12))
    found = derive(lws_pod(1, 2), owners=Owners(leaderworkerset=lws))
    assert (found.rank, found.writers) == (6, 12)
    with pytest.raises(RankMissing, match="worker-index=4 is not below the group size 4"):
        derive(lws_pod(0, 4))
    no_size = lws_pod(0, 1)
    no_size["metadata"]["annotations"] = {}
    with pytest.raises(RankMissing, match="size is missing"):
        derive(no_size)


def test_leaderworkerset_labels_lws_adds_later_come_from_the_statefulset_ordinal() -> None:
    """Before LWS's own webhook: a leader `vllm-2` has no index labels yet; a
    worker `vllm-2-3` has its group (from its StatefulSet template) but no
    worker index."""
    leader = pod({"leaderworkerset.sigs.k8s.io/name": "vllm"},
                 {"leaderworkerset.sigs.k8s.io/size": "4"})
    leader["metadata"]["name"] = "vllm-2"
    assert derive(leader).rank == 8
    worker = pod({"leaderworkerset.sigs.k8s.io/name": "vllm",
                  "leaderworkerset.sigs.k8s.io/group-index": "2"},
                 {"leaderworkerset.sigs.k8s.io/size": "4",
                  "leaderworkerset.sigs.k8s.io/leader-name": "vllm-2"})
    worker["metadata"]["name"] = "vllm-2-3"
    assert derive(worker).rank == 11
    worker["metadata"]["name"] = "odd"
    with pytest.raises(RankMissing, match="worker-index is missing"):
        derive(worker)


def test_policy_rule_wins_and_names_its_key() -> None:
    p = pod({"example.com/rank": "5", "batch.kubernetes.io/job-completion-index": "1"},
            {"example.com/slot": "7"})
    assert derive(p, Rule(label="example.com/rank")).rank == 5
    assert derive(p, Rule(annotation="example.com/slot")).rank == 7
    with pytest.raises(RankMissing, match=r"label example\.com/other is missing"):
        derive(p, Rule(label="example.com/other"))
    with pytest.raises(RankMissing, match=r"not a whole number \('-1'\)"):
        derive(pod({"example.com/rank": "-1"}), Rule(label="example.com/rank"))


def test_an_unrecognised_pod_has_no_rank() -> None:
    found = derive(pod({"app": "x"}, owner=("apps/v1", "ReplicaSet", "rs")))
    assert (found.kind, found.rank, found.writers) == ("ReplicaSet", None, None)


def test_mismatch_and_out_of_range_are_reported() -> None:
    found = derive(pod({"batch.kubernetes.io/job-completion-index": "3"}),
                   owners=Owners(job=job(4)))
    assert identity.mismatch(found, 4) is None and identity.out_of_range(found, 4) is None
    assert identity.mismatch(found, 2) == "spec.writers is 2 but the Job has 4 pods that write"
    assert "rank 3" in (identity.out_of_range(found, 2) or "")


@given(st.text(max_size=6))
def test_only_plain_digits_are_ranks(value: str) -> None:
    p = pod({"batch.kubernetes.io/job-completion-index": value})
    if value.isascii() and value.isdigit():
        assert derive(p).rank == int(value)
    else:
        with pytest.raises(RankMissing):
            derive(p)
