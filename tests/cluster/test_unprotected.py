"""The sweep against a real apiserver: an opted-in pod that bypassed
admission (labelled after creation: the webhook sees CREATE only) is
flagged on the pod (Event), on the policy (PodsUnprotected) and in metrics,
and all of it clears when the pod goes away. An injected pod is never
flagged."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from operator_process import OperatorProcess

from support.apiserver import Cluster


def _condition(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    status = get(cluster, namespace, POLICIES, name).get("status") or {}
    return next((c for c in status.get("conditions") or []
                 if c["type"] == "PodsUnprotected"), None)


def _gauge(operator: OperatorProcess, namespace: str, name: str) -> float | None:
    labels = f'namespace="{namespace}",policy="{name}"'
    found = re.search(r"^ckptdrain_unprotected_pods\{" + re.escape(labels) + r"\} (\S+)$",
                      operator.metrics(), re.M)
    return float(found.group(1)) if found else None


def test_a_pod_that_bypassed_admission_is_flagged_and_cleared(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("bare"))
    wait_for(lambda: (get(cluster, namespace, POLICIES, "bare").get("status") or {})
             .get("phase") == "Ready", what="policy sized")
    # Injected through admission: protected, never flagged.
    cluster.kubectl("create", "-n", namespace, "-f", "-",
                    input=json.dumps(pod("fine", {"app": "bare", **INJECT})))
    # Created without the label, so admission never saw it; labelled later.
    cluster.kubectl("create", "-n", namespace, "-f", "-",
                    input=json.dumps(pod("naked", {"app": "bare"})))
    cluster.kubectl("label", "-n", namespace, "pod", "naked", "ckptdrain.io/inject=true")
    assert "ckptdrain.io/injected" not in (
        get(cluster, namespace, "pod", "naked")["metadata"].get("annotations") or {})

    events = wait_for(lambda: get(cluster, namespace, "events", "--field-selector",
                                  "involvedObject.name=naked,reason=Unprotected")["items"],
                      what="an Unprotected Event on the pod")
    assert events[0]["type"] == "Warning" and "Delete the pod" in events[0]["message"]
    condition = wait_for(lambda: (c := _condition(cluster, namespace, "bare"))
                         and c["status"] == "True" and c, what="PodsUnprotected=True")
    assert condition["reason"] == "AdmittedWithoutInjection"
    assert condition["message"].startswith("1 selected pod(s) run without injection")
    assert "naked" in condition["message"] and "fine" not in condition["message"]
    assert wait_for(lambda: _gauge(operator, namespace, "bare") == 1.0, what="gauge 1")
    assert not get(cluster, namespace, "events", "--field-selector",
                   "involvedObject.name=fine,reason=Unprotected")["items"]
    cluster.kubectl("delete", "-n", namespace, "pod", "naked", "--wait=false")
    cleared = wait_for(lambda: (c := _condition(cluster, namespace, "bare"))
                       and c["status"] == "False" and c, what="PodsUnprotected=False")
    assert cleared["reason"] == "AllInjected"
    assert wait_for(lambda: _gauge(operator, namespace, "bare") == 0.0, what="gauge 0")
