"""The pod census against a real apiserver: a policy whose one injected pod
waits to be scheduled, then starts, then runs its agent stays Ready, with
status.pods saying which; a selected bare pod (labelled after creation, so
admission never saw it) turns Ready False with reason PodsUnprotected and the
phase Unprotected; deleting it makes the policy Ready again. A policy created
over such a pod is never Ready for a moment; a selector change is recounted
at once, not at the next period. A pod deleted while a replica stood by is
not counted when it becomes active again. No kubelet or scheduler runs here: the test
writes the pod's status as they would."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from operator_process import OperatorProcess
from test_peering import PEERING, _peering

from support.apiserver import Cluster


def _status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return get(cluster, namespace, POLICIES, "census").get("status") or {}


def _ready(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return next(c for c in _status(cluster, namespace).get("conditions") or []
                if c["type"] == "Ready")


def _scheduled_now() -> dict[str, Any]:
    """PodScheduled as the scheduler sets it: the starting clock runs from it."""
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "PodScheduled", "status": "True", "lastTransitionTime": at}


def _scheduled(cluster: Cluster, namespace: str, name: str) -> None:
    """What the scheduler leaves once it placed the pod (the condition)."""
    cluster.kubectl("patch", "-n", namespace, "pod", name, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {
                        "conditions": [_scheduled_now()]}}))


def _agent_runs(cluster: Cluster, namespace: str, name: str) -> None:
    """What the kubelet writes once the native sidecar ckptdrain-agent runs."""
    running = {"state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}, "ready": True,
               "started": True, "restartCount": 0, "image": "ckptdrain:1", "imageID": ""}
    done = {"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}, "ready": False,
            "restartCount": 0, "image": "ckptdrain:1", "imageID": ""}
    body = get(cluster, namespace, "pod", name)
    statuses = [{"name": c["name"], **(running if c["name"] == "ckptdrain-agent" else done)}
                for c in body["spec"]["initContainers"]]
    cluster.kubectl("patch", "-n", namespace, "pod", name, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {
                        "phase": "Running", "conditions": [_scheduled_now()],
                        "initContainerStatuses": statuses}}))


def test_ready_means_every_selected_pod_is_protected(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("census"))
    wait_for(lambda: _status(cluster, namespace).get("pods", {}).get("selected") == 0
             and _status(cluster, namespace).get("phase") == "Ready", what="no pods, Ready")
    cluster.kubectl("create", "-n", namespace, "-f", "-",
                    input=json.dumps(pod("w-0", {"app": "census", **INJECT})))
    assert "ckptdrain.io/injected" in get(cluster, namespace, "pod", "w-0")[
        "metadata"]["annotations"]
    wait_for(lambda: _status(cluster, namespace).get("pods", {}).get("waiting") == 1,
             what="the injected pod waiting to be scheduled")
    assert _ready(cluster, namespace)["status"] == "True"  # waiting is not unprotected
    _scheduled(cluster, namespace, "w-0")
    wait_for(lambda: _status(cluster, namespace).get("pods", {}).get("starting") == 1,
             what="the injected pod starting")
    assert _ready(cluster, namespace)["status"] == "True"  # starting is not unprotected
    _agent_runs(cluster, namespace, "w-0")
    pods = wait_for(lambda: (p := _status(cluster, namespace).get("pods"))
                    and p.get("protected") == 1 and p, what="pods.protected=1")
    generation = get(cluster, namespace, POLICIES, "census")["metadata"]["generation"]
    assert pods == {"selected": 1, "protected": 1, "starting": 0, "waiting": 0,
                    "unprotected": 0, "observedGeneration": generation}
    ready = _ready(cluster, namespace)
    assert (ready["status"], ready["reason"]) == ("True", "SizingComputed")

    # Created without the label, so admission never saw it; labelled later.
    cluster.kubectl("create", "-n", namespace, "-f", "-",
                    input=json.dumps(pod("naked", {"app": "census"})))
    cluster.kubectl("label", "-n", namespace, "pod", "naked", "ckptdrain.io/inject=true")
    ready = wait_for(lambda: (r := _ready(cluster, namespace))["status"] == "False" and r,
                     what="Ready=False")
    assert ready["reason"] == "PodsUnprotected"
    assert ready["message"].startswith("1 of 2 selected pod(s) run unprotected")
    assert "naked" in ready["message"] and "w-0" not in ready["message"]
    assert ready["observedGeneration"] == get(cluster, namespace, POLICIES, "census")[
        "metadata"]["generation"]
    status = _status(cluster, namespace)
    assert status["phase"] == "Unprotected"
    assert status["pods"] == {"selected": 2, "protected": 1, "starting": 0, "waiting": 0,
                              "unprotected": 1, "observedGeneration": generation}
    # The other writers' conditions survived the census's write.
    assert {"Degraded", "BandwidthConstrained"} <= {c["type"] for c in status["conditions"]}

    cluster.kubectl("delete", "-n", namespace, "pod", "naked", "--wait=false")
    ready = wait_for(lambda: (r := _ready(cluster, namespace))["status"] == "True" and r,
                     what="Ready=True again")
    assert ready["reason"] == "SizingComputed" and "drainer(s)" in ready["message"]
    status = _status(cluster, namespace)
    assert status["phase"] == "Ready" and status["pods"]["unprotected"] == 0


def _naked(cluster: Cluster, namespace: str, name: str, labels: dict[str, str]) -> None:
    """A pod admission never saw: created without the label, labelled later."""
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod(name, labels)))
    cluster.kubectl("label", "-n", namespace, "pod", name, "ckptdrain.io/inject=true")


def _verdicts(cluster: Cluster, namespace: str, name: str,
              until: Callable[[dict[str, Any]], bool], limit_s: float = 30.0
              ) -> list[tuple[Any, ...]]:
    """Every (phase, Ready status, Ready reason) the policy shows until `until`."""
    seen: list[tuple[Any, ...]] = []
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        status = get(cluster, namespace, POLICIES, name).get("status") or {}
        ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        verdict = (status.get("phase"), ready.get("status"), ready.get("reason"))
        if verdict != (None, None, None) and (not seen or seen[-1] != verdict):
            seen.append(verdict)
        if until(status):
            return seen
    raise AssertionError(f"timed out after {limit_s}s; seen {seen}")


def test_ready_is_never_true_before_the_pods_are_counted(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    _naked(cluster, namespace, "naked", {"app": "early"})
    apply(policy("early"))
    unprotected = ("Unprotected", "False", "PodsUnprotected")
    # Every verdict the policy ever showed: never Ready first.
    assert _verdicts(cluster, namespace, "early",
                     lambda s: s.get("phase") == "Unprotected") == [unprotected]
    ready = _ready_of(cluster, namespace, "early")
    assert "naked" in ready["message"]


def _status_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return get(cluster, namespace, POLICIES, name).get("status") or {}


def _ready_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return next(c for c in _status_of(cluster, namespace, name).get("conditions") or []
                if c["type"] == "Ready")


def test_a_selector_change_is_recounted_at_once_whatever_ready_says(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], tmp_path: Path) -> None:
    # A period far beyond the wait: only the recount of the new spec passes.
    operator.stop()
    slow = OperatorProcess(cluster, tmp_path / "slow", CKPTDRAIN_WATCHDOG_PERIOD="10m")
    slow.workdir.mkdir()
    try:
        slow.start()
        _naked(cluster, namespace, "naked", {"app": "other"})
        apply(policy("sel"))
        wait_for(lambda: (s := _status_of(cluster, namespace, "sel")).get("phase") == "Ready"
                 and s.get("pods", {}).get("selected") == 0, what="Ready, nothing selected")
        cluster.kubectl("patch", "-n", namespace, POLICIES, "sel", "--type=merge", "-p",
                        json.dumps({"spec": {"selector": {"matchLabels": {"app": "other"}}}}))
        status = wait_for(lambda: (s := _status_of(cluster, namespace, "sel")).get(
            "phase") == "Unprotected" and s, what="Unprotected", timeout_s=25)
        assert status["pods"]["unprotected"] == 1
        assert status["pods"]["observedGeneration"] == get(
            cluster, namespace, POLICIES, "sel")["metadata"]["generation"]
    finally:
        slow.stop()
        operator.start()


def test_a_pod_deleted_while_standing_by_is_not_counted_after_a_failover(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], tmp_path: Path) -> None:
    # Its watch paused, a standby never hears of the pods deleted meanwhile.
    _peering(cluster)
    operator.stop()
    first = OperatorProcess(cluster, tmp_path / "first", standalone=False,
                            CKPTDRAIN_PEERING=PEERING, CKPTDRAIN_PEERING_PRIORITY="100")
    second = OperatorProcess(cluster, tmp_path / "second", standalone=False,
                             CKPTDRAIN_PEERING=PEERING, CKPTDRAIN_PEERING_PRIORITY="200")
    first.workdir.mkdir()
    second.workdir.mkdir()
    try:
        first.start()
        apply(policy("ghost"))
        _naked(cluster, namespace, "naked", {"app": "ghost"})
        wait_for(lambda: _status_of(cluster, namespace, "ghost").get("phase") == "Unprotected",
                 what="Unprotected under the first replica")
        second.start()  # a higher priority: the first stands by
        wait_for(lambda: "now standby" in first.tail(1_000_000), what="the first standing by")
        cluster.kubectl("delete", "-n", namespace, "pod", "naked", "--wait=false")
        wait_for(lambda: _status_of(cluster, namespace, "ghost").get("phase") == "Ready",
                 what="Ready under the second replica")
        second.stop()
        wait_for(lambda: first.tail(1_000_000).count("now active") >= 2,
                 what="the first active again", timeout_s=90)
        # Its new term counts again: from a store that no longer holds the pod.
        # Watched from now until its LIST has forgotten the pod (logged before
        # it counts) and 10 s more.
        seen: list[tuple[Any, ...]] = []

        def look() -> None:
            status = _status_of(cluster, namespace, "ghost")
            seen.append((status.get("phase"), status.get("pods", {}).get("unprotected")))

        wait_for(lambda: look() or "forgot 1 pods deleted unseen" in first.tail(1_000_000),
                 what="the new term's LIST to forget the pod")
        end = time.monotonic() + 10
        while time.monotonic() < end:
            look()
            time.sleep(0.5)
        assert set(seen) == {("Ready", 0)}, seen
    finally:
        first.stop()
        second.stop()
        operator.start()
