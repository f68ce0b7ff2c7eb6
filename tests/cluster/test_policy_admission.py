"""Policy admission against a real apiserver: a selector overlapping
another policy's is refused with labels both would pick, and an update that
would move checkpoints or change the writer count under a live pod is
refused unless the move is said to be meant (docs/operator.md "Overlapping
selectors and moves under live pods")."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from operator_process import WEBHOOK_NAME, OperatorProcess

from support.apiserver import Cluster


def _refused(apply: Callable[..., Any], body: dict[str, Any]) -> str:
    result = apply(body, check=False)
    assert result.returncode != 0, f"accepted: {body['spec']}"
    return str(result.stderr)


def _accepted(apply: Callable[..., Any], body: dict[str, Any]) -> None:
    result = apply(body, check=False)
    assert result.returncode == 0, result.stderr


def _live_pod(cluster: Cluster, namespace: str, name: str, app: str) -> None:
    made = cluster.kubectl("create", "-n", namespace, "-f", "-",
                           input=json.dumps(pod(name, {"app": app, **INJECT})), check=False)
    assert made.returncode == 0, made.stderr
    meta = get(cluster, namespace, "pod", name)["metadata"]
    assert (meta.get("annotations") or {}).get("ckptdrain.io/policy") == app  # injected
    # What policy admission selects the policy's live pods by.
    assert (meta.get("labels") or {}).get("ckptdrain.io/policy") == app


def check_overlap(cluster: Cluster, namespace: str, apply: Callable[..., Any]) -> None:
    _accepted(apply, policy("llama", selector={"matchLabels": {"app": "llama"}}))
    wide = policy("gpus", selector={"matchExpressions": [{"key": "app", "operator": "Exists"}]})
    message = _refused(apply, wide)
    assert "spec.selector: overlaps CheckpointPolicy llama" in message
    assert "app=llama, ckptdrain.io/inject=true" in message
    # Exclusive selectors are admitted, and so is an update of llama itself.
    wide["spec"]["selector"]["matchExpressions"].append(
        {"key": "app", "operator": "NotIn", "values": ["llama"]})
    _accepted(apply, wide)
    _accepted(apply, policy("llama", selector={"matchLabels": {"app": "llama"}},
                            interval="20m"))
    cluster.kubectl("delete", "-n", namespace, POLICIES, "gpus", "llama")


def check_move(cluster: Cluster, namespace: str, apply: Callable[..., Any]) -> None:
    _accepted(apply, policy("mover"))
    moved = policy("mover", storage={"uri": "s3://ckpt-bucket/elsewhere"})
    _accepted(apply, moved)  # no pod yet: nothing can lose its checkpoints
    _live_pod(cluster, namespace, "mover-0", "mover")
    message = _refused(apply, policy("mover", storage={"uri": "s3://ckpt-bucket/third"}))
    assert "spec.storage.uri: cannot change while pods of policy mover live " \
           "(pod mover-0: running or pending)" in message
    assert "spec.relocation.reason" in message
    message = _refused(apply, policy("mover", storage={"uri": "s3://ckpt-bucket/elsewhere"},
                                     writers=2))
    assert "spec.writers: cannot change" in message and "suspend the job" in message
    # The documented move: a new reason in the same update.
    _accepted(apply, policy("mover", storage={"uri": "s3://ckpt-bucket/third"},
                            relocation={"reason": "bucket migration"}))
    stored = get(cluster, namespace, POLICIES, "mover")["spec"]
    assert stored["storage"]["uri"] == "s3://ckpt-bucket/third"
    assert stored["relocation"] == {"reason": "bucket migration", "startFresh": False}
    # The same reason again says nothing about a further move.
    _refused(apply, policy("mover", storage={"uri": "s3://ckpt-bucket/fourth"},
                           relocation={"reason": "bucket migration"}))
    # 403, not 409: `apply --force` does not delete and recreate around it.
    forced = cluster.kubectl("apply", "--force", "-n", namespace, "-f", "-", check=False,
                             input=json.dumps(policy("mover", storage={
                                 "uri": "s3://ckpt-bucket/fourth"})))
    assert forced.returncode != 0, "apply --force got around the guard"
    assert "cannot change while pods of policy mover live" in forced.stderr
    stored = get(cluster, namespace, POLICIES, "mover")["spec"]
    assert stored["storage"]["uri"] == "s3://ckpt-bucket/third"
    # A pod injected before pods carried the policy label is found by its
    # annotation among the opted-in pods without one.
    cluster.kubectl("label", "-n", namespace, "pod", "mover-0", "ckptdrain.io/policy-")
    assert "(pod mover-0: running or pending)" in _refused(apply, policy(
        "mover", storage={"uri": "s3://ckpt-bucket/fourth"}))
    check_create_over_live(cluster, namespace, apply)
    check_restart_window(cluster, namespace, apply)
    cluster.kubectl("delete", "-n", namespace, "pod", "mover-0", "--wait=false")
    cluster.kubectl("delete", "-n", namespace, POLICIES, "mover")


def check_create_over_live(cluster: Cluster, namespace: str,
                           apply: Callable[..., Any]) -> None:
    """Deleting the policy and creating it again does not get around the guard."""
    cluster.kubectl("delete", "-n", namespace, POLICIES, "mover")
    message = _refused(apply, policy("mover", storage={"uri": "s3://ckpt-bucket/fourth"}))
    assert "spec.storage.uri: pods injected for an earlier CheckpointPolicy mover still " \
           "live (pod mover-0: running or pending)" in message
    assert "restart the whole job together" in message
    _refused(apply, policy("mover", storage={"uri": "s3://ckpt-bucket/third"}, writers=2,
                           relocation={"reason": "again"}))
    # What the pod was given: admitted as it is.
    _accepted(apply, policy("mover", storage={"uri": "s3://ckpt-bucket/third"},
                            relocation={"reason": "bucket migration"}))


def _set_phase(cluster: Cluster, namespace: str, name: str, phase: str) -> None:
    cluster.kubectl("patch", "-n", namespace, "pod", name, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"phase": phase}}))


def check_restart_window(cluster: Cluster, namespace: str,
                         apply: Callable[..., Any]) -> None:
    """A pod being deleted (still flushing) counts; a Failed pod no Job
    controls does not."""
    moved = policy("mover", storage={"uri": "s3://ckpt-bucket/fifth"})
    cluster.kubectl("patch", "-n", namespace, "pod", "mover-0", "--type=merge", "-p",
                    json.dumps({"metadata": {"finalizers": ["ckptdrain.io/test-hold"]}}))
    try:
        cluster.kubectl("delete", "-n", namespace, "pod", "mover-0", "--wait=false")
        assert get(cluster, namespace, "pod", "mover-0")["metadata"].get("deletionTimestamp")
        assert "(pod mover-0: being deleted: it flushes its emergency checkpoint to the old " \
               "location first; retry once it is gone)" in _refused(apply, moved)
    finally:
        cluster.kubectl("patch", "-n", namespace, "pod", "mover-0", "--type=merge", "-p",
                        json.dumps({"metadata": {"finalizers": None}}))
    _live_pod(cluster, namespace, "mover-0", "mover")
    assert "(pod mover-0: running or pending)" in _refused(apply, moved)
    _set_phase(cluster, namespace, "mover-0", "Failed")  # no Job to recreate it
    _accepted(apply, moved)


def test_an_overlapping_policy_is_refused_with_labels_both_would_pick(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    check_overlap(cluster, namespace, apply)


def test_a_move_under_a_live_pod_is_refused_unless_said_to_be_meant(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    check_move(cluster, namespace, apply)


@pytest.fixture
def kopf_admission(cluster: Cluster, operator: OperatorProcess,
                   tmp_path: Path) -> Iterator[OperatorProcess]:
    """The session operator swapped for one serving admission on Kopf's server."""
    operator.stop()
    inline = OperatorProcess(cluster, tmp_path, CKPTDRAIN_WEBHOOK_PROCESS="false")
    try:
        inline.start()
        yield inline
    finally:
        inline.stop()
        operator.start()


