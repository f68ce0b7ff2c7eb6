"""CheckpointPolicy against a real apiserver: CRDs, sizing status, refusals."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import POLICIES, get, policy, wait_for
from operator_process import OperatorProcess

from ckptdrain.contract import share as sh
from ckptdrain.operator.policy import allocation
from support.apiserver import Cluster


def _status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(get(cluster, namespace, POLICIES, name).get("status") or {})


def test_crds_are_served_with_short_names_and_columns(cluster: Cluster, crds: None) -> None:
    names = cluster.kubectl("api-resources", "--api-group=ckptdrain.io", "-o", "wide").stdout
    assert "ckpol" in names and "ckpt" in names
    crd = json.loads(cluster.kubectl("get", "crd", "checkpointpolicies.ckptdrain.io",
                                     "-o", "json").stdout)
    # Existing columns keep their places (scripts read them), in every version
    # kubectl may show; new ones go after.
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha1", "v1beta1"]
    for version in crd["spec"]["versions"]:
        columns = [c["name"] for c in version["additionalPrinterColumns"]]
        assert columns[:7] == ["Required", "Drainers", "Local Step", "Global Step",
                               "Recovery Point", "Phase", "Goodput"], version["name"]


def test_the_status_schema_holds_conditions_to_metav1_and_phases_to_one_set(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """What any writer of the status (the operator, or a person's patch) may
    put there: conditions with metav1.Condition's required fields and a
    CamelCase reason, and one of the documented phases."""
    apply(policy("schema"))
    wait_for(lambda: _status(cluster, namespace, "schema").get("phase") == "Ready",
             timeout_s=60, what="sized")
    ok = {"type": "Custom", "status": "True", "reason": "Tested", "message": "",
          "lastTransitionTime": "2026-11-29T00:00:00Z"}

    def patch(status: dict[str, Any]) -> Any:
        return cluster.kubectl("patch", "-n", namespace, POLICIES, "schema",
                               "--subresource=status", "--type=merge",
                               "-p", json.dumps({"status": status}), check=False)
    for bad, field in ((dict(ok, reason=""), "reason"), (dict(ok, reason="not camel case"),
                                                         "reason"),
                       ({k: v for k, v in ok.items() if k != "lastTransitionTime"},
                        "lastTransitionTime"),
                       ({k: v for k, v in ok.items() if k != "message"}, "message")):
        refused = patch({"conditions": [bad]})
        assert refused.returncode != 0 and field in refused.stderr, refused.stderr
    refused = patch({"phase": "Pending"})
    assert refused.returncode != 0 and "phase" in refused.stderr, refused.stderr


def test_valid_policy_gets_63_GBps(cluster: Cluster, operator: OperatorProcess,
                                   namespace: str, apply: Callable[..., Any]) -> None:
    apply(policy("llama405"))
    status = wait_for(lambda: _status(cluster, namespace, "llama405").get("phase") and
                      _status(cluster, namespace, "llama405"), what="policy status")
    assert status["requiredBandwidthBytes"] == 63_000_000_000
    assert status["requiredBandwidth"] == "63.0 GB/s"
    assert status["checkpointSize"] == "5.67 TB"
    assert status["phase"] == "Ready"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["observedGeneration"] == 1
    # Defaults from the schema, and Kopf's bookkeeping kept out of status.
    stored = get(cluster, namespace, POLICIES, "llama405")
    annotations = stored["metadata"].get("annotations", {})
    assert "ckptdrain.io/last-handled-configuration" in annotations
    assert all(k.startswith("ckptdrain.io/") or k.startswith("kubectl.kubernetes.io/")
               for k in annotations), annotations
    assert not stored["metadata"].get("finalizers")  # deletion never waits on us
    spec = stored["spec"]
    assert spec["model"]["bytesPerParameter"] == 14 and spec["globalEvery"] == 1
    assert set(status) <= {"observedGeneration", "phase", "conditions", "drainers",
                           "checkpointSize", "checkpointBytes", "requiredBandwidth",
                           "requiredBandwidthBytes", "allowedBandwidth",
                           "allowedBandwidthBytes", "effectiveOverlap", "globalInterval",
                           "drainTime", "perDrainerBandwidth", "recommendedInterval",
                           "youngDalyInterval", "lastLocalStep", "lastGlobalStep",
                           "recoveryPointTime", "restores", "storage", "pods"}
    table = cluster.kubectl("get", POLICIES, "-n", namespace, "llama405").stdout
    assert "63.0 GB/s" in table and "Ready" in table


def test_update_recomputes_and_bumps_observed_generation(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("p"))
    wait_for(lambda: _status(cluster, namespace, "p").get("observedGeneration") == 1)
    apply(policy("p", interval="30m"))
    status = wait_for(lambda: _status(cluster, namespace, "p").get("observedGeneration") == 2
                      and _status(cluster, namespace, "p"), what="generation 2")
    assert status["requiredBandwidthBytes"] == 31_500_000_000


def test_capped_policy_reports_constraint_and_effective_overlap(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("capped", caps={"bandwidth": "21GB/s"}))
    status = wait_for(lambda: _status(cluster, namespace, "capped").get("phase"))
    status = _status(cluster, namespace, "capped")
    assert status["phase"] == "Constrained"
    cond = next(c for c in status["conditions"] if c["type"] == "BandwidthConstrained")
    assert cond["status"] == "True" and cond["reason"] == "PolicyCap"
    assert status["effectiveOverlap"] == "30%"  # 5.67 TB / 21 GB/s = 270 s of 900 s
    assert "30%" in cond["message"]
    # Posted after the status is written (and by Kopf's own queue): waited for.
    wait_for(lambda: "BandwidthConstrained" in cluster.kubectl(
        "get", "events", "-n", namespace, "-o", "json").stdout,
        what="the BandwidthConstrained Event")


def _refused(apply: Callable[..., Any], body: dict[str, Any]) -> str:
    result = apply(body, check=False)
    assert result.returncode != 0, f"accepted: {body}"
    return str(result.stderr)


def test_invalid_policies_are_refused_naming_the_field(
        operator: OperatorProcess, namespace: str, apply: Callable[..., Any]) -> None:
    assert "spec.overlap" in _refused(apply, policy("a", overlap="150%"))
    assert "spec.overlap" in _refused(apply, policy("a", overlap="0%"))
    assert "spec.localTier.path" in _refused(
        apply, policy("b", localTier={"path": "/etc/ckpt"}))
    assert "spec.localTier.path" in _refused(
        apply, policy("b", localTier={"path": "/mnt/ckptdrain/../../etc"}))
    assert "spec.storage.uri" in _refused(apply, policy("c", storage={"uri": "ftp://x/y"}))
    assert "spec.interval" in _refused(apply, policy("d", interval="0s"))
    assert "spec.caps.perDrainer" in _refused(
        apply, policy("e", caps={"bandwidth": "1GB/s", "perDrainer": "2GB/s"}))
    assert "spec.localTier.capacity" in _refused(
        apply, policy("f", localTier={"path": "/mnt/ckptdrain/x", "keep": 3,
                                      "capacity": "10TB"}))
    no_interval = policy("g")
    del no_interval["spec"]["interval"]
    assert "spec.interval" in _refused(apply, no_interval)
    assert "spec.gracePolicy" in _refused(apply, policy("h", gracePolicy="Sometimes"))


@pytest.fixture
def capped_operator(cluster: Cluster, operator: OperatorProcess,
                    tmp_path: Path) -> Iterator[OperatorProcess]:
    """The session operator swapped for one under a 200 GB/s cluster cap."""
    operator.stop()
    capped = OperatorProcess(cluster, tmp_path, CKPTDRAIN_CLUSTER_BANDWIDTH="200GB/s")
    try:
        capped.start()
        yield capped
    finally:
        capped.stop()
        operator.start()


def _constrained(cluster: Cluster, namespace: str, name: str) -> tuple[str, str, int]:
    status = _status(cluster, namespace, name)
    cond = next(c for c in status["conditions"] if c["type"] == "BandwidthConstrained")
    return status["phase"], cond["reason"], status["allowedBandwidthBytes"]


def _run_pod(cluster: Cluster, namespace: str, app: str, name: str | None = None,
             reads_scale: bool = True) -> None:
    """A pod of policy `app` (injected by the webhook; no kubelet runs it):
    a policy with a pod takes part in the cluster cap's split. `reads_scale`:
    its agent said it applies the namespace's scale (what a current agent
    reports in its pod)."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name or f"{app}-0",
                        "labels": {"app": app, "ckptdrain.io/inject": "true"}},
           "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod))
    if reads_scale:
        cluster.kubectl("annotate", "-n", namespace, "pod", name or f"{app}-0",
                        "ckptdrain.io/share-scale=true")


