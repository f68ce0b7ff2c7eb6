"""Writer identity at admission, against a real apiserver and the operator as
a process: ranks from the workload's labels (a JobSet's global index across
replicated Jobs), refusals that name the pods, and no two live pods of a
policy holding one writer rank. (No JobSet controller runs here: the Jobs
and pods are created with the labels and owners it would give them.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from cluster_helpers import (
    INJECT,
    JOB_INDEX,
    POLICIES,
    create,
    get,
    indexed_job,
    owned_by,
    pod,
    policy,
    wait_for,
)
from operator_process import OperatorProcess

from support.apiserver import Cluster

GRACE = {"terminationGracePeriodSeconds": 3600}



def _ready(cluster: Cluster, namespace: str, name: str) -> None:
    wait_for(lambda: (get(cluster, namespace, POLICIES, name).get("status") or {}).get("phase"),
             what=f"policy {name} sized")


def _writer_env(stored: dict[str, Any]) -> str:
    agent = next(c for c in stored["spec"]["initContainers"] if c["name"] == "ckptdrain-agent")
    return str(next(e["value"] for e in agent["env"] if e["name"] == "CKPTDRAIN_WRITER_ID"))



def test_jobset_pods_get_distinct_global_ranks_across_replicated_jobs(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """Two replicated Jobs × 1 Job × 2 pods: `job-index` is 0 in both, the
    global index is not, so the four pods are writers 0..3."""
    apply(policy("js", writers=4))
    _ready(cluster, namespace, "js")
    ranks = {}
    for global_index, rjob in enumerate(("trainer-a", "trainer-b")):
        jobset = {"jobset.sigs.k8s.io/jobset-name": "js",
                  "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                  "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
                  "jobset.sigs.k8s.io/global-replicas": "2",
                  "jobset.sigs.k8s.io/job-index": "0",
                  "jobset.sigs.k8s.io/job-global-index": str(global_index)}
        job = indexed_job(cluster, namespace, f"js-{rjob}-0", 2, jobset)
        for completion in range(2):
            name = f"js-{rjob}-0-{completion}"
            body = pod(name, {"app": "js", **INJECT, **jobset, JOB_INDEX: str(completion)},
                       completion, **GRACE)
            made = create(cluster, namespace, owned_by(body, job))
            assert made.returncode == 0, made.stderr
            stored = json.loads(made.stdout)
            ranks[name] = _writer_env(stored)
            assert stored["metadata"]["labels"]["ckptdrain.io/writer"] == ranks[name]
    assert ranks == {"js-trainer-a-0-0": "0", "js-trainer-a-0-1": "1",
                     "js-trainer-b-0-0": "2", "js-trainer-b-0-1": "3"}


def test_a_second_live_pod_claiming_a_writer_is_refused_naming_both(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("llama", writers=2))
    _ready(cluster, namespace, "llama")
    first = pod("first", {"app": "llama", **INJECT}, 1, **GRACE)
    first["metadata"]["finalizers"] = ["example.com/hold"]  # stays while being deleted
    assert create(cluster, namespace, first).returncode == 0
    twin = create(cluster, namespace, pod("twin", {"app": "llama", **INJECT}, 1, **GRACE))
    assert twin.returncode != 0
    assert "pod twin" in twin.stderr and "live pod first already holds" in twin.stderr
    assert "writer 1 of policy llama" in twin.stderr
    # Another rank, and another policy's writer 1, are fine.
    assert create(cluster, namespace, pod("other", {"app": "llama", **INJECT}, 0,
                                           **GRACE)).returncode == 0

    # The replacement of a pod being deleted is admitted as the same writer.
    cluster.kubectl("delete", "-n", namespace, "pod", "first", "--wait=false")
    try:
        replacement = create(cluster, namespace, pod("replacement", {"app": "llama", **INJECT},
                                                      1, **GRACE))
        assert replacement.returncode == 0, replacement.stderr
        assert _writer_env(json.loads(replacement.stdout)) == "1"
    finally:
        cluster.kubectl("patch", "-n", namespace, "pod", "first", "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}', check=False)

    # A finished pod holds nothing either.
    cluster.kubectl("patch", "-n", namespace, "pod", "replacement", "--subresource=status",
                    "--type=merge", "-p", '{"status":{"phase":"Succeeded"}}')
    again = create(cluster, namespace, pod("again", {"app": "llama", **INJECT}, 1, **GRACE))
    assert again.returncode == 0, again.stderr


def test_a_pod_without_a_rank_is_refused_under_several_writers(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("many", writers=2))
    apply(policy("one"))
    _ready(cluster, namespace, "many")
    _ready(cluster, namespace, "one")
    bare = create(cluster, namespace, pod("bare", {"app": "many", **INJECT}, **GRACE))
    assert bare.returncode != 0
    assert "pod bare (Pod) has no writer rank" in bare.stderr
    assert "spec.identity of policy many" in bare.stderr
    # A JobSet pod without its global index, whose Job cannot be found.
    old = create(cluster, namespace, pod("old", {
        "app": "many", **INJECT, "jobset.sigs.k8s.io/jobset-name": "js",
        "jobset.sigs.k8s.io/job-index": "0"}, 0, **GRACE))
    assert old.returncode != 0
    assert "pod old (JobSet) has no writer rank: label or annotation " \
           "jobset.sigs.k8s.io/job-global-index is missing" in old.stderr
    # A single writer needs no rank: the pod name is its id.
    single = create(cluster, namespace, pod("single", {"app": "one", **INJECT}, **GRACE))
    assert single.returncode == 0, single.stderr
    assert "ckptdrain.io/writer" not in json.loads(single.stdout)["metadata"]["labels"]


def test_policy_identity_label_and_a_workload_writer_count_mismatch(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("custom", writers=4, identity={"rankLabel": "example.com/rank"}))
    apply(policy("indexed", writers=4))
    _ready(cluster, namespace, "custom")
    _ready(cluster, namespace, "indexed")
    ray = create(cluster, namespace, pod("ray-3", {"app": "custom", **INJECT,
                                                    "example.com/rank": "3"}, **GRACE))
    assert ray.returncode == 0, ray.stderr
    assert _writer_env(json.loads(ray.stdout)) == "3"
    high = create(cluster, namespace, pod("ray-9", {"app": "custom", **INJECT,
                                                     "example.com/rank": "9"}, **GRACE))
    assert high.returncode != 0 and "rank 9" in high.stderr
    assert "not below spec.writers (4)" in high.stderr

    # The Job says 2 pods write; the policy says 4: admitted, with a warning.
    job = indexed_job(cluster, namespace, "small", 2, {})
    made = create(cluster, namespace, owned_by(
        pod("small-0", {"app": "indexed", **INJECT, JOB_INDEX: "0"}, 0, **GRACE), job))
    assert made.returncode == 0, made.stderr
    assert "spec.writers is 4 but the Job has 2 pods that write" in made.stderr
    mismatch = wait_for(lambda: _condition(cluster, namespace, "indexed").get("reason")
                        == "WritersMismatch" and _condition(cluster, namespace, "indexed"),
                        what="WritersMismatch on the policy")
    assert "pod small-0's workload has 2 pods that write" in mismatch["message"]


def _condition(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    conditions = (get(cluster, namespace, POLICIES, name).get("status") or {}).get(
        "conditions") or []
    return next((c for c in conditions if c["type"] == "WritersConsistent"), {})


def test_a_duplicate_writer_that_bypassed_admission_shows_on_the_policy(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """Pods that look injected but never met the webhook (opted in only after
    creation: admission sees CREATE only, as when it was off) and hold one
    rank: WritersConsistent turns False naming both, with a Warning event; it
    clears when one goes."""
    apply(policy("llama", writers=2))
    _ready(cluster, namespace, "llama")
    for name in ("left", "right"):
        body = pod(name, {"app": "llama", "ckptdrain.io/writer": "1"}, **GRACE)
        body["metadata"]["annotations"] = {"ckptdrain.io/injected": "true",
                                           "ckptdrain.io/policy": "llama"}
        assert create(cluster, namespace, body).returncode == 0
        # The operator watches opted-in pods only (a server-side label selector).
        cluster.kubectl("label", "-n", namespace, "pod", name, "ckptdrain.io/inject=true")
    bad = wait_for(lambda: _condition(cluster, namespace, "llama").get("status") == "False"
                   and _condition(cluster, namespace, "llama"), what="WritersConsistent=False")
    assert bad["reason"] == "DuplicateWriter"
    assert "writer 1 is held by pods left, right" in bad["message"]
    assert wait_for(lambda: "DuplicateWriter" in cluster.kubectl(
        "get", "events", "-n", namespace, "-o", "json").stdout, what="the event")
    # Sizing, rewriting its own conditions, keeps this one.
    assert [c["type"] for c in get(cluster, namespace, POLICIES, "llama")["status"]
            ["conditions"]][:3] == ["Ready", "Degraded", "BandwidthConstrained"]

    cluster.kubectl("delete", "-n", namespace, "pod", "right")
    good = wait_for(lambda: _condition(cluster, namespace, "llama").get("status") == "True"
                    and _condition(cluster, namespace, "llama"), what="WritersConsistent=True")
    assert good["reason"] == "Consistent"


def test_replicas_past_writers_are_readers_many_per_shard_and_no_writers(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """An Indexed Job of 4 pods under 2 writers with spec.readers: Replicas:
    pods 2 and 3 read shards 0 and 1; a pod declared a reader reads shard 0
    beside its live writer; a second writer 1 is still refused; and the
    policy counts two live writers, consistent with the Job."""
    apply(policy("dp", writers=2, readers="Replicas"))
    _ready(cluster, namespace, "dp")
    job = indexed_job(cluster, namespace, "dp", 4, {})
    stored = {}
    for rank in range(4):
        made = create(cluster, namespace, owned_by(
            pod(f"dp-{rank}", {"app": "dp", **INJECT}, rank, **GRACE), job))
        assert made.returncode == 0, made.stderr
        stored[rank] = json.loads(made.stdout)
    for rank, body in stored.items():
        inits = [c["name"] for c in body["spec"]["initContainers"]]
        labels = body["metadata"]["labels"]
        if rank < 2:
            assert "ckptdrain-agent" in inits and labels["ckptdrain.io/writer"] == str(rank)
            continue
        assert inits == ["ckptdrain-restore"], inits
        assert labels["ckptdrain.io/reader"] == str(rank % 2)
        assert "ckptdrain.io/writer" not in labels
        env = {e["name"]: e.get("value") for e in body["spec"]["initContainers"][0]["env"]}
        assert (env["CKPTDRAIN_ROLE"], env["CKPTDRAIN_WRITER_ID"]) == ("reader", str(rank % 2))
    declared = pod("dp-eval", {"app": "dp", **INJECT}, 0, **GRACE)
    declared["metadata"]["annotations"]["ckptdrain.io/role"] = "reader"
    made = create(cluster, namespace, declared)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["metadata"]["labels"]["ckptdrain.io/reader"] == "0"
    twin = create(cluster, namespace, owned_by(
        pod("dp-twin", {"app": "dp", **INJECT}, 1, **GRACE), job))
    assert twin.returncode != 0 and "live pod dp-1 already holds" in twin.stderr
    ok = wait_for(lambda: _condition(cluster, namespace, "dp").get("message", "").startswith(
        "2 live pod(s)") and _condition(cluster, namespace, "dp"),
        what="two writers on the policy")
    assert ok["status"] == "True" and ok["reason"] == "Consistent"
