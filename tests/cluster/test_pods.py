"""Pods against a real apiserver: injection by the mutating webhook, and
bandwidth shares published in each policy's share channel as drainers come
and go. (No kubelet: pods are stored, never run; the operator reacts to them
all the same.)"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from operator_process import OperatorProcess

from ckptdrain.contract import share as sh
from support.apiserver import Cluster


def _create(cluster: Cluster, namespace: str, body: dict[str, Any],
            *extra: str) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json", *extra,
                           input=json.dumps(body), check=False)


def _ready(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(wait_for(lambda: (get(cluster, namespace, POLICIES, name).get("status") or {})
                         .get("phase") and get(cluster, namespace, POLICIES, name),
                         what=f"policy {name} sized"))


def _share(cluster: Cluster, namespace: str, name: str) -> int:
    ann = get(cluster, namespace, "pod", name)["metadata"].get("annotations", {})
    return int(ann["ckptdrain.io/bandwidth"])


def test_labelled_pod_gets_sidecar_restore_volumes_env(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("llama", writers=2))
    _ready(cluster, namespace, "llama")
    made = _create(cluster, namespace, pod("w-0", {"app": "llama", **INJECT}, index=0,
                                           terminationGracePeriodSeconds=600))
    assert made.returncode == 0, made.stderr
    stored = get(cluster, namespace, "pod", "w-0")
    init = stored["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["ckptdrain-prepare", "ckptdrain-restore",
                                         "ckptdrain-agent"]
    init = init[1:]
    assert init[1]["restartPolicy"] == "Always"
    assert init[1]["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"] for v in stored["spec"]["volumes"]}
    assert {"ckptdrain-local", "ckptdrain-share", "ckptdrain-tmp"} <= volumes
    # A disk local tier: the trainer writes in it, shared through the fsGroup.
    assert "ckptdrain-work" not in volumes
    assert {"name": "ckptdrain-local", "mountPath": "/ckptdrain/work",
            "subPathExpr": "$(CKPTDRAIN_WORK_NAME)"} in \
        stored["spec"]["containers"][0]["volumeMounts"]
    assert stored["spec"]["securityContext"]["fsGroup"] == 65532
    env = {e["name"]: e for e in init[1]["env"]}
    assert env["CKPTDRAIN_POLICY"]["value"] == f"{namespace}/llama"
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "s3-creds"
    trainer_env = {e["name"] for e in stored["spec"]["containers"][0]["env"]}
    assert {"CKPTDRAIN_WORK_DIR", "CKPTDRAIN_RESTORE_RESULT", "CKPTDRAIN_POD_UID",
            "CKPTDRAIN_WORK_NAME"} <= trainer_env
    assert stored["metadata"]["annotations"]["ckptdrain.io/policy"] == "llama"

    # A second admission of the injected pod changes nothing.
    again = json.loads(json.dumps(stored))
    again["metadata"] = {"name": "w-copy", "labels": stored["metadata"]["labels"],
                         "annotations": stored["metadata"]["annotations"]}
    copy = json.loads(_create(cluster, namespace, again).stdout)
    assert copy["spec"]["initContainers"] == stored["spec"]["initContainers"]
    assert copy["spec"]["volumes"] == stored["spec"]["volumes"]
    assert copy["spec"]["containers"][0]["env"] == stored["spec"]["containers"][0]["env"]


def test_server_side_dry_run_is_mutated_and_not_stored(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("llama"))
    _ready(cluster, namespace, "llama")
    dry = _create(cluster, namespace, pod("dry", {"app": "llama", **INJECT},
                                          terminationGracePeriodSeconds=3600),
                  "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["spec"]["initContainers"][2]["name"] == "ckptdrain-agent"
    assert cluster.kubectl("get", "-n", namespace, "pod", "dry", check=False).returncode != 0


def test_unlabelled_pods_are_untouched(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """(An opted-in pod no policy selects is refused: test_unselected.py.)"""
    apply(policy("llama"))
    _ready(cluster, namespace, "llama")
    plain = json.loads(_create(cluster, namespace, pod("plain", {"app": "llama"})).stdout)
    assert "initContainers" not in plain["spec"]
    assert "ckptdrain.io/injected" not in (plain["metadata"].get("annotations") or {})


def test_short_grace_period_warns_or_refuses(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("warn"))
    apply(policy("refuse", gracePolicy="Refuse"))
    _ready(cluster, namespace, "warn")
    _ready(cluster, namespace, "refuse")
    warned = _create(cluster, namespace, pod("w", {"app": "warn", **INJECT}))
    assert warned.returncode == 0
    assert "spec.terminationGracePeriodSeconds" in warned.stderr
    refused = _create(cluster, namespace, pod("r", {"app": "refuse", **INJECT}))
    assert refused.returncode != 0
    assert "spec.terminationGracePeriodSeconds" in refused.stderr


def _channel(cluster: Cluster, namespace: str, name: str) -> sh.Allocation | None:
    """The policy's share channel as an agent reads it; None until it exists."""
    out = cluster.kubectl("get", "-n", namespace, "checkpointshares", name, "-o", "json",
                          check=False)
    return sh.from_object(json.loads(out.stdout)) if out.returncode == 0 else None


