"""What admission tells a pod's restore about where the policy's checkpoints
were before its store moved (CKPTDRAIN_EARLIER_STORES), from the policy's
status, and that the node side reads it back."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from typing import Any

import jsonpatch

from ckptdrain.contract.api import ANNOTATION_ROLE
from ckptdrain.contract.earlier_stores import EarlierStore
from ckptdrain.contract.env import Env
from ckptdrain.node import config as node_config
from ckptdrain.operator import config
from ckptdrain.operator.admission import injection
from ckptdrain.operator.admission import rules as admission

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
EARLIER = "CKPTDRAIN_EARLIER_STORES"
MOVED: dict[str, Any] = {
    "lastGlobalStep": 4200,
    "storage": {"uri": "s3://new-bucket/runs/ml/llama", "earlier": [
        {"uri": "s3://old-bucket/runs/ml/llama", "lastGlobalStep": 4200,
         "movedAt": "2026-11-29T10:00:00Z", "reason": "bucket migration"}]}}


def policy_body(status: dict[str, Any] | None, **relocation: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "7B"},
        "interval": "15m", "localTier": {"path": "/mnt/ckptdrain/nvme"},
        "storage": {"uri": "s3://new-bucket/runs"}}
    if relocation:
        spec["relocation"] = relocation
    body: dict[str, Any] = {"metadata": {"name": "llama", "namespace": "ml", "uid": "u"},
                            "spec": spec}
    if status is not None:
        body["status"] = status
    return body


def admitted(policy: dict[str, Any], reader: bool = False) -> dict[str, dict[str, Any]]:
    """The injected containers' env by container name."""
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
        "spec": {"containers": [{"name": "trainer", "image": "t:1"}],
                 "terminationGracePeriodSeconds": 3600}}
    if reader:
        pod["metadata"]["annotations"] = {ANNOTATION_ROLE: "reader"}
    ops = asyncio.run(admission.admit_pod(pod, "ml", CFG, [], logging.getLogger("t"),
                                          [policy], lambda name: lambda rank: [],
                                          every=[policy]))
    out = jsonpatch.apply_patch(copy.deepcopy(pod), ops)
    return {c["name"]: {e["name"]: e.get("value") for e in c.get("env") or []}
            for c in [*out["spec"]["initContainers"], *out["spec"]["containers"]]}


def test_a_moved_policys_pods_tell_restore_where_the_checkpoints_were() -> None:
    env = admitted(policy_body(MOVED))
    assert json.loads(env[injection.RESTORE][EARLIER]) == [
        {"uri": "s3://old-bucket/runs/ml/llama", "step": 4200,
         "movedAt": "2026-11-29T10:00:00Z", "reason": "bucket migration"}]
    # Restore's alone: the agent and the trainer never act on it.
    assert EARLIER not in env[injection.AGENT] and EARLIER not in env["trainer"]
    cfg = node_config.load(environ={k: v for k, v in env[injection.RESTORE].items()
                                    if v is not None})
    assert cfg.earlier_stores == (EarlierStore("s3://old-bucket/runs/ml/llama", 4200,
                                               "2026-11-29T10:00:00Z", "bucket migration"),)
    assert cfg.store_uri == "s3://new-bucket/runs/ml/llama"


def test_a_reader_is_told_too() -> None:
    env = admitted(policy_body(MOVED), reader=True)
    assert env[injection.RESTORE][Env.ROLE.value] == "reader"
    assert json.loads(env[injection.RESTORE][EARLIER])[0]["step"] == 4200


def test_a_move_not_yet_recorded_is_told_as_well() -> None:
    # The spec moved a moment ago; the reconcile has not written the status
    # yet. Step 900 completed after the old prefix became the current one.
    status = {"lastGlobalStep": 900, "recoveryPointTime": "2026-11-29T09:00:00Z",
              "storage": {"uri": "s3://old-bucket/runs/ml/llama",
                          "since": "2026-11-01T00:00:00Z"}}
    told = json.loads(admitted(policy_body(status, reason="m"))[injection.RESTORE][EARLIER])
    assert [(e["uri"], e["step"], e["reason"]) for e in told] == [
        ("s3://old-bucket/runs/ml/llama", 900, "m")]


def test_nothing_told_without_history_or_after_a_fresh_start_with_a_new_reason() -> None:
    for body in (policy_body(None), policy_body({"lastGlobalStep": 5}),
                 policy_body(MOVED, reason="start over", startFresh=True)):
        assert EARLIER not in admitted(body)[injection.RESTORE]


def test_start_fresh_under_the_reason_of_the_move_waives_nothing() -> None:
    env = admitted(policy_body(MOVED, reason="bucket migration", startFresh=True))
    assert json.loads(env[injection.RESTORE][EARLIER])[0]["step"] == 4200
