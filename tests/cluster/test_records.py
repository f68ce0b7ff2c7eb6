"""Checkpoint records, restores and operator restarts against a real apiserver.

The agents are played by `agent.kube.PodReport` (what the real agent calls)
on real pods admitted through the operator's webhook, with the test's
kubeconfig: each writer's progress goes on its own pod, and the operator
alone makes and writes the records."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from kubernetes import client, config
from operator_process import OperatorProcess

from ckptdrain.agent.kube import PodReport
from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.contract import record as fmt
from ckptdrain.contract.record import State
from support.apiserver import Cluster

GRACE = {"terminationGracePeriodSeconds": 3600}


@pytest.fixture
def custom_api(cluster: Cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(str(cluster.kubeconfig)))


def _records(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    items = get(cluster, namespace, "checkpoints")["items"]
    return {i["metadata"]["name"]: i for i in items}


def _state(cluster: Cluster, namespace: str, name: str) -> str | None:
    return (_records(cluster, namespace).get(name, {}).get("status") or {}).get("state")


def _policy_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(get(cluster, namespace, POLICIES, name).get("status") or {})


@pytest.fixture
def core_api(cluster: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))


def _writers(cluster: Cluster, core_api: client.CoreV1Api, namespace: str, policy_name: str,
             count: int, first: int = 0) -> list[PodReport]:
    """`count` pods of the policy (ranks from `first`), each with its agent's PodReport."""
    out = []
    for rank in range(first, first + count):
        name = f"{policy_name}-w{rank}"
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
            pod(name, {"app": policy_name, **INJECT}, rank, **GRACE)))
        out.append(PodReport(namespace, name, rank, first + count, api=core_api))
    return out


def _checkpoint(writers: list[PodReport], step: int, state: str, size: int = 1_000_000,
                message: str = "") -> None:
    """Each writer reaches `state` on `step` and says so on its pod (one patch)."""
    for w in writers:
        w.report(CheckpointEvent(step, State(state), size, message=message))
        assert w.publish(0)