def test_kopf_server_refuses_the_same(
        cluster: Cluster, kopf_admission: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    wait_for(lambda: apply(policy("llama"), check=False).returncode == 0,
             what="the webhook answering")
    check_overlap(cluster, namespace, apply)
    check_move(cluster, namespace, apply)


def _status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(get(cluster, namespace, POLICIES, name).get("status") or {})


def _conflicting(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    status = _status(cluster, namespace, name)
    return next((c for c in status.get("conditions") or [] if c["type"] == "Conflicting"),
                None)


def test_overlapping_policies_that_got_past_admission_are_marked_on_both(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    # The policy webhook fails closed; without its configuration (deleted
    # by hand, as an outage of admission would let them in) both are stored.
    operator.stop()
    try:
        cluster.kubectl("delete", "validatingwebhookconfiguration", WEBHOOK_NAME)
        _accepted(apply, policy("llama"))
        _accepted(apply, policy("gpus", selector={
            "matchExpressions": [{"key": "app", "operator": "Exists"}]}))
    finally:
        operator.start()
    for name, other in (("llama", "gpus"), ("gpus", "llama")):
        # Another writer's patch from an older status may drop the condition
        # for a moment; the next pass puts it back.
        wait_for(lambda n=name: _status(cluster, namespace, n).get("phase") == "Conflicting"
                 and (_conflicting(cluster, namespace, n) or {}).get("status") == "True",
                 what=f"{name} Conflicting")
        cond = _conflicting(cluster, namespace, name)
        assert cond is not None and cond["status"] == "True"
        assert cond["reason"] == "SelectorOverlap"
        assert f"CheckpointPolicy {other}" in cond["message"]
        assert "app=llama, ckptdrain.io/inject=true" in cond["message"]
    # Made exclusive (the webhook is back and admits it): both clear.
    _accepted(apply, policy("gpus", selector={"matchExpressions": [
        {"key": "app", "operator": "Exists"},
        {"key": "app", "operator": "NotIn", "values": ["llama"]}]}))
    for name in ("llama", "gpus"):
        wait_for(lambda n=name: _status(cluster, namespace, n).get("phase") == "Ready",
                 what=f"{name} Ready again")
        cond = _conflicting(cluster, namespace, name)
        assert cond is not None and cond["status"] == "False"


def test_a_policy_may_send_its_pods_own_identity_only_where_the_platform_says(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """The session operator lists no endpoint (the chart's default): without a
    Secret, only AWS's own; with one, any. A policy stored past the webhook
    (failurePolicy Ignore, an older release) is marked Invalid, naming the
    field, and its pods are refused."""
    ambient = {"uri": "s3://ckpt-bucket/runs", "endpoint": "https://collector.example"}
    message = _refused(apply, policy("ambient", storage=ambient))
    assert "spec.storage.endpoint" in message and "CKPTDRAIN_AMBIENT_ENDPOINTS" in message
    _accepted(apply, policy("ambient", storage={**ambient,
                                                "endpoint": "https://s3.us-east-1.amazonaws.com"}))
    _accepted(apply, policy("keyed", storage={**ambient,
                                              "credentialsSecretRef": {"name": "s3-creds"}}))
    cluster.kubectl("delete", "-n", namespace, POLICIES, "keyed")
    # Stored with the webhook out of the way: the operator's own parser says no.
    cluster.kubectl("delete", "validatingwebhookconfiguration", WEBHOOK_NAME,
                    "--ignore-not-found")
    try:
        _accepted(apply, policy("ambient", storage=ambient))
        status = wait_for(lambda: (get(cluster, namespace, POLICIES, "ambient").get("status")
                                   or {}).get("phase") == "Invalid"
                          and get(cluster, namespace, POLICIES, "ambient")["status"],
                          what="the policy marked Invalid")
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert "storage.endpoint" in ready["message"], ready
        made = cluster.kubectl("create", "-n", namespace, "-f", "-", check=False,
                               input=json.dumps(pod("a-0", {"app": "ambient", **INJECT})))
        assert made.returncode != 0 and "storage.endpoint" in made.stderr, made.stderr
    finally:
        # The operator registers its webhooks again when it starts.
        operator.stop()
        operator.start()
