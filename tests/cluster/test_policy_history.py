"""A policy whose store moves after checkpoints completed, on a real
apiserver with the operator running: its status remembers the old prefix
and its newest step there, read from the Checkpoint records the operator
made from the writers' reports (status.storage, kept by the CRD's
structural schema), and a pod created afterwards carries it into its
restore container (CKPTDRAIN_EARLIER_STORES), so restore refuses to start
it from step 0; a fresh start asked with a new reason counts for one move."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from kubernetes import client, config
from operator_process import OperatorProcess

from ckptdrain.agent.kube import PodReport
from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.contract.api import timestamp
from ckptdrain.contract.record import State
from support.apiserver import Cluster

EARLIER = "CKPTDRAIN_EARLIER_STORES"


@pytest.fixture
def core_api(cluster: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))


def _storage(cluster: Cluster, namespace: str) -> dict[str, Any]:
    status = get(cluster, namespace, POLICIES, "llama").get("status") or {}
    return dict(status.get("storage") or {})


def _env(body: dict[str, Any], container: str) -> dict[str, Any]:
    found = next(c for c in body["spec"]["initContainers"] if c["name"] == container)
    return {e["name"]: e.get("value") for e in found.get("env") or []}


def _writer(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """A writer pod of the policy as admitted (the webhook's env in it)."""
    made = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-",
                           input=json.dumps(pod(name, {"app": "llama", **INJECT})))
    return dict(json.loads(made.stdout))


def _saves(cluster: Cluster, core_api: client.CoreV1Api, namespace: str, name: str,
           step: int) -> None:
    """Pod `name`'s agent says `step` is on the global tier; the operator
    makes the record and marks it complete."""
    report = PodReport(namespace, name, 0, 1, api=core_api)
    report.report(CheckpointEvent(step, State.GLOBAL, 1_000_000))
    assert report.publish(0)
    wait_for(lambda: any(r["spec"]["step"] == step and (r.get("status") or {}).get(
        "completionTime") for r in get(cluster, namespace, "checkpoints")["items"]),
        what=f"the record of step {step} complete")


def _past(since: str) -> None:
    """Wait out the second of `since`: times are whole seconds, and a step
    completed in the second of a move counts for the prefix before."""
    while timestamp(datetime.now(UTC)) <= since:
        time.sleep(0.05)


def _completions(cluster: Cluster, namespace: str) -> list[tuple[Any, ...]]:
    """Each record's step, state, creation and completion: what a history
    that went wrong was read from."""
    return [(r["spec"]["step"], (r.get("status") or {}).get("state"),
             r["metadata"]["creationTimestamp"], (r.get("status") or {}).get("completionTime"))
            for r in get(cluster, namespace, "checkpoints")["items"]]


def _entries(storage: dict[str, Any]) -> list[tuple[str, int, bool]]:
    return [(e["uri"], e["lastGlobalStep"], bool(e.get("startFresh")))
            for e in storage.get("earlier") or []]


