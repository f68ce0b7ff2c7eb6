"""A fake of the API calls operator/peers/sync.py makes, counting its
writes, and the policy, pods and passes its tests share."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from ckptdrain.operator import config
from ckptdrain.operator.apiserver import kube
from ckptdrain.operator.peers import kube as peer_kube
from ckptdrain.operator.peers import sync as peer_sync
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")


SPEC = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
    "interval": "15m", "writers": 2, "localTier": {"path": "/mnt/ckptdrain/nvme"},
    "storage": {"uri": "s3://bucket/runs"}, "peerTier": {"enabled": True},
}


KEY = ("ml", "llama")


LOG = logging.getLogger("test")


STORE = "ckptdrain"


CA_NAME = "ckptdrain-peer-ca-u-1"


PODS_SECRET = "llama-ckptdrain-peer"


def _refused(status: int, resource: str, namespace: str) -> kube.ApiException:
    """As the apiserver refuses a call RBAC does not allow: its Status says why."""
    error = kube.ApiException(status=status, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "code": status, "message": (
        f'{resource} is forbidden: User "system:serviceaccount:ckptdrain:ckptdrain" cannot '
        f'create resource "{resource}" in API group "" in the namespace "{namespace}"')})
    return error


class FakeApi:
    def __init__(self) -> None:
        #: (namespace, name) → the Secret as last written.
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.configmaps: dict[str, dict[str, Any]] = {}
        self.status: list[dict[str, Any]] = []
        self.node_reads: list[str] = []
        self.calls: list[str] = []
        self.secret_error: int | None = None
        #: Failures of reading, and of writing, a CA Secret.
        self.ca_read_error: int | None = None
        self.ca_error: int | None = None
        #: What another replica writes between our read and our write.
        self.meanwhile: dict[str, Any] | None = None
        self.configmap_error: int | None = None
        self.write_error: int | None = None
        self.events: list[tuple[str, str]] = []

    def _check(self, namespace: str, name: str, write: bool = True) -> None:
        if self.secret_error:
            raise _refused(self.secret_error, "secrets", namespace)
        error = self.ca_error if write else self.ca_read_error
        if error and namespace == STORE:
            raise kube.ApiException(status=error, reason="Internal error")

    def create_secret(self, namespace: str, body: dict[str, Any]) -> bool:
        name = body["metadata"]["name"]
        self.calls.append(f"create {namespace}/{name}")
        self._check(namespace, name)
        if (namespace, name) in self.secrets:
            return False
        self.secrets[namespace, name] = body
        return True

    def replace_secret(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        self.calls.append(f"replace {namespace}/{name}")
        self._check(namespace, name)
        if self.meanwhile is not None:
            self.secrets[namespace, name], self.meanwhile = self.meanwhile, None
        wanted = body["metadata"].get("resourceVersion")
        if wanted and wanted != self._version(namespace, name):
            raise kube.ApiException(status=409, reason="Conflict")
        self.secrets[namespace, name] = body

    def _version(self, namespace: str, name: str) -> str:
        return str(id(self.secrets[namespace, name]))

    def read_own_secret_data(self, namespace: str,
                             name: str) -> tuple[dict[str, str], str] | None:
        assert namespace == STORE, "the operator reads Secrets of its CA namespace only"
        self.calls.append(f"read {namespace}/{name}")
        self._check(namespace, name, write=False)
        found = self.secrets.get((namespace, name))
        return None if found is None else (dict(found["data"]), self._version(namespace, name))

    def own_secret_labels(self, namespace: str, selector: str) -> dict[str, dict[str, str]]:
        assert namespace == STORE
        wanted = [term.partition("=") for term in selector.split(",")]

        def matches(labels: dict[str, str]) -> bool:
            return all(k in labels and (not eq or labels[k] == v) for k, eq, v in wanted)
        return {n: s["metadata"]["labels"] for (ns, n), s in self.secrets.items()
                if ns == namespace and matches(s["metadata"].get("labels", {}))}

    def delete_own_secret(self, namespace: str, name: str) -> None:
        assert namespace == STORE
        self.calls.append(f"delete {namespace}/{name}")
        self.secrets.pop((namespace, name), None)

    def data(self, namespace: str, name: str) -> dict[str, bytes]:
        return {k: base64.b64decode(v) for k, v in self.secrets[namespace, name]["data"].items()}

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        self.calls.append(f"read {name}")
        if self.configmap_error:
            raise _refused(self.configmap_error, "configmaps", namespace)
        found = self.configmaps.get(name)
        return None if found is None else dict(found["data"])

    def write_configmap(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append(f"write {body['metadata']['name']}")
        if self.write_error:
            raise kube.ApiException(status=self.write_error, reason="Forbidden")
        self.configmaps[body["metadata"]["name"]] = body

    def node_labels(self, name: str) -> dict[str, str] | None:
        self.node_reads.append(name)
        return {"topology.kubernetes.io/zone": "z" + name[-1]}

    def post_event(self, body: Any, kind: str, reason: str, message: str,
                   type_: str = "Warning") -> None:
        self.events.append((reason, message))

    def patch_status(self, plural: str, namespace: str, name: str,
                     status: dict[str, Any]) -> bool:
        self.status.append(status)
        return True


def install_fake_api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    """A FakeApi in place of the peer room's and the status's API calls, and
    peer_sync's memory of earlier passes emptied."""
    fake = FakeApi()
    for name in ("create_secret", "replace_secret", "read_own_secret_data",
                 "own_secret_labels", "delete_own_secret", "read_configmap_data",
                 "write_configmap", "node_labels"):
        monkeypatch.setattr(peer_kube, name, getattr(fake, name))
    for name in ("patch_status", "post_event"):
        monkeypatch.setattr(kube, name, getattr(fake, name))
    for state in (peer_sync._secrets, peer_sync._certificates, peer_sync._documents,
                  peer_sync._written, peer_sync._zones):
        state.clear()
    return fake


def body(spec: dict[str, Any] = SPEC, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": "llama", "uid": "u-1"},
            "spec": spec, "status": status or {}}


def pod(name: str, rank: int, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z",
                         "labels": {"ckptdrain.io/writer": str(rank)}},
            "spec": {"nodeName": node}, "status": {"podIP": f"10.0.0.{rank + 1}"}}


PODS = [pod("w-0", 0, "n0"), pod("w-1", 1, "n1")]


def run(b: dict[str, Any], pods: list[dict[str, Any]] = PODS, store: str = STORE,
        installation: str = "ckptdrain") -> None:
    parsed = policy.parse("ml", "llama", b["spec"], CFG)
    peer_sync.sync(KEY, parsed, b, pods, [], LOG, ca_namespace=store,
                   installation=installation)


def restart() -> None:
    """What a restarted operator no longer knows (the status still does)."""
    for state in (peer_sync._secrets, peer_sync._certificates, peer_sync._documents,
                  peer_sync._written):
        state.clear()


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