def test_records_complete_and_retention_removes_old_ones(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    apply(policy("llama", writers=2, storage={"uri": "s3://bucket/runs", "keep": 2}))
    wait_for(lambda: _policy_status(cluster, namespace, "llama").get("phase"))
    writers = _writers(cluster, core_api, namespace, "llama", 2)

    _checkpoint(writers[:1], 100, "Local")
    assert wait_for(lambda: _state(cluster, namespace, "llama-s100") == "Capturing")
    _checkpoint(writers[1:], 100, "Local")
    assert wait_for(lambda: _state(cluster, namespace, "llama-s100") == "Local")
    assert wait_for(lambda: _policy_status(cluster, namespace, "llama")
                    .get("lastLocalStep") == 100)

    _checkpoint(writers[:1], 100, "Global")
    assert wait_for(lambda: _state(cluster, namespace, "llama-s100") == "Draining")
    _checkpoint(writers[1:], 100, "Global")
    assert wait_for(lambda: _state(cluster, namespace, "llama-s100") == "Global")
    record = _records(cluster, namespace)["llama-s100"]
    assert record["status"]["writersReady"] == "2/2" and record["status"]["completionTime"]
    # Counts and ranges, each writer's bytes once (it said Local, then Global).
    assert record["status"]["ranks"] == {"Global": "0-1"}
    assert record["status"]["sizeBytes"] == 2_000_000 and "writers" not in record["status"]
    uid = get(cluster, namespace, POLICIES, "llama")["metadata"]["uid"]
    assert wait_for(lambda: [o["uid"] for o in _records(cluster, namespace)["llama-s100"]
                             ["metadata"].get("ownerReferences", [])] == [uid])
    status = wait_for(lambda: _policy_status(cluster, namespace, "llama")
                      .get("lastGlobalStep") == 100
                      and _policy_status(cluster, namespace, "llama"))
    assert status["recoveryPointTime"] == record["status"]["completionTime"]
    table = cluster.kubectl("get", "ckpt", "-n", namespace).stdout
    assert "llama-s100" in table and "Global" in table and "2/2" in table

    for step in (200, 300, 400):
        _checkpoint(writers, step, "Global")
    wait_for(lambda: set(_records(cluster, namespace)) == {"llama-s300", "llama-s400"},
             what=f"retention to keep the newest two {_records(cluster, namespace)}")
    assert wait_for(lambda: _policy_status(cluster, namespace, "llama")
                    .get("lastGlobalStep") == 400)


def test_failed_writer_fails_the_checkpoint(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    apply(policy("p", writers=2))
    wait_for(lambda: _policy_status(cluster, namespace, "p").get("phase"))
    writers = _writers(cluster, core_api, namespace, "p", 2)
    _checkpoint(writers[:1], 7, "Failed", 0, message="disk full")
    assert wait_for(lambda: _state(cluster, namespace, "p-s7") == "Failed")
    status = _records(cluster, namespace)["p-s7"]["status"]
    assert status["failures"] == [{"writer": 0, "message": "disk full"}]
    assert status["ranks"] == {"Failed": "0"}


def test_a_writer_gone_still_counts_and_a_hostile_progress_is_ignored(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    apply(policy("j", writers=3, storage={"uri": "s3://bucket/runs", "keep": 1}))
    wait_for(lambda: _policy_status(cluster, namespace, "j").get("phase"))
    writers = _writers(cluster, core_api, namespace, "j", 3)
    _checkpoint(writers[:1], 5, "Global")
    assert wait_for(lambda: (_records(cluster, namespace).get("j-s5", {}).get("status") or {})
                    .get("ranks") == {"Global": "0"})
    # Writer 0's pod goes (preempted after its commit): the record keeps it.
    cluster.kubectl("delete", "pod", "-n", namespace, "j-w0", "--grace-period=0", "--force")
    # Writer 2's pod says it speaks for writer 1, and writer 1's pod carries
    # garbage: neither counts, and neither stops the others.
    cluster.kubectl("annotate", "--overwrite", "-n", namespace, "pod", "j-w2",
                    'ckptdrain.io/progress={"writer":1,"steps":{"5":{"state":"Global",'
                    '"bytes":1,"tiers":["global"]}}}')
    cluster.kubectl("annotate", "--overwrite", "-n", namespace, "pod", "j-w1",
                    'ckptdrain.io/progress={"writer":1,"steps":{"5":{"state":"Done"}}}')
    time.sleep(2)
    assert _records(cluster, namespace)["j-s5"]["status"]["ranks"] == {"Global": "0"}
    # Writer 1 commits and its pod goes at once (an emergency checkpoint's
    # last word, then the pod is deleted): the word still counts.
    _checkpoint(writers[1:2], 5, "Global")
    cluster.kubectl("delete", "pod", "-n", namespace, "j-w1", "--grace-period=0", "--force")
    _checkpoint(writers[2:], 5, "Global")
    assert wait_for(lambda: _state(cluster, namespace, "j-s5") == "Global")
    status = _records(cluster, namespace)["j-s5"]["status"]
    assert status["ranks"] == {"Global": "0-2"} and status["sizeBytes"] == 3_000_000
    assert status["writersReady"] == "3/3"
    # Writer 0 comes back; step 6 completes and retention (keep 1) expires
    # and deletes step 5. Writers still name step 5 in their progress: a
    # restarted operator, which reads every step of every pod afresh, does
    # not make its record again (what they said of it predates step 6).
    for rank in (0, 1):
        writers[rank] = PodReport(namespace, f"j-w{rank}b", rank, 3, api=core_api)
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
            pod(f"j-w{rank}b", {"app": "j", **INJECT}, rank, **GRACE)))
    _checkpoint(writers, 6, "Global")
    wait_for(lambda: set(_records(cluster, namespace)) == {"j-s6"}, what="retention")
    operator.stop()
    operator.start()
    wait_for(lambda: _policy_status(cluster, namespace, "j").get("lastGlobalStep") == 6)
    time.sleep(3)
    assert set(_records(cluster, namespace)) == {"j-s6"}


def test_restore_is_recorded_once_in_policy_status(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("llama"))
    wait_for(lambda: _policy_status(cluster, namespace, "llama").get("phase"))
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
        pod("w-0", {"app": "llama", **INJECT}, terminationGracePeriodSeconds=3600)))
    cluster.kubectl("annotate", "-n", namespace, "pod", "w-0",
                    "ckptdrain.io/restored-from=step=400 tier=local")
    restores = wait_for(lambda: _policy_status(cluster, namespace, "llama").get("restores"))
    assert restores[0]["pod"] == "w-0" and restores[0]["source"] == "step=400 tier=local"
    cluster.kubectl("annotate", "-n", namespace, "pod", "w-0", "unrelated=1")
    events = wait_for(lambda: "Restored" in cluster.kubectl(
        "get", "events", "-n", namespace, "-o", "json").stdout)
    assert events
    assert len(_policy_status(cluster, namespace, "llama")["restores"]) == 1