def test_a_move_after_checkpoints_is_remembered_and_told_to_new_pods(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    old = f"s3://ckpt-bucket/runs/{namespace}/llama"
    new = f"s3://ckpt-bucket/moved/{namespace}/llama"
    apply(policy("llama"))
    wait_for(lambda: _storage(cluster, namespace).get("uri") == old, what="status.storage.uri")
    storage = _storage(cluster, namespace)
    assert storage["earlier"] == [] and storage["since"]  # since the policy was made
    _writer(cluster, namespace, "llama-a")
    _saves(cluster, core_api, namespace, "llama-a", 4200)
    cluster.kubectl("delete", "-n", namespace, "pod", "llama-a", "--wait=true")
    apply(policy("llama", storage={"uri": "s3://ckpt-bucket/moved"},
                 relocation={"reason": "bucket migration"}))
    storage = wait_for(lambda: (s := _storage(cluster, namespace)).get("uri") == new and s,
                       what="the move in status.storage")
    [entry] = storage["earlier"]
    assert (entry["uri"], entry["lastGlobalStep"], entry["reason"]) == (
        old, 4200, "bucket migration")
    datetime.fromisoformat(entry["movedAt"].replace("Z", "+00:00"))  # RFC 3339
    assert (storage["since"], storage["reason"], storage["startFresh"]) == (
        entry["movedAt"], "bucket migration", False)

    body = _writer(cluster, namespace, "llama-b")
    restore = _env(body, "ckptdrain-restore")
    assert restore["CKPTDRAIN_STORE_URI"] == new
    assert json.loads(restore[EARLIER]) == [
        {"uri": old, "step": 4200, "movedAt": entry["movedAt"], "reason": "bucket migration"}]
    assert EARLIER not in _env(body, "ckptdrain-agent")
    cluster.kubectl("delete", "-n", namespace, "pod", "llama-b", "--wait=true")

    # startFresh under the move's own reason waives nothing (the schema keeps
    # it, false when left out); with a new reason it waives the entry once.
    assert get(cluster, namespace, POLICIES, "llama")["spec"]["relocation"]["startFresh"] \
        is False
    apply(policy("llama", storage={"uri": "s3://ckpt-bucket/moved"},
                 relocation={"reason": "bucket migration", "startFresh": True}))
    wait_for(lambda: _storage(cluster, namespace).get("startFresh") is True,
             what="startFresh seen")
    assert EARLIER in _env(_writer(cluster, namespace, "llama-c"), "ckptdrain-restore")
    cluster.kubectl("delete", "-n", namespace, "pod", "llama-c", "--wait=true")
    apply(policy("llama", storage={"uri": "s3://ckpt-bucket/moved"},
                 relocation={"reason": "start over", "startFresh": False}))
    wait_for(lambda: _storage(cluster, namespace).get("startFresh") is False,
             what="startFresh off seen")
    apply(policy("llama", storage={"uri": "s3://ckpt-bucket/moved"},
                 relocation={"reason": "start over", "startFresh": True}))
    storage = wait_for(lambda: (s := _storage(cluster, namespace)).get("reason") == "start over"
                       and s, what="the fresh start in status.storage")
    assert _entries(storage) == [(old, 4200, True)]
    assert EARLIER not in _env(_writer(cluster, namespace, "llama-d"), "ckptdrain-restore")


def test_a_fresh_run_below_the_old_step_is_remembered_when_it_moves_on(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], core_api: client.CoreV1Api) -> None:
    old = f"s3://ckpt-bucket/runs/{namespace}/llama"
    new = f"s3://ckpt-bucket/new/{namespace}/llama"
    newer = f"s3://ckpt-bucket/newer/{namespace}/llama"
    apply(policy("llama"))
    wait_for(lambda: _storage(cluster, namespace).get("uri") == old, what="status.storage.uri")
    _writer(cluster, namespace, "llama-a")
    _saves(cluster, core_api, namespace, "llama-a", 4200)
    apply(policy("llama", storage={"uri": "s3://ckpt-bucket/new"},
                 relocation={"reason": "m1", "startFresh": True}))
    wait_for(lambda: _entries(_storage(cluster, namespace)) == [(old, 4200, True)],
             what="the move, waived")
    _past(_storage(cluster, namespace)["since"])
    cluster.kubectl("delete", "-n", namespace, "pod", "llama-a", "--wait=true")
    assert EARLIER not in _env(_writer(cluster, namespace, "llama-b"), "ckptdrain-restore")
    # The fresh run saves at the new prefix up to step 3000: below the old
    # run's 4200, whose record stays the newest (lastGlobalStep stays 4200).
    _saves(cluster, core_api, namespace, "llama-b", 3000)
    assert get(cluster, namespace, POLICIES, "llama")["status"]["lastGlobalStep"] == 4200
    # The next move, with startFresh left true from the first: new is
    # remembered at 3000, and not waived.
    apply(policy("llama", storage={"uri": "s3://ckpt-bucket/newer"},
                 relocation={"reason": "m2", "startFresh": True}))
    wait_for(lambda: _storage(cluster, namespace).get("uri") == newer, what="the second move")
    storage = _storage(cluster, namespace)
    assert _entries(storage) == [(new, 3000, False), (old, 4200, True)], (
        storage, _completions(cluster, namespace))
    cluster.kubectl("delete", "-n", namespace, "pod", "llama-b", "--wait=true")
    told = json.loads(_env(_writer(cluster, namespace, "llama-c"), "ckptdrain-restore")[EARLIER])
    assert [(e["uri"], e["step"], e["reason"]) for e in told] == [(new, 3000, "m2")]