def _pending(cluster: Cluster, namespace: str, name: str, value: int) -> None:
    cluster.kubectl("annotate", "--overwrite", "-n", namespace, "pod", name,
                    f"ckptdrain.io/pending-bytes={value}")


def _shows(cluster: Cluster, namespace: str, name: str, drainers: int, ranks: str,
           share: float) -> Callable[[], bool]:
    def check() -> bool:
        a = _channel(cluster, namespace, name)
        return a is not None and (a.drainers, a.active_ranks, a.share()) == \
            (drainers, ranks, share)
    return check


def test_shares_follow_the_drainers_through_the_channel_not_the_pods(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("llama", writers=3))
    _ready(cluster, namespace, "llama")
    grace = {"terminationGracePeriodSeconds": 3600}
    for i in range(2):
        _create(cluster, namespace, pod(f"w-{i}", {"app": "llama", **INJECT}, i, **grace))
    # Admission writes each pod's fallback share: the budget over the writers.
    assert {_share(cluster, namespace, f"w-{i}") for i in range(2)} == {21_000_000_000}
    assert wait_for(lambda: get(cluster, namespace, POLICIES, "llama")["status"]
                    .get("drainers") == 2, what="drainers=2")

    # Two agents start draining: both counted, then admitted, at half the budget each.
    _pending(cluster, namespace, "w-0", 2000)
    _pending(cluster, namespace, "w-1", 1000)
    wait_for(_shows(cluster, namespace, "llama", 2, "0-1", 31_500_000_000),
             what="two admitted drainers")
    channel = get(cluster, namespace, "checkpointshares", "llama")
    owner = channel["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("CheckpointPolicy", "llama")

    _create(cluster, namespace, pod("w-2", {"app": "llama", **INJECT}, 2, **grace))
    _pending(cluster, namespace, "w-2", 1000)
    wait_for(_shows(cluster, namespace, "llama", 3, "0-2", 21_000_000_000),
             what="a third drainer admitted, everyone at a third")

    # Done draining: out of the split; the others speed up.
    _pending(cluster, namespace, "w-0", 0)
    wait_for(_shows(cluster, namespace, "llama", 2, "1-2", 31_500_000_000),
             what="w-0 done")
    cluster.kubectl("delete", "-n", namespace, "pod", "w-1", "--wait=true")
    wait_for(_shows(cluster, namespace, "llama", 1, "2", 63_000_000_000),
             what="the whole budget to the last drainer")
    metrics = operator.metrics()
    assert "ckptdrain_allocation_changes_total{" in metrics
    assert 'ckptdrain_webhook_seconds_count{outcome="ok",webhook="pod"}' in metrics
    assert 'ckptdrain_reconciles_total{kind="allocation",outcome="ok"}' in metrics

    # A pod that finished (a Job keeps it) drains nothing more, whatever it
    # last reported.
    cluster.kubectl("patch", "-n", namespace, "pod", "w-2", "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"phase": "Succeeded"}}))
    wait_for(_shows(cluster, namespace, "llama", 0, "", 63_000_000_000), what="no drainer")
    # Not one share was written into a pod: they keep their admission value.
    assert {_share(cluster, namespace, f"w-{i}") for i in (0, 2)} == {21_000_000_000}


def test_capped_policy_splits_only_what_the_cap_allows(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("capped", caps={"bandwidth": "10GB/s"}))
    _ready(cluster, namespace, "capped")
    for i in range(2):
        _create(cluster, namespace, pod(f"c-{i}", {"app": "capped", **INJECT},
                                        terminationGracePeriodSeconds=3600))
        _pending(cluster, namespace, f"c-{i}", 100)
    # Pods without a writer rank are admitted by name.
    wait_for(lambda: (a := _channel(cluster, namespace, "capped")) is not None
             and a.active_pods == ("c-0", "c-1") and a.share() == 5_000_000_000,
             what="capped shares")


RESTRICTED_TRAINER = {
    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [{"name": "trainer", "image": "trainer:1", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
}


@pytest.fixture
def operator_without_prepare(cluster: Cluster, operator: OperatorProcess,
                             tmp_path: Path) -> Iterator[OperatorProcess]:
    """The session operator swapped for one with localTier.prepare: false."""
    operator.stop()
    plain = OperatorProcess(cluster, tmp_path, CKPTDRAIN_PREPARE_LOCAL_TIER="false")
    try:
        plain.start()
        yield plain
    finally:
        plain.stop()
        operator.start()


def test_without_the_prepare_container_restricted_still_refuses_the_hostpath(
        cluster: Cluster, operator_without_prepare: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """What docs/pod-contract.md once claimed: prepare: false makes injected pods
    pass "restricted". Nothing injected runs as root then, and the hostPath
    volume is the one violation left."""
    apply(policy("llama"))
    _ready(cluster, namespace, "llama")
    cluster.kubectl("label", "namespace", namespace,
                    "pod-security.kubernetes.io/enforce=restricted")
    refused = _create(cluster, namespace, pod("w-0", {"app": "llama", **INJECT},
                                              **RESTRICTED_TRAINER))
    assert refused.returncode != 0
    violations = refused.stderr.split('violates PodSecurity "restricted:latest": ', 1)[1]
    assert violations.strip() == ('restricted volume types (volume "ckptdrain-local" uses '
                                  'restricted volume type "hostPath")'), refused.stderr


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_injected_pods_need_pod_security_privileged(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], level: str) -> None:
    """docs/pod-contract.md: the injected hostPath is refused from "baseline" up,
    whatever the trainer does; "privileged" admits the same pod."""
    apply(policy("llama"))
    _ready(cluster, namespace, "llama")
    cluster.kubectl("label", "namespace", namespace,
                    f"pod-security.kubernetes.io/enforce={level}")
    refused = _create(cluster, namespace, pod("w-0", {"app": "llama", **INJECT},
                                              **RESTRICTED_TRAINER))
    assert refused.returncode != 0
    assert f'PodSecurity "{level}' in refused.stderr
    # baseline: 'hostPath volumes (volume "ckptdrain-local")'; restricted: 'volume
    # "ckptdrain-local" uses restricted volume type "hostPath"' (besides the root
    # prepare container, which localTier.prepare: false would remove).
    assert re.search(r'hostPath volumes \(volume "ckptdrain-local"\)|volume "ckptdrain-local" '
                     r'uses restricted volume type "hostPath"', refused.stderr), refused.stderr
    plain = _create(cluster, namespace, pod("plain", {"app": "other"}, **RESTRICTED_TRAINER))
    assert plain.returncode == 0, plain.stderr  # the trainer alone passes
    cluster.kubectl("label", "namespace", namespace, "--overwrite",
                    "pod-security.kubernetes.io/enforce=privileged")
    admitted = _create(cluster, namespace, pod("w-0", {"app": "llama", **INJECT},
                                               **RESTRICTED_TRAINER))
    assert admitted.returncode == 0, admitted.stderr
