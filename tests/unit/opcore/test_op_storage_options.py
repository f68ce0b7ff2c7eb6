"""spec.storage.encryption / caBundle / addressingStyle: validated, and what reaches the pod."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import injection
from ckptdrain.operator.policy import spec as policy
from ckptdrain.operator.policy.storage_options import CA_BUNDLE_PATH, CA_VOLUME
from ckptdrain.store.s3_options import S3Options

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
       "spec": {"containers": [{"name": "trainer", "image": "t:1"}]}}


#: A private CA goes with the policy's own keys (or a listed endpoint:
#: test_op_ambient_endpoints.py).
KEYED = {"endpoint": "https://minio.corp:9000", "credentialsSecretRef": {"name": "s3-keys"}}


def spec(**storage: Any) -> dict[str, Any]:
    return {"selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
            "interval": "15m", "writers": 8,
            "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
            "storage": {"uri": "s3://bucket/runs", **storage}}


def _injected(s: dict[str, Any]) -> dict[str, Any]:
    ops = injection.build_pod_patch(POD, policy.parse("ml", "p", s, CFG), CFG, 1e9, rank=0)
    return jsonpatch.apply_patch(POD, ops)


def test_settings_reach_the_agent_and_restore_and_the_store_reads_them() -> None:
    pod = _injected(spec(encryption={"type": "SSE-KMS", "kmsKeyId": "arn:aws:kms:k"},
                         caBundle={"configMapKeyRef": {"name": "corp-ca", "key": "ca.crt"}},
                         addressingStyle="virtual", **KEYED))
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == CA_VOLUME)
    assert volume["configMap"] == {"name": "corp-ca",
                                   "items": [{"key": "ca.crt", "path": "ca.pem"}]}
    ours = [c for c in pod["spec"]["initContainers"] if c["name"] in ("ckptdrain-agent",
                                                                      "ckptdrain-restore")]
    assert len(ours) == 2
    for c in ours:
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert {m["name"]: m.get("readOnly") for m in c["volumeMounts"]}[CA_VOLUME] is True
        assert env["CKPTDRAIN_S3_CA_BUNDLE"] == CA_BUNDLE_PATH
        # What the store adapter makes of it (the CA file exists only in the pod).
        opts = S3Options(sse=env["CKPTDRAIN_S3_SSE"],
                         kms_key_id=env["CKPTDRAIN_S3_SSE_KMS_KEY_ID"],
                         addressing=env["CKPTDRAIN_S3_ADDRESSING"])
        assert opts.create_args() == {"ServerSideEncryption": "aws:kms",
                                      "SSEKMSKeyId": "arn:aws:kms:k"}
    trainer = pod["spec"]["containers"][0]
    assert CA_VOLUME not in {m["name"] for m in trainer.get("volumeMounts", [])}


def test_a_secret_reference_mounts_the_secret() -> None:
    pod = _injected(spec(caBundle={"secretKeyRef": {"name": "corp-ca", "key": "bundle.pem"}},
                         **KEYED))
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == CA_VOLUME)
    assert volume["secret"] == {"secretName": "corp-ca",
                                "items": [{"key": "bundle.pem", "path": "ca.pem"}]}


def test_no_settings_add_nothing() -> None:
    pod = _injected(spec())
    assert CA_VOLUME not in {v["name"] for v in pod["spec"]["volumes"]}
    names = {e["name"] for c in pod["spec"]["initContainers"] for e in c.get("env", [])}
    assert not {n for n in names if n.startswith("CKPTDRAIN_S3_")} - {"CKPTDRAIN_S3_ENDPOINT"}


@pytest.mark.parametrize(("storage", "field"), [
    ({"encryption": {"type": "AES"}}, "spec.storage.encryption.type"),
    ({"encryption": {"type": "SSE-S3", "kmsKeyId": "k"}}, "spec.storage.encryption.kmsKeyId"),
    ({"addressingStyle": "dns"}, "spec.storage.addressingStyle"),
    ({"caBundle": {}}, "spec.storage.caBundle"),
    ({"caBundle": {"secretKeyRef": {"name": "Bad_Name", "key": "ca.crt"}}},
     "spec.storage.caBundle.secretKeyRef.name"),
    ({"caBundle": {"secretKeyRef": {"name": "ca", "key": "a/b"}}},
     "spec.storage.caBundle.secretKeyRef.key"),
    ({"coldStorage": {"storageClass": "GLACIER"}}, "spec.storage.coldStorage.storageClass"),
    ({"coldStorage": {"storageClass": "DEEP_ARCHIVE"}},
     "spec.storage.coldStorage.storageClass"),
    ({"coldStorage": {"storageClass": "STANDARD_IA", "after": 0}},
     "spec.storage.coldStorage.after"),
    ({"coldStorage": {"storageClass": "STANDARD_IA", "after": True}},
     "spec.storage.coldStorage.after"),
    # Nothing would ever be kept long enough to move (storage.keep is 3).
    ({"coldStorage": {"storageClass": "STANDARD_IA", "after": 3}},
     "spec.storage.coldStorage.after"),
    ({"coldStorage": "STANDARD_IA"}, "spec.storage.coldStorage"),
])
def test_bad_settings_are_refused_naming_the_field(storage: dict[str, Any], field: str) -> None:
    assert [e.field for e in policy.validate(spec(**storage), CFG)] == [field]


def test_cold_storage_reaches_the_agent() -> None:
    pod = _injected(spec(keep=4, coldStorage={"storageClass": "GLACIER_IR", "after": 2}))
    agent = next(c for c in pod["spec"]["initContainers"] if c["name"] == "ckptdrain-agent")
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["CKPTDRAIN_COLD_STORAGE_CLASS"] == "GLACIER_IR"
    assert env["CKPTDRAIN_COLD_AFTER"] == "2"
    assert "CKPTDRAIN_COLD_STORAGE_CLASS" not in {
        e["name"] for c in _injected(spec())["spec"]["initContainers"] for e in c.get("env", [])}


def test_cold_storage_needs_a_store_with_classes() -> None:
    s = spec(coldStorage={"storageClass": "STANDARD_IA"})
    s["storage"]["uri"] = "file:///mnt/shared/ckpt"
    errors = policy.validate(s, CFG)
    assert [e.field for e in errors] == ["spec.storage.coldStorage.storageClass"]
    assert "s3:// or gs://" in errors[0].expected


@pytest.mark.parametrize(("uri", "cls", "ok"), [
    ("gs://ckpt-bucket/runs", "NEARLINE", True),
    ("gs://ckpt-bucket/runs", "COLDLINE", True),
    ("gs://ckpt-bucket/runs", "ARCHIVE", True),
    ("gs://ckpt-bucket/runs", "STANDARD_IA", False),  # S3's name, on GCS
    ("s3://ckpt-bucket/runs", "COLDLINE", False),  # GCS's name, on S3
    ("s3://ckpt-bucket/runs", "GLACIER_IR", True),
])
def test_cold_classes_are_the_stores_own(uri: str, cls: str, ok: bool) -> None:
    s = spec(keep=3, coldStorage={"storageClass": cls})
    s["storage"]["uri"] = uri
    errors = policy.validate(s, CFG)
    assert [e.field for e in errors] == ([] if ok else ["spec.storage.coldStorage.storageClass"])
    if not ok:
        assert uri[:5] in errors[0].expected  # names the classes of this store


def test_a_gs_policy_reaches_the_pod_without_credentials() -> None:
    s = spec()
    s["storage"] = {"uri": "gs://ckpt_bucket/runs"}
    pod = _injected(s)
    agent = next(c for c in pod["spec"]["initContainers"] if c["name"] == "ckptdrain-agent")
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["CKPTDRAIN_STORE_URI"] == "gs://ckpt_bucket/runs/ml/p"
    assert "AWS_ACCESS_KEY_ID" not in env


@pytest.mark.parametrize(("storage", "field"), [
    ({"credentialsSecretRef": {"name": "hmac"}}, "spec.storage.credentialsSecretRef"),
    ({"encryption": {"type": "SSE-S3"}}, "spec.storage.encryption"),
    ({"addressingStyle": "path"}, "spec.storage.addressingStyle"),
    ({"coldStorage": {"storageClass": "STANDARD_IA"}}, "spec.storage.coldStorage.storageClass"),
    # The pod's Google token would be sent there.
    ({"endpoint": "https://storage.example.com"}, "spec.storage.endpoint"),
])
def test_s3_only_settings_are_refused_with_gs(storage: dict[str, Any], field: str) -> None:
    s = spec(**storage)
    s["storage"]["uri"] = "gs://ckpt-bucket/runs"
    assert [e.field for e in policy.validate(s, CFG)] == [field]


@pytest.mark.parametrize("endpoint", ["https://storage-ckpt.p.googleapis.com",
                                      "http://fake-gcs.storage:4443"])
def test_gs_endpoints_that_may_be_used(endpoint: str) -> None:
    s = spec(endpoint=endpoint)
    s["storage"]["uri"] = "gs://ckpt-bucket/runs"
    assert policy.validate(s, CFG) == []
