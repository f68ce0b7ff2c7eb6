"""operator/admission/injection.py: the pod patch follows docs/pod-contract.md."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptdrain.operator import config
from ckptdrain.operator.admission import injection
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
SPEC = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "405B"},
    "interval": "15m", "overlap": "10%", "writers": 8,
    "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2,
                  "memory": {"sizeLimit": "800Gi"}},
    "storage": {"uri": "s3://bucket/runs", "endpoint": "http://minio:9000",
                "region": "eu-1", "credentialsSecretRef": {"name": "creds"}},
}
POLICY = policy.parse("ml", "llama", SPEC, CFG)
RATE = 63e9 / 8


def pod(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "trainer", "image": "t:1"}]}
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
            "spec": body}


def injected(p: dict[str, Any]) -> dict[str, Any]:
    ops = injection.build_pod_patch(p, POLICY, CFG, default_rate=RATE)
    return jsonpatch.apply_patch(copy.deepcopy(p), ops)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_restore_first_then_native_sidecar() -> None:
    out = injected(pod(initContainers=[{"name": "user-init", "image": "x"}]))
    names = [c["name"] for c in out["spec"]["initContainers"]]
    assert names == ["ckptdrain-prepare", "ckptdrain-restore", "ckptdrain-agent", "user-init"]
    restore, agent = out["spec"]["initContainers"][1:3]
    assert agent["restartPolicy"] == "Always" and "restartPolicy" not in restore
    assert agent["command"] == ["ckptdrain", "agent"]
    assert restore["command"] == ["ckptdrain", "restore"]
    assert agent["image"] == restore["image"] == "ckptdrain:1.0"


def test_containers_are_locked_down() -> None:
    for c in injected(pod())["spec"]["initContainers"][1:]:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert sc["allowPrivilegeEscalation"] is False


def test_prepare_only_hands_the_local_tier_to_the_agent_uid() -> None:
    prepare = injected(pod())["spec"]["initContainers"][0]
    sc = prepare["securityContext"]
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert prepare["volumeMounts"] == [{"name": "ckptdrain-local",
                                        "mountPath": "/ckptdrain/local"}]
    assert "env" not in prepare and "65532" in prepare["command"][-1]


def test_without_prepare_nothing_runs_as_root_and_the_node_must_provide_the_directory(
) -> None:
    cfg = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0",
                                prepare_local_tier=False)
    p = pod()
    out = jsonpatch.apply_patch(
        copy.deepcopy(p), injection.build_pod_patch(p, POLICY, cfg, default_rate=RATE))
    init = out["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["ckptdrain-restore", "ckptdrain-agent"]
    assert all(c["securityContext"]["runAsNonRoot"] is True for c in init)
    local = next(v for v in out["spec"]["volumes"] if v["name"] == "ckptdrain-local")
    assert local["hostPath"]["type"] == "Directory"


@pytest.mark.parametrize("text", ["yes", "1", "off"])
def test_prepare_flag_must_be_true_or_false(text: str) -> None:
    with pytest.raises(Exception, match="CKPTDRAIN_PREPARE_LOCAL_TIER: expected true or false"):
        config.from_env({"CKPTDRAIN_PREPARE_LOCAL_TIER": text})


def test_each_writer_has_its_own_local_directory() -> None:
    env = env_of(injected(pod())["spec"]["initContainers"][2])
    assert env["CKPTDRAIN_LOCAL_DIR"] == "/ckptdrain/local/writer-$(CKPTDRAIN_WRITER_ID)"
    one = policy.parse("ml", "llama", {**SPEC, "writers": 1, "model": {"parameters": "1B"}}, CFG)
    ops = injection.build_pod_patch(pod(), one, CFG, default_rate=RATE)
    out = jsonpatch.apply_patch(copy.deepcopy(pod()), ops)
    assert env_of(out["spec"]["initContainers"][2])["CKPTDRAIN_LOCAL_DIR"] == "/ckptdrain/local"


def test_volumes_and_mounts_per_contract() -> None:
    out = injected(pod(volumes=[{"name": "data", "emptyDir": {}}]))
    vols = {v["name"]: v for v in out["spec"]["volumes"]}
    assert set(vols) == {"data", "ckptdrain-local", "ckptdrain-work", "ckptdrain-share",
                         "ckptdrain-tmp"}
    assert vols["ckptdrain-local"]["hostPath"] == {
        "path": "/mnt/ckptdrain/nvme/ml/llama", "type": "DirectoryOrCreate"}
    assert vols["ckptdrain-work"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "800Gi"}
    item = vols["ckptdrain-share"]["downwardAPI"]["items"][0]
    assert item == {"path": "bandwidth", "fieldRef": {
        "fieldPath": "metadata.annotations['ckptdrain.io/bandwidth']"}}
    agent = out["spec"]["initContainers"][2]
    mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
    assert mounts == {"/ckptdrain/local": "ckptdrain-local", "/ckptdrain/work": "ckptdrain-work",
                      "/ckptdrain/share": "ckptdrain-share", "/tmp": "ckptdrain-tmp"}
    trainer = out["spec"]["containers"][0]
    assert {"name": "ckptdrain-work", "mountPath": "/ckptdrain/work"} in trainer["volumeMounts"]


def test_env_per_contract_and_secrets_only_by_reference() -> None:
    out = injected(pod())
    env = env_of(out["spec"]["initContainers"][2])
    assert env["CKPTDRAIN_POLICY"] == "ml/llama"
    assert env["CKPTDRAIN_STORE_URI"] == "s3://bucket/runs/ml/llama"
    assert env["CKPTDRAIN_S3_ENDPOINT"] == "http://minio:9000" and env["AWS_REGION"] == "eu-1"
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "creds",
                                                         "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {
        "name": "creds", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert env["CKPTDRAIN_WRITER_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["CKPTDRAIN_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["CKPTDRAIN_WRITERS"] == "8" and env["CKPTDRAIN_LOCAL_KEEP"] == "2"
    assert env["CKPTDRAIN_GLOBAL_KEEP"] == "3"
    assert env["CKPTDRAIN_INTERVAL"] == "15m" and env["CKPTDRAIN_OVERLAP"] == "10%"
    assert env["CKPTDRAIN_GLOBAL_EVERY"] == "1"
    assert env["CKPTDRAIN_SHARE_FILE"] == "/ckptdrain/share/bandwidth"
    assert env["CKPTDRAIN_DEFAULT_RATE"] == str(int(RATE))
    assert env["CKPTDRAIN_GRACE_SECONDS"] == "30"
    assert env["CKPTDRAIN_RESTORE"] == "true" and env["CKPTDRAIN_RESTORE_PREFER"] == "local"
    trainer = env_of(out["spec"]["containers"][0])
    assert trainer["CKPTDRAIN_RESTORE_RESULT"] == "/ckptdrain/work/restore.json"
    assert trainer["CKPTDRAIN_WORK_DIR"] == "/ckptdrain/work"
    every_value = str(out)
    assert "secretAccessKey" not in every_value.replace("secretAccessKeyKey", "")


def test_without_a_rank_the_writer_id_is_the_pod_name() -> None:
    env = env_of(injected(pod())["spec"]["initContainers"][1])
    assert env["CKPTDRAIN_WRITER_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_a_derived_rank_is_the_writer_id_and_the_writer_and_policy_labels() -> None:
    ops = injection.build_pod_patch(pod(), POLICY, CFG, default_rate=RATE, rank=5)
    out = jsonpatch.apply_patch(copy.deepcopy(pod()), ops)
    assert env_of(out["spec"]["initContainers"][2])["CKPTDRAIN_WRITER_ID"] == "5"
    assert env_of(out["spec"]["containers"][0])["CKPTDRAIN_WRITER_ID"] == "5"
    # Admission finds a rank's holders by both labels (apiserver/reads.writer_selectors),
    # and a policy's live pods by the policy label (apiserver/reads.first_injected_pod).
    assert out["metadata"]["labels"] == {"app": "t", "ckptdrain.io/writer": "5",
                                         "ckptdrain.io/writer-policy": "llama",
                                         "ckptdrain.io/policy": "llama"}
    assert injected(pod())["metadata"]["labels"] == {"app": "t", "ckptdrain.io/policy": "llama"}
    # A name longer than a label value: no label, found by annotation instead.
    long = policy.parse("ml", "p" * 64, SPEC, CFG)
    out = jsonpatch.apply_patch(copy.deepcopy(pod()),
                                injection.build_pod_patch(pod(), long, CFG, RATE, rank=5))
    assert out["metadata"]["labels"] == {"app": "t", "ckptdrain.io/writer": "5"}


def test_workload_identity_has_no_keys() -> None:
    spec = {**SPEC, "storage": {"uri": "s3://bucket/runs"}}
    p = policy.parse("ml", "llama", spec, CFG)
    ops = injection.build_pod_patch(pod(), p, CFG, default_rate=RATE)
    assert "AWS_ACCESS_KEY_ID" not in str(ops)


def test_annotations_mark_injection_and_seed_the_share() -> None:
    ann = injected(pod())["metadata"]["annotations"]
    assert ann == {"ckptdrain.io/policy": "llama", "ckptdrain.io/injected": "true",
                   "ckptdrain.io/bandwidth": str(int(RATE)),
                   # The policy has a Secret: no platform identity for any of ours.
                   "eks.amazonaws.com/skip-containers":
                       "ckptdrain-prepare,ckptdrain-restore,ckptdrain-agent",
                   # What it runs, for the replacements of its workload (agent_pin.py).
                   "ckptdrain.io/agent-image": CFG.image}


def test_the_agent_image_annotation_is_the_webhooks_over_the_pods_own() -> None:
    """A template cannot say the pod runs another image than the one injected."""
    forged = pod()
    forged["metadata"]["annotations"] = {"ckptdrain.io/agent-image": "evil:1"}
    out = jsonpatch.apply_patch(copy.deepcopy(forged), injection.build_pod_patch(
        forged, policy.parse("ml", "llama", SPEC, CFG), CFG, RATE))
    assert out["metadata"]["annotations"]["ckptdrain.io/agent-image"] == CFG.image
    ours = [*out["spec"]["initContainers"], *out["spec"]["containers"]]
    assert {c["image"] for c in ours if c["name"] != "trainer"} == {CFG.image}


def test_user_env_wins_and_is_not_duplicated() -> None:
    p = pod(containers=[{"name": "t", "image": "t", "env": [
        {"name": "CKPTDRAIN_WORK_DIR", "value": "/mine"}]}])
    env = injected(p)["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "CKPTDRAIN_WORK_DIR"] == ["/mine"]


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=50)
@given(st.lists(st.sampled_from(["initContainers", "volumes", "env", "annotations",
                                 "mounts"]), unique=True))
def test_second_admission_is_a_no_op(present: list[str]) -> None:
    p = pod()
    if "initContainers" in present:
        p["spec"]["initContainers"] = [{"name": "i", "image": "i"}]
    if "volumes" in present:
        p["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    if "env" in present:
        p["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    if "mounts" in present:
        p["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": "/v"}]
    if "annotations" in present:
        p["metadata"]["annotations"] = {"x": "y"}
    once = injected(p)
    assert injection.build_pod_patch(once, POLICY, CFG, default_rate=RATE) == []
    # The user's own things survive.
    assert len(once["spec"]["initContainers"]) == 3 + ("initContainers" in present)


@pytest.mark.parametrize(("grace", "policy_sigterm", "problem"), [
    (30, True, True), (400, True, False), (30, False, False)])
def test_grace_period_check(grace: int, policy_sigterm: bool, problem: bool) -> None:
    # One shard: 5.67 TB / 8 = 708.75 GB at 7.875 GB/s = 90 s, /0.8 margin = 112.5 s.
    p = policy.parse("ml", "llama", {**SPEC, "triggers": {"sigterm": policy_sigterm}}, CFG)
    text = injection.grace_problem(pod(terminationGracePeriodSeconds=grace), p, RATE, CFG)
    assert (text is not None) is problem
    if text:
        assert "spec.terminationGracePeriodSeconds" in text and "113s" in text
