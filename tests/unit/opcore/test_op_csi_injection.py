"""Injection with CKPTDRAIN_NODE_TIER=csi: the node tier as the CSI driver's
inline volume, no hostPath and no root container, so the injected pod keeps
to Pod Security `restricted` (tests/cluster/test_csi_injected_pods.py has a
real apiserver judge it)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from ckptdrain.csi import requests as csi_requests
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.admission import injection, node_volume, work_dir
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.policy import spec as policy

HOSTPATH = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
CSI = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0",
                            node_tier="csi", csi_driver="node.ckptdrain.io")


def parse(**local: Any) -> policy.Policy:
    return policy.parse("ml", "llama", {
        "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
        "interval": "15m", "writers": 2,
        "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2, **local},
        "storage": {"uri": "s3://bucket/runs"}}, HOSTPATH)


def restricted_pod(**security: Any) -> dict[str, Any]:
    """A tenant pod that keeps to `restricted` by itself."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
            "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                         "seccompProfile": {"type": "RuntimeDefault"},
                                         **security},
                     "containers": [{"name": "trainer", "image": "t:1", "securityContext": {
                         "allowPrivilegeEscalation": False,
                         "capabilities": {"drop": ["ALL"]}}}]}}


def inject(pod: dict[str, Any], cfg: config.OperatorConfig, **kw: Any) -> dict[str, Any]:
    ops = injection.build_pod_patch(pod, parse(), cfg, default_rate=1e9, rank=1, **kw)
    return jsonpatch.apply_patch(copy.deepcopy(pod), ops)


def volume(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in pod["spec"]["volumes"] if v["name"] == name)


# The checks of Pod Security `restricted` (v1.33) that an injected pod could
# break; the real apiserver's verdict is the cluster test's.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    spec = pod["spec"]
    pod_sc = spec.get("securityContext") or {}
    found = [f"volume {v['name']}: {kind}" for v in spec.get("volumes") or []
             for kind in v if kind != "name" and kind not in RESTRICTED_VOLUMES]
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        sc = c.get("securityContext") or {}
        if sc.get("privileged") or sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{c['name']}: allowPrivilegeEscalation")
        if sc.get("capabilities", {}).get("drop") != ["ALL"] or set(
                sc.get("capabilities", {}).get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{c['name']}: capabilities")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            found.append(f"{c['name']}: runAsNonRoot")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            found.append(f"{c['name']}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile")) or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{c['name']}: seccompProfile")
    return found


def test_the_node_tier_is_the_drivers_inline_volume_naming_the_policy() -> None:
    out = inject(restricted_pod(), CSI)
    assert volume(out, "ckptdrain-local") == {"name": "ckptdrain-local", "csi": {
        "driver": "node.ckptdrain.io", "volumeAttributes": {"policy": "llama"}}}
    assert not any("hostPath" in v for v in out["spec"]["volumes"])
    # The driver hands the data to the agent and the pod's group: no root container.
    names = [c["name"] for c in out["spec"]["initContainers"]]
    assert injection.PREPARE not in names
    assert names[:2] == [injection.RESTORE, injection.AGENT]


def test_the_injected_pod_keeps_to_restricted_only_under_csi() -> None:
    assert restricted_violations(inject(restricted_pod(), CSI)) == []
    # Today's mode breaks it twice: the hostPath and the root prepare container.
    hostpath = restricted_violations(inject(restricted_pod(), HOSTPATH))
    assert "volume ckptdrain-local: hostPath" in hostpath
    assert any(v.startswith(f"{injection.PREPARE}:") for v in hostpath)


def test_a_pod_without_an_fs_group_gets_the_agents_which_the_driver_accepts() -> None:
    out = inject(restricted_pod(), CSI)
    assert out["spec"]["securityContext"]["fsGroup"] == 65532
    assert out["spec"]["securityContext"]["fsGroup"] >= csi_requests.DEFAULT_MIN_MOUNT_GROUP


