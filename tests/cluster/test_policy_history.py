"""A policy whose store moves after checkpoints completed, on a real
apiserver with the operator running: its status remembers the old prefix
and its newest step (status.storage, kept by the CRD's structural schema),
and a pod created afterwards carries it into its restore container
(CKPTDRAIN_EARLIER_STORES), so restore refuses to start it from step 0."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from cluster_helpers import INJECT, get, pod, policy, wait_for
from operator_process import OperatorProcess

from support.apiserver import Cluster

EARLIER = "CKPTDRAIN_EARLIER_STORES"


def _storage(cluster: Cluster, namespace: str) -> dict[str, Any]:
    status = get(cluster, namespace, "checkpointpolicy", "llama").get("status") or {}
    return dict(status.get("storage") or {})


def _env(body: dict[str, Any], container: str) -> dict[str, Any]:
    found = next(c for c in body["spec"]["initContainers"] if c["name"] == container)
    return {e["name"]: e.get("value") for e in found.get("env") or []}


def test_a_move_after_checkpoints_is_remembered_and_told_to_new_pods(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    old = f"s3://ckpt-bucket/runs/{namespace}/llama"
    new = f"s3://ckpt-bucket/moved/{namespace}/llama"
    apply(policy("llama"))
    wait_for(lambda: _storage(cluster, namespace).get("uri") == old, what="status.storage.uri")
    assert _storage(cluster, namespace).get("earlier") == []
    # As if checkpoints had completed globally (what the records' sweep writes).
    cluster.kubectl("patch", "-n", namespace, "ckpol", "llama", "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"lastGlobalStep": 4200}}))
    # No pod lives: the move is admitted (a reason is what a move under live pods needs).
    apply(policy("llama", storage={"uri": "s3://ckpt-bucket/moved"},
                 relocation={"reason": "bucket migration"}))
    storage = wait_for(lambda: (s := _storage(cluster, namespace)).get("uri") == new and s,
                       what="the move in status.storage")
    [entry] = storage["earlier"]
    assert (entry["uri"], entry["lastGlobalStep"], entry["reason"]) == (
        old, 4200, "bucket migration")
    datetime.fromisoformat(entry["movedAt"].replace("Z", "+00:00"))  # RFC 3339

    made = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-",
                           input=json.dumps(pod("llama-0", {"app": "llama", **INJECT})))
    body = json.loads(made.stdout)
    restore = _env(body, "ckptdrain-restore")
    assert restore["CKPTDRAIN_STORE_URI"] == new
    assert json.loads(restore[EARLIER]) == [
        {"uri": old, "step": 4200, "movedAt": entry["movedAt"], "reason": "bucket migration"}]
    assert EARLIER not in _env(body, "ckptdrain-agent")

    # startFresh is kept by the schema (its default false when left out).
    assert get(cluster, namespace, "ckpol", "llama")["spec"]["relocation"]["startFresh"] \
        is False
    apply(policy("llama", storage={"uri": "s3://ckpt-bucket/moved"},
                 relocation={"reason": "bucket migration", "startFresh": True}))
    assert get(cluster, namespace, "ckpol", "llama")["spec"]["relocation"]["startFresh"] \
        is True