def test_the_cluster_cap_is_split_fairly_among_the_policies_with_pods(
        cluster: Cluster, capped_operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """Ten 63 GB/s policies with pods under a 200 GB/s cap: each alone fits,
    together each gets 20 GB/s, and each says so. An eleventh without pods
    takes nothing from them and says what it will get; its first pod makes
    it count. When eight go, the three left fit again."""
    names = [f"p{i}" for i in range(10)]
    # A name too long for a label value (valid without the peer tier): its
    # channel once failed the joint pass, and every policy's split with it.
    long_named = policy("long")
    long_named["metadata"]["name"] = "l" * 64
    apply(long_named)
    for name in names:
        apply(policy(name))
        _run_pod(cluster, namespace, name)
    for name in names:
        wait_for(lambda n=name: _constrained(cluster, namespace, n)
                 == ("Constrained", "ClusterCap", 20_000_000_000), timeout_s=60, what=name)
    cond = next(c for c in _status(cluster, namespace, "p0")["conditions"]
                if c["type"] == "BandwidthConstrained")
    assert "split fairly (equal weights) with 9 other policies with pods wanting 567 GB/s" \
        in cond["message"], cond["message"]
    apply(policy("idle"))
    wait_for(lambda: _constrained(cluster, namespace, "idle")
             == ("Constrained", "ClusterCap", 18_181_818_181), timeout_s=60, what="idle")
    cond = next(c for c in _status(cluster, namespace, "idle")["conditions"]
                if c["type"] == "BandwidthConstrained")
    assert "no pod of it runs" in cond["message"], cond["message"]
    assert _constrained(cluster, namespace, "p0")[2] == 20_000_000_000
    _run_pod(cluster, namespace, "idle")
    for name in ("p0", "idle"):
        wait_for(lambda n=name: _constrained(cluster, namespace, n)
                 == ("Constrained", "ClusterCap", 18_181_818_181), timeout_s=60, what=name)
    cluster.kubectl("delete", "-n", namespace, POLICIES, "idle", *names[3:])
    for name in names[:3]:
        wait_for(lambda n=name: _constrained(cluster, namespace, n)
                 == ("Ready", "WithinCaps", 63_000_000_000), timeout_s=60, what=name)


def _share_object(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "-n", namespace, "checkpointshares", name, "-o", "json",
                          check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _scale(cluster: Cluster, namespace: str) -> sh.Scale | None:
    obj = _share_object(cluster, namespace, sh.SCALE_NAME)
    return sh.scale_from_object(obj) if obj else None


def _factor(cluster: Cluster, namespace: str) -> float | None:
    scale = _scale(cluster, namespace)
    return None if scale is None else scale.factor


def test_a_new_job_under_the_cap_is_one_scale_write_not_a_rewrite_of_every_channel(
        cluster: Cluster, capped_operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """Two 63 GB/s policies with pods fit a 200 GB/s cap; two more do not: the
    fair level is 50 GB/s, the namespace's scale goes to 50 GB/s ÷ the claim
    and the first two policies' agents take it from there (min(budget,
    claim × factor)),
    their channels unwritten; when the two go, the factor goes back to 1 and
    a channel written under the smaller one grows again."""
    for name in ("p0", "p1"):
        apply(policy(name))
        _run_pod(cluster, namespace, name)
    wait_for(lambda: _factor(cluster, namespace) == 1.0
             and all((_share_object(cluster, namespace, n) or {}).get("spec", {})
                     .get("wantedBytes") for n in ("p0", "p1")),
             timeout_s=60, what="the scale and both channels")
    before = _share_object(cluster, namespace, "p0")
    # The claim: one constant for every policy (its fair part is claim × factor).
    assert before is not None and before["spec"]["wantedBytes"] == int(allocation.CLAIM)
    for name in ("p2", "p3"):
        apply(policy(name))
        _run_pod(cluster, namespace, name)
    factor = 50e9 / allocation.CLAIM
    wait_for(lambda: _factor(cluster, namespace) == pytest.approx(factor),
             timeout_s=60, what="the factor of a 50 GB/s level")
    for name in ("p2", "p3"):
        wait_for(lambda n=name: _constrained(cluster, namespace, n)[1] == "ClusterCap",
                 timeout_s=60, what=f"{name} constrained")
    scale = _scale(cluster, namespace)
    p0 = _share_object(cluster, namespace, "p0")
    assert p0 is not None and \
        p0["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    # What every policy's agents drain at (nobody else drains: the budget is one drainer's).
    for name in ("p0", "p1", "p2", "p3"):
        channel = sh.from_object(_share_object(cluster, namespace, name) or {})
        assert channel.share(scale) == pytest.approx(50e9, rel=1e-6), name

    # A change of p1's own (a per-drainer cap) rewrites its channel under the
    # smaller factor; when the two go, that channel must grow again.
    apply(policy("p1", caps={"perDrainer": "60GB/s"}))
    wait_for(lambda: sh.from_object(_share_object(cluster, namespace, "p1") or {}).budget
             == pytest.approx(50e9, abs=2), timeout_s=60, what="p1 rewritten at 50 GB/s")
    cluster.kubectl("delete", "-n", namespace, POLICIES, "p2", "p3")
    wait_for(lambda: _factor(cluster, namespace) == 1.0, timeout_s=60,
             what="the factor back to 1")
    wait_for(lambda: sh.from_object(_share_object(cluster, namespace, "p1") or {}).budget
             == 63_000_000_000, timeout_s=60, what="p1's channel grown back")
    assert sh.from_object(_share_object(cluster, namespace, "p0") or {}).share(
        _scale(cluster, namespace)) == 63e9


def test_a_policy_with_an_agent_that_has_not_said_it_reads_the_scale_keeps_whole_budgets(
        cluster: Cluster, capped_operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """Until every pod of a policy said its agent reads the scale, the channel
    carries its whole budget (an older agent reads nothing else)."""
    apply(policy("solo"))
    wait_for(lambda: _share_object(cluster, namespace, "solo"), timeout_s=60,
             what="the channel")
    _run_pod(cluster, namespace, "solo", name="w-0", reads_scale=False)
    cluster.kubectl("annotate", "-n", namespace, "pod", "w-0", "ckptdrain.io/pending-bytes=10")
    wait_for(lambda: (_share_object(cluster, namespace, "solo") or {})["spec"]
             .get("drainers") == 1 and "wantedBytes" not in
             (_share_object(cluster, namespace, "solo") or {})["spec"],
             timeout_s=60, what="counted, its budget whole")
    cluster.kubectl("annotate", "-n", namespace, "pod", "w-0", "ckptdrain.io/share-scale=true")
    wait_for(lambda: (_share_object(cluster, namespace, "solo") or {})["spec"]
             .get("wantedBytes") == int(allocation.CLAIM), timeout_s=60,
             what="the agent reads the scale: the claim published")