def root_pod() -> dict[str, Any]:
    """A trainer as an NGC image runs it: root, no securityContext at all."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
            "spec": {"containers": [{"name": "trainer", "image": "nvcr.io/t:1",
                                     "securityContext": {"runAsUser": 0}}]}}


def test_a_root_trainer_needs_no_more_than_baseline_under_csi() -> None:
    """`restricted` refuses root by definition; `baseline` forbids hostPath
    and privileged containers, which only the hostPath mode brings."""
    out = inject(root_pod(), CSI)
    assert out["spec"]["securityContext"]["fsGroup"] == 65532  # the driver accepts it
    assert node_volume.mount_group_problem(root_pod(), 1000) is None
    containers = [*out["spec"]["initContainers"], *out["spec"]["containers"]]
    assert not [v for v in out["spec"]["volumes"] if "hostPath" in v]
    assert not [c["name"] for c in containers
                if (c.get("securityContext") or {}).get("privileged")]
    # Of ours, nothing runs as root: only the trainer, as its image asked.
    assert [c["name"] for c in containers
            if (c.get("securityContext") or {}).get("runAsUser") == 0] == ["trainer"]
    assert admit(root_pod(), CSI)
    hostpath = inject(root_pod(), HOSTPATH)
    assert [v for v in hostpath["spec"]["volumes"] if "hostPath" in v]


def containers_of(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


@pytest.mark.parametrize(("security", "group"), [({}, "65532"), ({"fsGroup": 5000}, "5000")])
def test_the_trainer_works_in_the_drivers_volume(security: dict[str, Any], group: str) -> None:
    # As in the hostPath mode: its own dir in the node tier, so capture links.
    out = inject(restricted_pod(**security), CSI)
    trainer = out["spec"]["containers"][0]
    assert trainer["volumeMounts"] == [{"name": "ckptdrain-local", "mountPath": "/ckptdrain/work",
                                        "subPathExpr": "$(CKPTDRAIN_WORK_NAME)"}]
    assert env_of(trainer)["CKPTDRAIN_WORK_NAME"] == "work-1-$(CKPTDRAIN_POD_UID)"
    assert "ckptdrain-work" not in {v["name"] for v in out["spec"]["volumes"]}
    # The node tier's disk holds it: no emptyDir, so no ephemeral-storage asked.
    assert not [c["name"] for c in containers_of(out)
                if "ephemeral-storage" in (c.get("resources") or {}).get("requests", {})]
    by_name = {c["name"]: c for c in out["spec"]["initContainers"]}
    for name in (injection.RESTORE, injection.AGENT):
        assert env_of(by_name[name])["CKPTDRAIN_WORK_DIR"] == \
            "/ckptdrain/local/work-1-$(CKPTDRAIN_POD_UID)"
        assert {"name": "ckptdrain-local", "mountPath": "/ckptdrain/local"} in \
            by_name[name]["volumeMounts"]
    # Restore, not root, makes the dir, with the pod's group (restore/pod_work.py).
    assert env_of(by_name[injection.RESTORE])["CKPTDRAIN_WORK_GROUP"] == group
    assert "CKPTDRAIN_WORK_GROUP" not in env_of(by_name[injection.AGENT])
    assert injection.PREPARE not in by_name
    assert list(by_name).index(injection.RESTORE) < list(by_name).index(injection.AGENT)
    own = restricted_pod(**security)
    own["spec"]["containers"][0]["env"] = [{"name": "CKPTDRAIN_WORK_NAME", "value": "x"}]
    assert injection.replaced_env(own, parse())


@pytest.mark.parametrize("kind", ["reader", "memory"])
def test_a_readers_or_a_memory_tiers_work_dir_stays_an_empty_dir(kind: str) -> None:
    pol = parse(memory={"sizeLimit": "64Gi"}) if kind == "memory" else parse()
    pod = restricted_pod()
    ops = injection.build_pod_patch(pod, pol, CSI, default_rate=1e9, rank=1,
                                    reader=kind == "reader")
    out = jsonpatch.apply_patch(copy.deepcopy(pod), ops)
    assert "emptyDir" in volume(out, "ckptdrain-work")
    assert out["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "ckptdrain-work", "mountPath": "/ckptdrain/work"}]
    assert not [c["name"] for c in containers_of(out) if "CKPTDRAIN_WORK_GROUP" in env_of(c)]


def test_a_readers_volume_is_read_only() -> None:
    out = inject(restricted_pod(), CSI, reader=True)
    assert volume(out, "ckptdrain-local")["csi"]["readOnly"] is True


def test_the_pod_contract_shows_the_volume_as_injected() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "pod-contract.md").read_text()
    [block] = re.findall(r"```yaml\n(volumes:\n.*?)```", page, re.S)
    shown = yaml.safe_load(block)["volumes"][0]
    pol = dataclasses.replace(parse(), name=shown["csi"]["volumeAttributes"]["policy"])
    assert shown == node_volume.local_volume(pol, csi_driver=shown["csi"]["driver"])
    assert shown["csi"]["driver"] == config.DEFAULT_CSI_DRIVER


def test_the_attribute_is_the_one_the_driver_accepts() -> None:
    assert node_volume.CSI_POLICY_ATTRIBUTE == csi_requests.POLICY_ATTRIBUTE


def test_the_mode_and_driver_come_from_the_environment() -> None:
    cfg = config.from_env({"CKPTDRAIN_NODE_TIER": "csi",
                           "CKPTDRAIN_CSI_DRIVER": "local.example.com"})
    assert (cfg.csi, cfg.csi_driver) == (True, "local.example.com")
    assert config.from_env({}).csi is False
    with pytest.raises(InvalidInput, match=r"CKPTDRAIN_NODE_TIER.*hostPath or csi"):
        config.from_env({"CKPTDRAIN_NODE_TIER": "CSI"})
    with pytest.raises(InvalidInput, match="CKPTDRAIN_CSI_DRIVER"):
        config.from_env({"CKPTDRAIN_NODE_TIER": "csi", "CKPTDRAIN_CSI_DRIVER": "Node_X"})


SPEC = {"selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
        "interval": "15m", "writers": 1, "localTier": {"path": "/mnt/ckptdrain/nvme"},
        "storage": {"uri": "s3://bucket/runs"}}


def admit(pod: dict[str, Any], cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    pod = copy.deepcopy(pod)
    pod["spec"]["terminationGracePeriodSeconds"] = 3600
    candidates = [{"metadata": {"name": "llama", "namespace": "ml", "uid": "u"}, "spec": SPEC}]
    return asyncio.run(admission.admit_pod(pod, "ml", cfg, [], logging.getLogger("t"),
                                           candidates, lambda name: lambda rank: [],
                                           every=candidates))


@pytest.mark.parametrize("group", [0, 999])
def test_admission_refuses_an_fs_group_the_driver_would_refuse(group: int) -> None:
    # Else the pod is admitted and hangs in ContainerCreating on the mount.
    with pytest.raises(admission.Refused,
                       match=rf"spec\.securityContext\.fsGroup: {group} is below 1000"):
        admit(restricted_pod(fsGroup=group), CSI)
    raised = dataclasses.replace(CSI, csi_min_mount_group=2000)
    with pytest.raises(admission.Refused, match="below 2000"):
        admit(restricted_pod(fsGroup=1500), raised)
    # The hostPath mode has no such driver: the same pod is injected.
    assert admit(restricted_pod(fsGroup=group), HOSTPATH)


@pytest.mark.parametrize("security", [{}, {"fsGroup": 1000}, {"fsGroup": 5000}])
def test_admission_injects_a_pod_the_driver_accepts(security: dict[str, Any]) -> None:
    assert node_volume.mount_group_problem(restricted_pod(**security), 1000) is None
    assert admit(restricted_pod(**security), CSI)


def test_the_minimum_comes_from_the_environment() -> None:
    assert config.from_env({}).csi_min_mount_group == csi_requests.DEFAULT_MIN_MOUNT_GROUP
    cfg = config.from_env({"CKPTDRAIN_NODE_TIER": "csi", "CKPTDRAIN_CSI_MIN_MOUNT_GROUP": "2000"})
    assert cfg.csi_min_mount_group == 2000
    for bad in ("0", "-1", "x"):
        with pytest.raises(InvalidInput, match="CKPTDRAIN_CSI_MIN_MOUNT_GROUP"):
            config.from_env({"CKPTDRAIN_CSI_MIN_MOUNT_GROUP": bad})


def test_the_contract_states_a_readers_work_dir_request_as_injected() -> None:
    # 80 GB, 2 writers (parse()): the figure pod-contract.md gives.
    out = inject(restricted_pod(), CSI, reader=True)
    restore = next(c for c in out["spec"]["initContainers"] if c["name"] == injection.RESTORE)
    request = restore["resources"]["requests"]["ephemeral-storage"]
    assert volume(out, "ckptdrain-work")["emptyDir"]["sizeLimit"] == request
    assert round(work_dir.work_size(parse()) / 2**30) == 112
    page = Path(__file__).resolve().parents[3] / "docs" / "pod-contract.md"
    assert f"112 GiB (`{request}`)" in " ".join(page.read_text().split())
