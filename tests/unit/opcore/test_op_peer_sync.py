"""operator/peer_sync.py, its writes counted against a fake API: Secrets once
(the pods' first, never the CA key in it), the ConfigMap and the status only
when they change, previous holders read back after a restart."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest

from ckptdrain.operator import config, kube, leadership, peer_sync, policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
SPEC = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
    "interval": "15m", "writers": 2, "localTier": {"path": "/mnt/ckptdrain/nvme"},
    "storage": {"uri": "s3://bucket/runs"}, "peerTier": {"enabled": True},
}
KEY = ("ml", "llama")
LOG = logging.getLogger("test")


class FakeApi:
    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, Any]] = {}
        self.configmaps: dict[str, dict[str, Any]] = {}
        self.status: list[dict[str, Any]] = []
        self.node_reads: list[str] = []
        self.calls: list[str] = []
        self.secret_error: int | None = None
        self.ca_error: int | None = None
        self.configmap_error: int | None = None
        self.write_error: int | None = None
        self.events: list[tuple[str, str]] = []

    def create_secret(self, namespace: str, body: dict[str, Any]) -> bool:
        name = body["metadata"]["name"]
        self.calls.append(f"secret {name}")
        if self.secret_error:
            raise kube.ApiException(status=self.secret_error, reason="Forbidden")
        if self.ca_error and name.endswith("-ca"):
            raise kube.ApiException(status=self.ca_error, reason="Internal error")
        if name in self.secrets:
            return False
        self.secrets[name] = body
        return True

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        self.calls.append(f"read {name}")
        if self.configmap_error:
            raise kube.ApiException(status=self.configmap_error, reason="Forbidden")
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

    def post_event(self, body: Any, kind: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

    def patch_status(self, plural: str, namespace: str, name: str,
                     status: dict[str, Any]) -> bool:
        self.status.append(status)
        return True


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    for name in ("create_secret", "read_configmap_data", "write_configmap", "node_labels",
                 "patch_status", "post_event"):
        monkeypatch.setattr(kube, name, getattr(fake, name))
    for state in (peer_sync._secrets, peer_sync._documents, peer_sync._written,
                  peer_sync._zones, peer_sync._pending_ca):
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


def run(b: dict[str, Any], pods: list[dict[str, Any]] = PODS) -> None:
    parsed = policy.parse("ml", "llama", b["spec"], CFG)
    peer_sync.sync(KEY, parsed, b, pods, [], LOG)


def test_first_pass_creates_secrets_configmap_and_status(api: FakeApi) -> None:
    run(body())
    assert api.calls[:2] == ["secret llama-ckptdrain-peer", "secret llama-ckptdrain-peer-ca"]
    pods_secret = api.secrets["llama-ckptdrain-peer"]
    assert sorted(pods_secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    assert b"PRIVATE KEY" in base64.b64decode(api.secrets["llama-ckptdrain-peer-ca"]
                                              ["data"]["ca.key"])
    owner = pods_secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("CheckpointPolicy", "llama", "u-1")
    doc = json.loads(api.configmaps["llama-ckptdrain-peers"]["data"]["peers.json"])
    assert doc["policy"] == "ml/llama"
    assert {r: e["holder"] for r, e in doc["writers"].items()} == {"0": 1, "1": 0}
    assert doc["writers"]["0"]["zone"] == "z0" and doc["writers"]["0"]["address"] == \
        "10.0.0.1:9109"
    assert api.status[-1]["peer"]["reason"] == "Paired"


def test_an_unchanged_pairing_writes_nothing(api: FakeApi) -> None:
    run(body())
    calls, patches = len(api.calls), len(api.status)
    run(body())
    assert len(api.calls) == calls and len(api.status) == patches
    assert sorted(api.node_reads) == ["n0", "n1"]  # zones read once per node


def test_existing_secrets_are_kept_and_the_ca_not_replaced(api: FakeApi) -> None:
    api.secrets["llama-ckptdrain-peer"] = {"data": "theirs"}
    run(body())
    assert api.secrets["llama-ckptdrain-peer"] == {"data": "theirs"}
    assert "llama-ckptdrain-peer-ca" not in api.secrets


def test_a_secret_left_by_a_deleted_policy_is_replaced_once_it_is_collected(
        api: FakeApi) -> None:
    api.secrets["llama-ckptdrain-peer"] = {"data": "the old policy's, being collected"}
    run(body())
    del api.secrets["llama-ckptdrain-peer"]  # garbage collection caught up
    run(body())
    assert api.secrets["llama-ckptdrain-peer"] != {"data": "the old policy's, being collected"}
    assert "llama-ckptdrain-peer-ca" in api.secrets


def test_forbidden_secrets_show_in_the_status_and_are_tried_again(api: FakeApi) -> None:
    api.secret_error = 403
    run(body())
    assert api.status[-1]["peer"]["reason"] == "CredentialsFailed"
    assert "Forbidden" in api.status[-1]["peer"]["message"]
    assert "llama-ckptdrain-peers" in api.configmaps  # the pairing is still published
    assert [reason for reason, _ in api.events] == ["PeerTierFailed"]
    run(body())
    assert len(api.events) == 1  # once, not at every pass
    api.secret_error = None
    run(body())
    assert "llama-ckptdrain-peer" in api.secrets
    assert api.status[-1]["peer"]["reason"] == "Paired"


def test_a_late_pass_of_a_deleted_policy_does_not_silence_its_successor(
        api: FakeApi) -> None:
    """The old policy's pass ends after the new one of the same name appeared
    (and after `forget`): the new policy still writes its own ConfigMap and
    status, though the document is the same text."""
    run(body())
    peer_sync.forget(KEY, "u-1")
    run(body())  # the old policy's pass, still running when it was deleted
    del api.configmaps["llama-ckptdrain-peers"]  # collected with its owner
    writes, patches = len(api.configmaps), len(api.status)
    renewed = body()
    renewed["metadata"]["uid"] = "u-2"
    run(renewed)
    assert "llama-ckptdrain-peers" in api.configmaps and len(api.configmaps) == writes + 1
    assert len(api.status) == patches + 1


def test_a_node_that_could_not_be_read_is_asked_again_later(
        api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[dict[str, str] | None] = [None]  # forbidden, or not there yet
    monkeypatch.setattr(kube, "node_labels", lambda name: answers[0])
    run(body())
    answers[0] = {"topology.kubernetes.io/zone": "z9"}
    run(body())  # within ZONE_RETRY_S: not asked again
    assert peer_sync._zones["n0"][0] is None
    monkeypatch.setattr(peer_sync, "ZONE_RETRY_S", 0.0)
    run(body())
    assert peer_sync._zones["n0"][:2] == ("z9", True)


def test_a_new_term_forgets_what_this_replica_wrote(api: FakeApi) -> None:
    """Standby, then active again: another replica may have rewritten the
    ConfigMap; what this one last wrote is no reason to skip a write."""
    run(body())
    api.configmaps["llama-ckptdrain-peers"]["data"]["peers.json"] = "{}"  # the other replica
    leadership.STATE.set(False)
    leadership.STATE.set(True)
    run(body())
    doc = json.loads(api.configmaps["llama-ckptdrain-peers"]["data"]["peers.json"])
    assert doc["policy"] == "ml/llama"


def test_a_restarted_operator_keeps_the_previous_holder(api: FakeApi) -> None:
    three = [*PODS, pod("w-2", 2, "n2")]
    spec = {**SPEC, "writers": 3}
    run(body(spec), three)
    peer_sync._documents.clear()  # a restart: only the ConfigMap remembers
    peer_sync._written.clear()
    run(body(spec), [three[0], three[2]])  # writer 1 (writer 0's holder) is gone
    assert "read llama-ckptdrain-peers" in api.calls
    doc = json.loads(api.configmaps["llama-ckptdrain-peers"]["data"]["peers.json"])
    assert doc["writers"]["0"]["holder"] == 2 and doc["writers"]["0"]["previousHolder"] == 1
    assert api.status[-1]["peer"]["reason"] == "Partial"


def test_turned_off_clears_the_status_once(api: FakeApi) -> None:
    run(body())
    off = {k: v for k, v in SPEC.items() if k != "peerTier"}
    status = {"peer": {"enabled": True}, "recoveryPointOnNodeLoss": 5}
    peer_sync.sync(KEY, policy.parse("ml", "llama", off, CFG), body(off, status), PODS, [],
                   LOG)
    assert api.status[-1]["peer"]["enabled"] is False
    assert api.status[-1]["recoveryPointOnNodeLoss"] is None
    patches = len(api.status)
    peer_sync.sync(KEY, policy.parse("ml", "llama", off, CFG), body(off, status), PODS, [],
                   LOG)
    assert len(api.status) == patches


def test_a_ca_secret_that_failed_is_stored_later_with_the_ca_that_signed(
        api: FakeApi) -> None:
    api.ca_error = 500
    with pytest.raises(kube.ApiException):
        run(body())
    assert "llama-ckptdrain-peer" in api.secrets and "llama-ckptdrain-peer-ca" not in api.secrets
    api.ca_error = None
    run(body())
    ca = base64.b64decode(api.secrets["llama-ckptdrain-peer-ca"]["data"]["ca.crt"])
    assert ca == base64.b64decode(api.secrets["llama-ckptdrain-peer"]["data"]["ca.crt"])


def test_forbidden_configmaps_show_in_the_status_without_a_retry_loop(api: FakeApi) -> None:
    api.configmap_error = 403
    run(body())  # no exception: nothing for the timer to retry
    assert api.status[-1]["peer"]["reason"] == "PublishFailed"
    assert "configmaps" in api.status[-1]["peer"]["message"]
    assert [reason for reason, _ in api.events] == ["PeerTierFailed"]
    assert "llama-ckptdrain-peers" not in api.configmaps
    api.configmap_error = None
    run(body())
    assert "llama-ckptdrain-peers" in api.configmaps
    assert api.status[-1]["peer"]["reason"] == "Paired"
    with pytest.raises(kube.ApiException):  # anything else is retried
        api.configmap_error = 500
        peer_sync._documents.clear()
        run(body())


def test_a_forbidden_write_is_reported_like_a_forbidden_read(api: FakeApi) -> None:
    api.write_error = 403
    run(body())
    assert api.status[-1]["peer"]["reason"] == "PublishFailed"
    api.write_error = None
    run(body())
    assert api.status[-1]["peer"]["reason"] == "Paired"
    assert "llama-ckptdrain-peers" in api.configmaps
