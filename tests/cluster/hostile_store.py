"""Tenant B's store credentials on tenant A's prefix, on a real S3 server
(MinIO), for the hostile-tenant suite (test_hostile_tenant.py runs the test
in the ledger's order). The platform gives each tenant a MinIO user whose
policy is docs/cloud/eks.md's "permissions of ckptdrain-team-a" for the
tenant's prefix; B's user goes into B's Secret, B's policy names it, and B's
pod is injected what the agent gets. With that environment B's own code
(or its agent) opens A's prefix through ckptdrain.store and tries each call,
A's unfinished upload among its targets; the store answers, A's objects
and uploads are compared before and after, and each refusal is looked for
in MinIO's audit entries, sent to a receiver as docs/audit.md shows."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hostile_audit
import hostile_record as ledger
from cluster_helpers import INJECT, policy, wait_for
from cluster_helpers import pod as pod_of
from hostile_tenants import A_SECRET, Tenant
from tests.docs import blocks
from tests.docs.blocks import REPO

from ckptdrain.contract.env import Env
from ckptdrain.errors import StoreAccessDenied
from ckptdrain.operator.admission.injection import AGENT
from ckptdrain.store import open_store
from support.minio_admin import MinioAdmin
from support.s3servers import S3Server, start_minio
from support.store_audit import audit_receiver

EKS = REPO / "docs" / "cloud" / "eks.md"
A_KEY = "step-7/model.bin"
#: The key of A's unfinished upload (step 8, still draining).
A_UPLOAD_KEY = "step-8/model.bin"


def tenant_policy(bucket: str, namespace: str) -> dict[str, Any]:
    """eks.md's permissions of a tenant, for `namespace` in `bucket`, as MinIO takes them."""
    (block,) = [b for b in blocks.parse(EKS)
                if b.kind == "fragment" and b.note == "permissions of ckptdrain-team-a"]
    text = block.text.replace("my-checkpoints", bucket).replace("llm/team-a", f"llm/{namespace}")
    return dict(json.loads(text))


