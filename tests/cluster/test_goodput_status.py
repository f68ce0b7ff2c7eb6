"""Goodput against a real apiserver and the real operator: pods annotated as
their agent and restore annotate them become `status.goodput` and
`status.lastRestoreFailure`, and `ckptdrain goodput` reports them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from operator_process import OperatorProcess

from ckptdrain.contract.goodput import AgentView, RestoreView
from support.apiserver import Cluster


def _create(cluster: Cluster, namespace: str, name: str, annotations: dict[str, str]) -> None:
    body = pod(name, {"app": "llama", **INJECT}, 0, terminationGracePeriodSeconds=3600)
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))
    # As the agent and restore do, on the pod once it exists.
    cluster.kubectl("annotate", "-n", namespace, "pod", name, "--overwrite",
                    *(f"{k}={v}" for k, v in annotations.items()))


def _on_a_node(cluster: Cluster, namespace: str, name: str, at: float) -> None:
    """As the kubelet says it took the pod (there is no kubelet here)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    cluster.kubectl("patch", "-n", namespace, "pod", name, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"phase": "Running",
                                                                 "startTime": started}}))


def _goodput(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return dict((get(cluster, namespace, POLICIES, "llama").get("status") or {})
                .get("goodput") or {})


def _cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptdrain", "goodput", *args],
                          capture_output=True, text=True, env=cluster.env(), timeout=60)


def test_interruption_restore_and_report(cluster: Cluster, operator: OperatorProcess,
                                         namespace: str, apply: Callable[..., Any]) -> None:
    apply(policy("llama", writers=1))
    wait_for(lambda: (get(cluster, namespace, POLICIES, "llama").get("status") or {})
             .get("phase"), what="policy sized")
    now = float(int(time.time()))  # whole seconds, as the pods' startTime has them
    old = AgentView(training_at=now - 100, first_step=0, blocked_s=2.0,
                    interrupted_at=now - 20, step=57, step_s=0.5,
                    completed=((50, now - 30),), newest_local=57, newest_global=50)
    _create(cluster, namespace, "w-a", {"ckptdrain.io/goodput": old.to_json()})
    _on_a_node(cluster, namespace, "w-a", now - 100)
    assert wait_for(lambda: _goodput(cluster, namespace).get("heldSince") == now - 100,
                    what="when the job got its first node")
    cluster.kubectl("delete", "-n", namespace, "pod", "w-a", "--wait=true")
    restore = RestoreView("restored", now - 15, 1.5, step=50, tier="local")
    new = AgentView(training_at=now - 12, first_step=51, blocked_s=1.0)
    _create(cluster, namespace, "w-b", {"ckptdrain.io/restore-result": restore.to_json(),
                                        "ckptdrain.io/goodput": new.to_json()})
    # The replacement got its node 3 s after the interruption.
    _on_a_node(cluster, namespace, "w-b", now - 17)

    status = wait_for(lambda: (g := _goodput(cluster, namespace)).get("recent")
                      and g["recent"][0].get("waitingSeconds") == 3 and g,
                      what="the interruption closed, with its wait for a node")
    entry = status["lastInterruption"]
    assert (entry["pod"], entry["writer"], entry["restoredStep"], entry["restoredTier"]) == \
        ("w-a", "0", 50, "local")
    assert entry["lostSteps"] == 7 and abs(entry["lostSeconds"] - 10) < 0.01
    assert abs(entry["recoverySeconds"] - 8) < 0.01
    # Of the time since the first node (less the 3 s wait): 10 s redone,
    # 5 s from the node to training again, 3 s blocked (the ended pod's 2 s
    # and the live pod's 1 s).
    assert status["interruptions"] == 1 and status["waitingForResourcesSeconds"] == 3
    assert status["badputSeconds"] == 18
    available = status["availableSeconds"]
    assert 97 <= available < 97 + 120
    assert abs(status["runtimeGoodput"] - (1 - 18 / available)) < 1e-5
    # The gauges are set once the status patch returns: waited for.
    wait_for(lambda: all(name in operator.metrics() for name in (
        "ckptdrain_lost_steps{", "ckptdrain_waiting_for_resources_seconds{")),
        what="the goodput gauges")

    done = _cli(cluster, "-n", namespace, "--policy", "llama", "--output", "json")
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["policies"]
    assert report["lostSteps"] == 7 and report["interruptions"] == 1
    assert report["blockedSeconds"] == 3.0  # the ended pod's 2 s, the live pod's 1 s
    assert report["waitingForResourcesSeconds"] == 3 and report["heldSince"] == now - 100
    text = _cli(cluster, "-n", namespace)
    assert text.returncode == 0 and f"CheckpointPolicy {namespace}/llama" in text.stdout
    assert "w-a / 0" in text.stdout and "50 (local)" in text.stdout
    assert "waiting for resources 3s" in text.stdout

    # A restore that fails reaches the policy status, with its reason (w-c
    # replaces w-b: admission gives a writer rank to one live pod at a time).
    cluster.kubectl("delete", "-n", namespace, "pod", "w-b", "--wait=true")
    failed = RestoreView("store_unavailable", now, 600.0, reason="the global tier could "
                         "not be asked (connection refused); gave up after 31 tries")
    _create(cluster, namespace, "w-c", {"ckptdrain.io/restore-result": failed.to_json()})
    failure = wait_for(lambda: get(cluster, namespace, POLICIES, "llama")["status"]
                       .get("lastRestoreFailure"), what="lastRestoreFailure")
    assert failure["pod"] == "w-c" and failure["outcome"] == "store_unavailable"
    assert "gave up after 31 tries" in failure["reason"]
    # Posted right after the status patch.
    assert wait_for(lambda: any(e["reason"] == "RestoreFailed" and "w-c" in e["message"]
                                for e in get(cluster, namespace, "events")["items"]),
                    what="the RestoreFailed event")