def test_restores_of_more_pods_than_the_status_keeps_are_recorded_once_each(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    # The status keeps the newest ten restores; the pods past them must not be
    # recorded again (a patch and an Event) at each of their later events.
    apply(policy("llama"))
    wait_for(lambda: _policy_status(cluster, namespace, "llama").get("phase"))
    names = [f"w-{i}" for i in range(13)]
    for name in names:
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
            pod(name, {"app": "llama", **INJECT}, terminationGracePeriodSeconds=3600)))
        cluster.kubectl("annotate", "-n", namespace, "pod", name,
                        "ckptdrain.io/restored-from=step=400 tier=local")

    def restored_events() -> list[str]:
        items = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o",
                                           "json").stdout)["items"]
        return [e["involvedObject"]["name"] for e in items if e.get("reason") == "Restored"]

    wait_for(lambda: set(restored_events()) == set(names))
    for round_ in range(3):
        for name in names:
            cluster.kubectl("annotate", "--overwrite", "-n", namespace, "pod", name,
                            f"unrelated={round_}")
    # The last annotation's event has been handled once its pod is rebalanced
    # again; wait for the operator to see the final round, then count.
    wait_for(lambda: all(
        json.loads(cluster.kubectl("get", "pod", "-n", namespace, name, "-o", "json").stdout)
        ["metadata"]["annotations"].get("unrelated") == "2" for name in names))
    time.sleep(3)
    events = restored_events()
    assert sorted(events) == sorted(names), events
    assert len(_policy_status(cluster, namespace, "llama")["restores"]) == 10


def test_operator_restarted_midway_converges_without_duplicates(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    apply(policy("llama", writers=2, storage={"uri": "s3://bucket/runs", "keep": 1}))
    wait_for(lambda: _policy_status(cluster, namespace, "llama").get("phase"))
    grace = GRACE
    writers = _writers(cluster, core_api, namespace, "llama", 2)
    _checkpoint(writers, 10, "Global")
    wait_for(lambda: _state(cluster, namespace, "llama-s10") == "Global")

    operator.stop()
    try:
        # While it is down: a labelled pod is still admitted (the pod webhook
        # fails open, uninjected); the policy changes; agents keep reporting.
        down = cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json", input=json.dumps(
            pod("w-down", {"app": "llama", **INJECT}, **grace)))
        assert "initContainers" not in json.loads(down.stdout)["spec"]
        apply(policy("llama", writers=2, interval="30m",
                      storage={"uri": "s3://bucket/runs", "keep": 1}))
        _checkpoint(writers, 20, "Global")
        _checkpoint(writers, 30, "Local")
    finally:
        operator.start()
    status = wait_for(lambda: _policy_status(cluster, namespace, "llama")
                      .get("observedGeneration") == 2
                      and _policy_status(cluster, namespace, "llama"), what="resync")
    assert status["requiredBandwidthBytes"] == 31_500_000_000
    wait_for(lambda: set(_records(cluster, namespace)) == {"llama-s20", "llama-s30"},
             what="retention after restart")
    assert wait_for(lambda: _policy_status(cluster, namespace, "llama")
                    .get("lastGlobalStep") == 20)
    assert _state(cluster, namespace, "llama-s30") == "Local"
    assert _records(cluster, namespace)["llama-s20"]["status"]["sizeBytes"] == 2_000_000
    # Writer 1 is rescheduled: its pod goes (with its progress), a new one
    # comes, injected by the restarted operator; the records keep what the
    # old pod said.
    cluster.kubectl("delete", "pod", "-n", namespace, "llama-w1", "--grace-period=0",
                    "--force")
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
        pod("llama-w1", {"app": "llama", **INJECT}, 1, **grace)))
    time.sleep(2)
    assert _state(cluster, namespace, "llama-s30") == "Local"
    pods = {p["metadata"]["name"]: p for p in get(cluster, namespace, "pods")["items"]
            if p["metadata"]["name"] != "w-down"}
    assert set(pods) == {"llama-w0", "llama-w1"}
    for name in pods:
        cluster.kubectl("annotate", "--overwrite", "-n", namespace, "pod", name,
                        "ckptdrain.io/pending-bytes=100")

    def channel() -> tuple[int, int, str]:
        spec = get(cluster, namespace, "checkpointshares", "llama")["spec"]
        return spec["budgetBytes"], spec["drainers"], spec["activeRanks"]
    wait_for(lambda: channel() == (31_500_000_000, 2, "0-1"), what="shares after restart")
    for p in pods.values():
        names = [c["name"] for c in p["spec"]["initContainers"]]
        assert names == ["ckptdrain-prepare", "ckptdrain-restore", "ckptdrain-agent"]
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    sized = [e for e in events["items"] if e.get("reason") == "Sized"]
    assert sum(e.get("count", 1) for e in sized) <= 2  # create + the one update, not resumes


