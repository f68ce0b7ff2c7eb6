"""The policy's enterprise S3 settings and what the webhook adds to a pod for them. Pure.

    storage:
      encryption: {type: SSE-S3 | SSE-KMS, kmsKeyId: <id or ARN>}
      caBundle: {secretKeyRef: {name, key}} | {configMapKeyRef: {name, key}}
      addressingStyle: auto | path | virtual
      coldStorage: {storageClass: STANDARD_IA | ..., after: <newest K stay>}

The agent and restore containers get the environment store/s3_options.py
reads; a CA bundle is referenced, never copied into the pod spec: the key
of the Secret or ConfigMap is mounted read-only at CA_BUNDLE_PATH in both.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptdrain.contract.cold import COLD_CLASSES, cold_class_expected
from ckptdrain.contract.env import Env

CA_DIR = "/etc/ckptdrain/s3-ca"
CA_FILE = "ca.pem"
CA_BUNDLE_PATH = posixpath.join(CA_DIR, CA_FILE)
CA_VOLUME = "ckptdrain-s3-ca"
SSE_TYPES = ("SSE-S3", "SSE-KMS")
#: Classes restore can read without a restore request first (S3's; MinIO's
#: REDUCED_REDUNDANCY). GLACIER and DEEP_ARCHIVE cannot be read directly.
ADDRESSING = ("auto", "path", "virtual")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


@dataclass(frozen=True)
class CaBundleRef:
    kind: str  # "secret" or "configMap"
    name: str
    key: str


@dataclass(frozen=True)
class StorageOptions:
    sse: str | None = None
    kms_key_id: str | None = None
    ca_bundle: CaBundleRef | None = None
    addressing: str | None = None
    #: Data of complete checkpoints older than the newest `cold_after` moves here.
    cold_class: str | None = None
    cold_after: int = 1


Fail = Callable[[str, str, object], None]


def read(storage: Mapping[str, Any] | None, fail: Fail) -> StorageOptions:
    """The settings under spec.storage; each problem reported through
    `fail(field, expected, seen)` (fields relative to spec)."""
    storage = storage if isinstance(storage, Mapping) else {}
    sse = kms = None
    enc = storage.get("encryption")
    if enc is not None:
        if not isinstance(enc, Mapping) or enc.get("type") not in SSE_TYPES:
            fail("storage.encryption.type", "SSE-S3 or SSE-KMS",
                 enc.get("type") if isinstance(enc, Mapping) else enc)
        else:
            sse = str(enc["type"])
            kms = enc.get("kmsKeyId")
            if kms is not None and (sse != "SSE-KMS" or not isinstance(kms, str) or not kms):
                fail("storage.encryption.kmsKeyId", "a KMS key id or ARN, with type SSE-KMS",
                     kms)
                kms = None
    addressing = storage.get("addressingStyle")
    if addressing is not None and addressing not in ADDRESSING:
        fail("storage.addressingStyle", "auto, path or virtual", addressing)
        addressing = None
    cold_class, cold_after = _cold(storage.get("coldStorage"), fail)
    return StorageOptions(sse, kms, _ca_ref(storage.get("caBundle"), fail), addressing,
                          cold_class, cold_after)


def _cold(raw: object, fail: Fail) -> tuple[str | None, int]:
    if raw is None:
        return None, 1
    if not isinstance(raw, Mapping):
        fail("storage.coldStorage", "{storageClass, after}", raw)
        return None, 1
    cls, after = raw.get("storageClass"), raw.get("after", 1)
    if not any(cls in classes for classes in COLD_CLASSES.values()):
        fail("storage.coldStorage.storageClass", cold_class_expected(), cls)
        return None, 1
    if isinstance(after, bool) or not isinstance(after, int) or after < 1:
        fail("storage.coldStorage.after",
             "the number of newest complete checkpoints kept in the bucket's class, >= 1", after)
        return None, 1
    return str(cls), after


def _ca_ref(raw: object, fail: Fail) -> CaBundleRef | None:
    if raw is None:
        return None
    refs = ({k: raw[k] for k in ("secretKeyRef", "configMapKeyRef") if k in raw}
            if isinstance(raw, Mapping) else {})
    if len(refs) != 1:
        fail("storage.caBundle", "exactly one of secretKeyRef or configMapKeyRef {name, key}",
             raw)
        return None
    (kind, ref), = refs.items()
    field = f"storage.caBundle.{kind}"
    name = ref.get("name") if isinstance(ref, Mapping) else None
    key = ref.get("key") if isinstance(ref, Mapping) else None
    if not isinstance(name, str) or not _NAME.match(name):
        fail(f"{field}.name", "the name of a Secret or ConfigMap in this namespace", name)
        return None
    if not isinstance(key, str) or not _KEY.match(key):
        fail(f"{field}.key", "a key of it holding PEM certificates, e.g. ca.crt", key)
        return None
    return CaBundleRef("secret" if kind == "secretKeyRef" else "configMap", name, key)


def env(opts: StorageOptions) -> list[dict[str, Any]]:
    """Environment of the agent and restore containers for these settings."""
    out = []
    if opts.sse:
        out.append({"name": Env.S3_SSE.value, "value": opts.sse})
    if opts.kms_key_id:
        out.append({"name": Env.S3_SSE_KMS_KEY_ID.value, "value": opts.kms_key_id})
    if opts.ca_bundle:
        out.append({"name": Env.S3_CA_BUNDLE.value, "value": CA_BUNDLE_PATH})
    if opts.addressing:
        out.append({"name": Env.S3_ADDRESSING.value, "value": opts.addressing})
    if opts.cold_class:
        out.append({"name": Env.COLD_STORAGE_CLASS.value, "value": opts.cold_class})
        out.append({"name": Env.COLD_AFTER.value, "value": str(opts.cold_after)})
    return out


def volumes(opts: StorageOptions) -> list[dict[str, Any]]:
    ref = opts.ca_bundle
    if ref is None:
        return []
    items = [{"key": ref.key, "path": CA_FILE}]
    source = ({"secret": {"secretName": ref.name, "items": items}} if ref.kind == "secret"
              else {"configMap": {"name": ref.name, "items": items}})
    return [{"name": CA_VOLUME, **source}]


def mounts(opts: StorageOptions) -> list[dict[str, Any]]:
    """volumeMounts to add to the agent and restore containers (read-only)."""
    if opts.ca_bundle is None:
        return []
    return [{"name": CA_VOLUME, "mountPath": CA_DIR, "readOnly": True}]