def test_cli_errors_name_the_field(cluster: Cluster, crds: None, namespace: str) -> None:
    missing = _cli(cluster, "-n", namespace, "--policy", "nosuch")
    assert missing.returncode == 2
    assert missing.stderr.startswith("ckptdrain: error: --policy: ") and "nosuch" in \
        missing.stderr and "Traceback" not in missing.stderr
    none = _cli(cluster, "-n", namespace)
    assert none.returncode == 0 and "no CheckpointPolicy" in none.stdout


def test_the_apiserver_keeps_every_checkpoint_cost_field(cluster: Cluster, crds: None,
                                                         namespace: str) -> None:
    """`status.checkpointCost` as the operator computes it survives the CRD's
    structural schema: nothing pruned, every value of its declared type."""
    from ckptdrain.contract.goodput import PodView
    from ckptdrain.operator.goodput import cost

    cluster.kubectl("create", "-n", namespace, "-f", "-",
                    input=json.dumps(policy("llama")))
    views = [PodView(name=f"w-{i}", writer=str(i), agent=AgentView(
        blocked_s=30.0 * (i + 1), saves=10, interval_s=900.0, overlap_target=0.1,
        drained_step=40, drain_s=70.0 + i, drain_overlap=(70.0 + i) / 900)) for i in range(2)]
    figures = cost.checkpoint_cost(views)
    assert figures is not None and figures["blockingRule"] == "Within"
    cluster.kubectl("patch", "-n", namespace, POLICIES, "llama", "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"checkpointCost": figures}}))
    stored = get(cluster, namespace, POLICIES, "llama")["status"]["checkpointCost"]
    assert stored == figures


def test_the_apiserver_stores_a_status_patch_as_the_fold_expects(cluster: Cluster, crds: None,
                                                                  namespace: str) -> None:
    """A merge patch's nulls go, inside a list's objects too: after a fresh
    start (no step restored) the stored interruption and agreement lack the
    figures that are not known, as `api.as_stored` says (the fold compares
    against that form, or it writes the status again after every restart)."""
    from ckptdrain import goodput
    from ckptdrain.contract import api
    from ckptdrain.contract.goodput import PodView
    from ckptdrain.operator.apiserver import policy_edge

    cluster.kubectl("create", "-n", namespace, "-f", "-",
                    input=json.dumps(policy("llama")))
    now = float(int(time.time()))
    old = PodView("w-a", "0", agent=AgentView(training_at=now - 100, first_step=0,
                                              interrupted_at=now - 20, step=57),
                  bound_at=now - 100)
    fresh = PodView("w-b", "0", restore=RestoreView("fresh_start", now - 15, 1.0),
                    agent=AgentView(training_at=now - 12, first_step=0), bound_at=now - 17)
    recent = goodput.merge({}, [old, fresh], None)["recent"]
    assert recent[0]["restoredStep"] is None and recent[0]["stepSeconds"] is None
    change = {"goodput": {"recent": recent},
              "lastRestoreAgreement": {"round": 1, "step": None, "why": "fresh",
                                       "detail": "no step every rank holds", "pods": 1,
                                       "startedAt": now - 15}}
    sent = policy_edge.written(POLICIES, {"status": change})["status"]
    cluster.kubectl("patch", "-n", namespace, POLICIES, "llama", "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": sent}))
    stored = get(cluster, namespace, POLICIES, "llama")["status"]
    assert {k: stored.get(k) for k in sent} == api.as_stored(sent)
