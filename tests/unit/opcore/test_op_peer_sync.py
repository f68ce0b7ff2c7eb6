"""operator/peers/sync.py, its writes counted against a fake API: the policy's
CA kept in the operator's namespace before anything it signs is handed out,
the pods' Secret created once and renewed with the same CA before its
certificate ends (never the CA key in it), the ConfigMap and the status only
when they change, previous holders read back after a restart."""

from __future__ import annotations

import base64
import json
import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from ckptdrain.contract import api as contract
from ckptdrain.operator import config
from ckptdrain.operator.apiserver import kube, leadership
from ckptdrain.operator.peers import certs as peer_certs
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


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
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


def test_first_pass_creates_secrets_configmap_and_status(api: FakeApi) -> None:
    run(body())
    # The CA is kept before anything it signs is handed out.
    assert api.calls[:3] == [f"read {STORE}/{CA_NAME}", f"create {STORE}/{CA_NAME}",
                             f"create ml/{PODS_SECRET}"]
    pods_secret = api.secrets["ml", PODS_SECRET]
    assert sorted(pods_secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    ca = api.data(STORE, CA_NAME)
    assert b"PRIVATE KEY" in ca["ca.key"]
    assert api.secrets[STORE, CA_NAME]["metadata"]["labels"] == {
        "ckptdrain.io/peer-ca-for": "u-1", "ckptdrain.io/peer-ca-installation": "ckptdrain"}
    mounted = api.data("ml", PODS_SECRET)
    assert mounted["ca.crt"] == ca["ca.crt"] and signed_by(mounted["tls.crt"], ca["ca.crt"])
    owner = pods_secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("CheckpointPolicy", "llama", "u-1")
    doc = json.loads(api.configmaps["llama-ckptdrain-peers"]["data"]["peers.json"])
    assert doc["policy"] == "ml/llama"
    assert {r: e["holder"] for r, e in doc["writers"].items()} == {"0": 1, "1": 0}
    assert doc["writers"]["0"]["zone"] == "z0" and doc["writers"]["0"]["address"] == \
        "10.0.0.1:9109"
    assert api.status[-1]["peer"]["reason"] == "Paired"
    ends = contract.parse_timestamp(api.status[-1]["peer"]["certificateNotAfter"])
    assert ends == peer_certs.not_after(mounted["tls.crt"]).replace(microsecond=0)
    assert abs(ends - datetime.now(UTC) - peer_certs.CERT_LIFETIME) < timedelta(minutes=1)


def test_an_unchanged_pairing_writes_nothing(api: FakeApi) -> None:
    run(body())
    calls, patches = len(api.calls), len(api.status)
    run(body())
    assert len(api.calls) == calls and len(api.status) == patches
    assert sorted(api.node_reads) == ["n0", "n1"]  # zones read once per node


def test_a_restart_keeps_a_certificate_the_status_says_is_good(api: FakeApi) -> None:
    run(body())
    status = api.status[-1]
    before = api.secrets["ml", PODS_SECRET]
    restart()
    calls = len(api.calls)
    run(body(status=status))
    assert api.secrets["ml", PODS_SECRET] is before
    assert not [c for c in api.calls[calls:] if c.startswith("replace")]
    assert not api.events


def test_a_certificate_near_its_end_is_renewed_with_the_same_ca(api: FakeApi) -> None:
    run(body())
    first = api.data("ml", PODS_SECRET)
    status = json.loads(json.dumps(api.status[-1]))
    soon = datetime.now(UTC) + peer_certs.RENEW_BEFORE - timedelta(days=1)
    status["peer"]["certificateNotAfter"] = contract.timestamp(soon)
    restart()
    run(body(status=status))
    renewed = api.data("ml", PODS_SECRET)
    assert f"replace ml/{PODS_SECRET}" in api.calls
    assert renewed["tls.crt"] != first["tls.crt"] and renewed["tls.key"] != first["tls.key"]
    # The same CA: pods still holding the first certificate trust the new one.
    assert renewed["ca.crt"] == first["ca.crt"] and signed_by(renewed["tls.crt"],
                                                              first["ca.crt"])
    assert api.secrets["ml", PODS_SECRET]["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert [reason for reason, _ in api.events] == ["PeerCredentialsRenewed"]
    ends = contract.parse_timestamp(api.status[-1]["peer"]["certificateNotAfter"])
    assert ends - datetime.now(UTC) > peer_certs.CERT_LIFETIME - timedelta(days=1)
    calls = len(api.calls)
    run(body(status=api.status[-1]))
    assert api.calls[calls:] == []  # renewed once, not at every pass


def test_a_certificate_of_unknown_end_is_replaced_signed_by_the_kept_ca(
        api: FakeApi) -> None:
    """An older version's Secret (its CA out of reach, in the policy's
    namespace), or one a deleted policy of this name left behind."""
    api.secrets["ml", PODS_SECRET] = {"metadata": {"name": PODS_SECRET},
                                      "data": {"tls.crt": "theirs"}}
    run(body())
    mounted = api.data("ml", PODS_SECRET)
    assert signed_by(mounted["tls.crt"], api.data(STORE, CA_NAME)["ca.crt"])
    owner = api.secrets["ml", PODS_SECRET]["metadata"]["ownerReferences"][0]
    assert owner["uid"] == "u-1"  # this policy's now: the collector leaves it alone
    assert [reason for reason, _ in api.events] == ["PeerCredentialsRenewed"]
    assert api.status[-1]["peer"]["reason"] == "Paired"


def test_a_ca_near_its_end_is_replaced(api: FakeApi) -> None:
    old = peer_certs.new_ca("ml/llama", datetime.now(UTC) - timedelta(days=3650 - 300))
    api.secrets[STORE, CA_NAME] = {"metadata": {"name": CA_NAME, "labels": {}}, "data": {
        k: base64.b64encode(v).decode() for k, v in old.items()}}
    run(body())
    kept = api.data(STORE, CA_NAME)
    assert kept["ca.crt"] != old["ca.crt"] and peer_certs.ca_usable(kept, datetime.now(UTC))
    assert signed_by(api.data("ml", PODS_SECRET)["tls.crt"], kept["ca.crt"])


def test_without_a_ca_namespace_nothing_is_signed_and_the_status_says_why(
        api: FakeApi) -> None:
    run(body(), store="")
    assert not api.secrets
    assert api.status[-1]["peer"]["reason"] == "CredentialsFailed"
    assert "CKPTDRAIN_PEER_CA_NAMESPACE" in api.status[-1]["peer"]["message"]


def test_a_pods_secret_deleted_by_hand_is_made_again_after_the_upkeep(
        api: FakeApi) -> None:
    run(body())
    del api.secrets["ml", PODS_SECRET]
    run(body(status=api.status[-1]))
    assert ("ml", PODS_SECRET) not in api.secrets  # checked hourly, not at every pass
    assert peer_sync.upkeep(STORE, lambda: {"u-1"}) == 0
    run(body(status=api.status[-1]))
    assert signed_by(api.data("ml", PODS_SECRET)["tls.crt"], api.data(STORE, CA_NAME)["ca.crt"])


def test_the_upkeep_deletes_the_cas_of_policies_that_are_gone(api: FakeApi) -> None:
    run(body())
    other = body()
    other["metadata"]["uid"] = "u-2"
    peer_sync.sync(("ml", "other"), policy.parse("ml", "other", SPEC, CFG), other, PODS, [],
                   LOG, ca_namespace=STORE)
    assert (STORE, "ckptdrain-peer-ca-u-2") in api.secrets
    assert peer_sync.upkeep(STORE, lambda: {"u-2"}) == 1
    assert (STORE, CA_NAME) not in api.secrets and (STORE, "ckptdrain-peer-ca-u-2") in \
        api.secrets


def test_a_deleted_policys_ca_goes_with_it(api: FakeApi) -> None:
    run(body())
    leadership.STATE.set(True)
    peer_sync.forget(KEY, "u-1", STORE)
    assert (STORE, CA_NAME) not in api.secrets


def test_forbidden_secrets_show_in_the_status_and_are_tried_again(api: FakeApi) -> None:
    api.secret_error = 403
    run(body())
    assert api.status[-1]["peer"]["reason"] == "CredentialsFailed"
    said = api.status[-1]["peer"]["message"]
    assert said.startswith("the operator could not create or renew its Secrets: secrets is "
                           'forbidden: User "system:serviceaccount:')
    assert "agent.namespaces and operator.peerTierNamespaces" in said
    assert "llama-ckptdrain-peers" in api.configmaps  # the pairing is still published
    assert [reason for reason, _ in api.events] == ["PeerTierFailed"]
    run(body())
    assert len(api.events) == 1  # once, not at every pass
    api.secret_error = None
    run(body())
    assert ("ml", PODS_SECRET) in api.secrets
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
    monkeypatch.setattr(peer_kube, "node_labels", lambda name: answers[0])
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


def test_nothing_is_signed_until_its_ca_is_kept(api: FakeApi) -> None:
    api.ca_error = 500  # the CA is read (none), but its create fails
    with pytest.raises(kube.ApiException):
        run(body())
    assert f"read {STORE}/{CA_NAME}" in api.calls and f"create {STORE}/{CA_NAME}" in api.calls
    assert not api.secrets  # no certificate out there whose CA could be lost
    api.ca_error = None
    run(body())
    assert signed_by(api.data("ml", PODS_SECRET)["tls.crt"], api.data(STORE, CA_NAME)["ca.crt"])


def test_forbidden_configmaps_show_in_the_status_without_a_retry_loop(api: FakeApi) -> None:
    api.configmap_error = 403
    run(body())  # no exception: nothing for the timer to retry
    assert api.status[-1]["peer"]["reason"] == "PublishFailed"
    said = api.status[-1]["peer"]["message"]
    assert 'cannot create resource "configmaps" in API group "" in the namespace "ml"' in said
    assert "operator.peerTierNamespaces" in said  # where the rights come from
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


def test_a_ca_that_cannot_be_read_is_retried_not_replaced(api: FakeApi) -> None:
    api.ca_read_error = 500
    with pytest.raises(kube.ApiException):
        run(body())
    assert not api.secrets
    api.ca_read_error = None
    run(body())
    assert ("ml", PODS_SECRET) in api.secrets


def test_a_lost_ca_brings_the_pods_secret_onto_the_new_one_at_once(api: FakeApi) -> None:
    """Not at the next renewal, months later, when pods holding a certificate
    of the lost CA would stop trusting the renewed ones."""
    run(body())
    status = api.status[-1]
    del api.secrets[STORE, CA_NAME]  # deleted by hand
    restart()
    run(body(status=status))
    kept = api.data(STORE, CA_NAME)
    assert signed_by(api.data("ml", PODS_SECRET)["tls.crt"], kept["ca.crt"])
    assert api.data("ml", PODS_SECRET)["ca.crt"] == kept["ca.crt"]
    assert "with a new CA" in api.events[-1][1]


def test_a_ca_another_replica_replaced_meanwhile_is_not_overwritten(api: FakeApi) -> None:
    old = peer_certs.new_ca("ml/llama", datetime.now(UTC) - timedelta(days=3650 - 300))
    api.secrets[STORE, CA_NAME] = {"metadata": {"name": CA_NAME, "labels": {}}, "data": {
        k: base64.b64encode(v).decode() for k, v in old.items()}}
    theirs = peer_certs.new_ca("ml/llama", datetime.now(UTC))
    api.meanwhile = {"metadata": {"name": CA_NAME, "labels": {}}, "data": {
        k: base64.b64encode(v).decode() for k, v in theirs.items()}}
    run(body())
    assert api.data(STORE, CA_NAME) == theirs  # read again, and used
    assert signed_by(api.data("ml", PODS_SECRET)["tls.crt"], theirs["ca.crt"])


def test_the_upkeep_spares_another_installations_cas(api: FakeApi) -> None:
    run(body(), installation="team-a")
    assert peer_sync.upkeep(STORE, set, "team-b") == 0
    assert (STORE, CA_NAME) in api.secrets
    assert peer_sync.upkeep(STORE, set, "team-a") == 1


def test_a_standby_leaves_a_deleted_policys_ca_to_the_active_one(api: FakeApi) -> None:
    run(body())
    leadership.STATE.set(False)
    try:
        peer_sync.forget(KEY, "u-1", STORE)
    finally:
        leadership.STATE.set(True)
    assert (STORE, CA_NAME) in api.secrets


def test_a_new_term_trusts_the_status_over_what_it_remembered(api: FakeApi) -> None:
    """Another replica renewed while this one stood by: this one's memory of
    the old end must not make it renew again, nor skip checking the Secret."""
    run(body())
    leadership.STATE.set(False)
    leadership.STATE.set(True)
    assert not peer_sync._certificates and not peer_sync._secrets


def test_the_upkeep_thread_survives_any_failure(
        api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    passes: list[int] = []
    done = threading.Event()

    def run_all() -> None:
        passes.append(1)
        if len(passes) == 1:
            raise ValueError("not an ApiException: a dropped connection, say")
        done.set()

    monkeypatch.setattr(peer_sync, "_upkeep_started", threading.Event())
    leadership.STATE.set(True)
    thread = peer_sync.start_upkeep(STORE, "ckptdrain", set, run_all, period_s=0.01)
    assert thread is not None
    assert peer_sync.start_upkeep(STORE, "ckptdrain", set, run_all) is None  # once
    assert done.wait(10), "the upkeep stopped after a failure"
    assert thread.is_alive()
    peer_sync._upkeep_started.clear()
    thread.join(10)
    assert not thread.is_alive()
