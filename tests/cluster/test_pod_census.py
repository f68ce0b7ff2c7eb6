"""The pod census against a real apiserver: a policy whose one injected pod
runs its agent is Ready with status.pods.protected 1; a selected bare pod
(labelled after creation, so admission never saw it) turns Ready False with
reason PodsUnprotected and the phase Unprotected; deleting it makes the
policy Ready again. No kubelet runs here: the test writes the agent's
container status as the kubelet would."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from cluster_helpers import INJECT, get, pod, policy, wait_for
from operator_process import OperatorProcess

from support.apiserver import Cluster


def _status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return get(cluster, namespace, "ckpol", "census").get("status") or {}


def _ready(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return next(c for c in _status(cluster, namespace).get("conditions") or []
                if c["type"] == "Ready")


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
                        "phase": "Running", "initContainerStatuses": statuses}}))


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
    wait_for(lambda: _status(cluster, namespace).get("pods", {}).get("starting") == 1,
             what="the injected pod starting")
    assert _ready(cluster, namespace)["status"] == "True"  # starting is not unprotected
    _agent_runs(cluster, namespace, "w-0")
    pods = wait_for(lambda: (p := _status(cluster, namespace).get("pods"))
                    and p.get("protected") == 1 and p, what="pods.protected=1")
    assert pods == {"selected": 1, "protected": 1, "starting": 0, "unprotected": 0}
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
    assert ready["observedGeneration"] == get(cluster, namespace, "ckpol", "census")[
        "metadata"]["generation"]
    status = _status(cluster, namespace)
    assert status["phase"] == "Unprotected"
    assert status["pods"] == {"selected": 2, "protected": 1, "starting": 0, "unprotected": 1}
    # The other writers' conditions survived the census's write.
    assert {"Degraded", "BandwidthConstrained"} <= {c["type"] for c in status["conditions"]}

    cluster.kubectl("delete", "-n", namespace, "pod", "naked", "--wait=false")
    ready = wait_for(lambda: (r := _ready(cluster, namespace))["status"] == "True" and r,
                     what="Ready=True again")
    assert ready["reason"] == "SizingComputed" and "drainer(s)" in ready["message"]
    status = _status(cluster, namespace)
    assert status["phase"] == "Ready" and status["pods"]["unprotected"] == 0