def store_user(admin: MinioAdmin, name: str, document: dict[str, Any]) -> dict[str, str]:
    """A MinIO user under `document`: the Secret data a platform hands its tenant."""
    keys = {"AWS_ACCESS_KEY_ID": f"{name}-{secrets.token_hex(4)}",
            "AWS_SECRET_ACCESS_KEY": secrets.token_hex(20)}
    admin.add_policy(name, document)
    admin.add_user(keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"])
    admin.attach(name, keys["AWS_ACCESS_KEY_ID"])
    return keys


def agent_environment(tenant: Tenant, server: S3Server, bucket: str,
                      keys: dict[str, str]) -> dict[str, str]:
    """What B's agent runs with: B's Secret holding B's keys, B's policy
    naming it, the env injected into B's pod, each secretKeyRef read with
    B's token from the Secret it names (as the kubelet resolves it, in the
    pod's namespace), which must be the one B's policy names."""
    data = {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()}
    secret = {"apiVersion": "v1", "kind": "Secret", "data": data,
              "metadata": {"name": "store-keys", "namespace": tenant.namespace}}
    assert tenant.create(secret).returncode == 0
    made = tenant.kubectl("create", "-n", tenant.namespace, "-f", "-", "-o", "json",
                          body=policy("ckpt", storage={
                              "uri": f"s3://{bucket}/llm", "endpoint": server.endpoint_url,
                              "credentialsSecretRef": {"name": "store-keys"}}))
    assert made.returncode == 0, made.stderr
    named = json.loads(made.stdout)["spec"]["storage"]["credentialsSecretRef"]["name"]

    def injected(index: list[int] = [0]) -> list[dict[str, Any]] | None:  # noqa: B006
        index[0] += 1  # a pod made before the webhook saw B's policy is not injected
        pod = tenant.kubectl("create", "-n", tenant.namespace, "-f", "-", "-o", "json",
                             body=pod_of(f"agent-{index[0]}", {"app": "ckpt", **INJECT}))
        assert pod.returncode == 0, pod.stderr
        spec = json.loads(pod.stdout)["spec"]
        return next((c["env"] for c in spec.get("initContainers", []) + spec["containers"]
                     if c["name"] == AGENT), None)
    env = wait_for(injected, what="B's pod injected with the agent")
    refs = [e["valueFrom"]["secretKeyRef"] for e in env
            if "secretKeyRef" in (e.get("valueFrom") or {})]
    (name,) = {r["name"] for r in refs}
    assert name == named, (named, refs)
    read = json.loads(tenant.kubectl("get", "secret", name, "-n", tenant.namespace,
                                     "-o", "json").stdout)["data"]

    def value(entry: dict[str, Any]) -> str:
        if "value" in entry:
            return str(entry["value"])
        return base64.b64decode(read[entry["valueFrom"]["secretKeyRef"]["key"]]).decode()
    return {e["name"]: value(e) for e in env
            if "value" in e or "secretKeyRef" in (e.get("valueFrom") or {})}


def a_state(server: S3Server, bucket: str, namespace: str
            ) -> tuple[dict[str, bytes], list[tuple[str, str]]]:
    """Everything under A's prefix, as the server's root user reads it: the
    objects, and the unfinished multipart uploads (key, upload id)."""
    client, prefix = server.client(), f"llm/{namespace}/"
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    objects = {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
               for o in listed.get("Contents", [])}
    # MinIO lists by a prefix only the uploads of the exact key: all, filtered here.
    uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return objects, sorted((u["Key"], u["UploadId"]) for u in uploads
                           if u["Key"].startswith(prefix))


#: The S3 call each attempt makes, as MinIO's audit entries name it.
API_OF = {ledger.STORE_LIST: "ListObjectsV2", ledger.STORE_GET: "GetObject",
          ledger.STORE_PUT: "PutObject", ledger.STORE_DELETE: "DeleteObject",
          ledger.STORE_MULTIPART: "NewMultipartUpload",
          ledger.STORE_UPLOADS: "ListMultipartUploads",
          ledger.STORE_ABORT: "AbortMultipartUpload"}


def attempts(store: Any, a_upload: str) -> dict[str, Callable[[], Any]]:
    """Each call B makes on A's prefix, by the ledger's attempt. B is handed
    A's upload id, as if it had learnt it: the store must refuse B anyway."""
    return {ledger.STORE_LIST: lambda: [o.key for o in store.list("")],
            ledger.STORE_GET: lambda: store.get_bytes(A_KEY),
            ledger.STORE_PUT: lambda: store.put_bytes(A_KEY, b"B's bytes"),
            ledger.STORE_DELETE: lambda: store.delete(A_KEY),
            ledger.STORE_MULTIPART: lambda: store.create_multipart("step-9/model.bin"),
            ledger.STORE_UPLOADS: lambda: store.list_multipart_uploads(""),
            ledger.STORE_ABORT: lambda: store.abort_multipart(A_UPLOAD_KEY, a_upload)}


@ledger.makes(ledger.STORE_LIST, ledger.STORE_GET, ledger.STORE_PUT, ledger.STORE_DELETE,
              ledger.STORE_MULTIPART, ledger.STORE_UPLOADS, ledger.STORE_ABORT)
def test_bs_store_user_reaches_none_of_as_prefix(tmp_path: Path, namespace: str,
                                                 tenant_b: Tenant) -> None:
    # MinIO sends each request's audit entry to a receiver of the
    # platform's, where each refusal of B's keys must be found.
    with audit_receiver() as audit, start_minio(tmp_path, env_extra=audit.minio_env()) as server:
        bucket = server.create_bucket()
        admin = MinioAdmin(server)
        a_keys = store_user(admin, "tenant-a", tenant_policy(bucket, namespace))
        b_keys = store_user(admin, "tenant-b", tenant_policy(bucket, tenant_b.namespace))
        a_store = open_store(f"s3://{bucket}/llm/{namespace}/ckpt", environ=a_keys,
                             endpoint_url=server.endpoint_url)
        a_store.put_bytes(A_KEY, A_SECRET.encode())
        # A's agent in the middle of draining step 8: one part sent, not completed.
        a_upload = a_store.create_multipart(A_UPLOAD_KEY)
        a_store.upload_part(A_UPLOAD_KEY, a_upload, 1, A_SECRET.encode())
        env = agent_environment(tenant_b, server, bucket, b_keys)
        # The agent's own prefix is B's, and B's keys work there: a refusal
        # below is about A's prefix, not keys that work nowhere.
        # (Never the whole env in a message: it holds B's secret key.)
        assert env[Env.STORE_URI] == f"s3://{bucket}/llm/{tenant_b.namespace}/ckpt", \
            env[Env.STORE_URI]
        own = open_store(env[Env.STORE_URI], endpoint_url=env[Env.S3_ENDPOINT], environ=env)
        own.put_bytes("step-1/model.bin", b"B's own")
        assert [o.key for o in own.list("")] == ["step-1/model.bin"]
        before = a_state(server, bucket, namespace)
        into_a = open_store(f"s3://{bucket}/llm/{namespace}/ckpt",
                            endpoint_url=env[Env.S3_ENDPOINT], environ=env)
        for name, call in attempts(into_a, a_upload).items():
            try:
                got, refused = call(), False
            except StoreAccessDenied:
                got, refused = None, True
            changed = a_state(server, bucket, namespace) != before
            # A's bytes, keys or uploads, or anything of A's changed or gone.
            leaked = int(bool(got) or changed)
            b_key = b_keys["AWS_ACCESS_KEY_ID"]  # an access key id: not a secret
            audited = hostile_audit.store_refused(audit, b_key, API_OF[name], bucket,
                                                  f"llm/{namespace}/")
            ledger.record(name, ledger.STORE_REFUSED if refused else "",
                          ledger.STORE_AUDIT if audited else "", leaked)
            assert refused and not leaked, (name, got)
            assert audited, (name, hostile_audit.store_calls_seen(audit, b_key))
        prefix = f"llm/{namespace}/ckpt/"
        assert a_state(server, bucket, namespace) == (
            {prefix + A_KEY: A_SECRET.encode()}, [(prefix + A_UPLOAD_KEY, a_upload)])
