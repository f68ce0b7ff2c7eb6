"""The operator's metrics an alert reads, from a real operator process
watching a real apiserver: a policy's conditions as gauges (gone with the
policy), restores counted by tier, and a pod whose restore init container
failed (its status written as the kubelet would) counted until it is gone."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from operator_process import OperatorProcess

from support.apiserver import Cluster


def _sample(operator: OperatorProcess, name: str, **labels: str) -> float | None:
    """The value of the series `name{labels}` (labels in any order), or None."""
    for line in operator.metrics().splitlines():
        found = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if found and dict(re.findall(r'(\w+)="([^"]*)"', found.group(1))) == labels:
            return float(found.group(2))
    return None


def test_conditions_restores_and_failing_restores_reach_the_metrics(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("obs"))
    wait_for(lambda: (get(cluster, namespace, POLICIES, "obs").get("status") or {})
             .get("phase") == "Ready", what="policy sized")
    where = {"namespace": namespace, "policy": "obs"}
    assert wait_for(lambda: _sample(operator, "ckptdrain_policy_condition", **where,
                                    type="Ready", status="True") == 1.0, what="Ready=True")
    assert _sample(operator, "ckptdrain_policy_condition", **where, type="Ready",
                   status="False") == 0.0
    assert _sample(operator, "ckptdrain_policy_created_timestamp_seconds", **where)

    cluster.kubectl("create", "-n", namespace, "-f", "-",
                    input=json.dumps(pod("w-0", {"app": "obs", **INJECT})))
    cluster.kubectl("annotate", "-n", namespace, "pod", "w-0",
                    "ckptdrain.io/restored-from=step=7 tier=global")
    assert wait_for(lambda: _sample(operator, "ckptdrain_restores_total", **where,
                                    tier="global") == 1.0, what="a restore counted")

    # The kubelet's report of a restore that exited 3 (store unavailable).
    status = {"status": {"phase": "Pending", "initContainerStatuses": [{
        "name": "ckptdrain-restore", "image": "x", "imageID": "", "ready": False,
        "restartCount": 0, "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]}}
    cluster.kubectl("patch", "-n", namespace, "pod", "w-0", "--subresource=status",
                    "--type=merge", "-p", json.dumps(status))
    assert wait_for(lambda: _sample(operator, "ckptdrain_restore_failing_pods", **where) == 1.0,
                    what="a failing restore counted")
    cluster.kubectl("delete", "-n", namespace, "pod", "w-0", "--grace-period=0", "--wait=false")
    assert wait_for(lambda: _sample(operator, "ckptdrain_restore_failing_pods", **where) == 0.0,
                    what="the deleted pod no longer counted")

    cluster.kubectl("delete", "-n", namespace, POLICIES, "obs")
    assert wait_for(lambda: _sample(operator, "ckptdrain_policy_condition", **where,
                                    type="Ready", status="True") is None,
                    what="the deleted policy's series gone")