def test_a_stalled_drain_is_impossible_to_miss(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    # Global every 4 s, so stalled after 2 × 4 s + the drain time (0.4 s).
    apply(policy("fast", interval="4s"))
    wait_for(lambda: _policy_status(cluster, namespace, "fast").get("phase") == "Ready")
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
        pod("w-0", {"app": "fast", **INJECT}, terminationGracePeriodSeconds=3600)))

    def degraded() -> dict[str, Any]:
        conditions = _policy_status(cluster, namespace, "fast").get("conditions", [])
        return next(c for c in conditions if c["type"] == "Degraded")

    wait_for(lambda: degraded()["reason"] == "DrainStalled", timeout_s=40, what="stall")
    assert _policy_status(cluster, namespace, "fast")["phase"] == "Stalled"
    assert "no checkpoint has completed globally" in degraded()["message"]
    # The watchdog posts the Event after it writes the condition: waited for.
    wait_for(lambda: "DrainStalled" in cluster.kubectl(
        "get", "events", "-n", namespace, "-o", "json").stdout, what="the DrainStalled Event")

    writer = PodReport(namespace, "w-0", 0, 1, api=core_api)
    _checkpoint([writer], 1, "Global", 10)
    wait_for(lambda: degraded()["status"] == "False", timeout_s=8, what="recovery")
    assert _policy_status(cluster, namespace, "fast")["phase"] == "Ready"


def test_an_operator_restarted_with_hundreds_of_pods_present_comes_up_and_acts(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    """Until Kopf has indexed every object present, each object's worker waits
    for all the others; a cap on workers below the objects present would hang
    the restarted operator for good (it did, with a cap of 64)."""
    from concurrent.futures import ThreadPoolExecutor

    count = 150
    apply(policy("many", writers=count))
    wait_for(lambda: _policy_status(cluster, namespace, "many").get("phase"))
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda rank: core_api.create_namespaced_pod(namespace, pod(
            f"many-w{rank}", {"app": "many", **INJECT}, rank, **GRACE)), range(count)))
    operator.stop()
    operator.start()
    for rank in (0, count - 1):
        cluster.kubectl("annotate", "--overwrite", "-n", namespace, "pod", f"many-w{rank}",
                        "ckptdrain.io/pending-bytes=100")
    wait_for(lambda: get(cluster, namespace, "checkpointshares", "many")["spec"]["drainers"]
             == 2, what="the restarted operator acting on its pods' reports", timeout_s=60)
    assert _policy_status(cluster, namespace, "many")["drainers"] == count


def test_the_checkpoint_crd_takes_only_rank_ranges_in_recaptured(
        cluster: Cluster, crds: None, namespace: str, custom_api: client.CustomObjectsApi
) -> None:
    """A hand edit naming ranks by the trillion, or anything but rank ranges,
    is refused by the apiserver before the operator's fold reads it."""
    custom_api.create_namespaced_custom_object(
        "ckptdrain.io", "v1alpha1", namespace, "checkpoints",
        fmt.build_record(namespace, "edit", 5, 3))

    def set_recaptured(text: str) -> None:
        custom_api.patch_namespaced_custom_object_status(
            "ckptdrain.io", "v1alpha1", namespace, "checkpoints", "edit-s5",
            {"status": {"recaptured": text}})

    set_recaptured("0-2,5")
    for hostile in ("5-1000000000000", "not ranks", "0," * 40_000):
        with pytest.raises(client.exceptions.ApiException) as refused:
            set_recaptured(hostile)
        assert refused.value.status == 422, hostile[:20]
        assert "recaptured" in (refused.value.body or ""), hostile[:20]
    assert _records(cluster, namespace)["edit-s5"]["status"]["recaptured"] == "0-2,5"
