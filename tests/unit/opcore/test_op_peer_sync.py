"""operator/peers/sync.py, its writes counted against a fake API: the policy's
CA kept in the operator's namespace before anything it signs is handed out,
the pods' Secret created once and renewed with the same CA before its
certificate ends (never the CA key in it), the ConfigMap and the status only
when they change. Refusals are in test_op_peer_sync_refusals.py; restarts,
terms and replicas in test_op_peer_sync_replicas.py."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest
from tests.support.peer_sync_api import (
    CA_NAME,
    CFG,
    KEY,
    LOG,
    PODS,
    PODS_SECRET,
    SPEC,
    STORE,
    FakeApi,
    body,
    install_fake_api,
    restart,
    run,
    signed_by,
)

from ckptdrain.contract import api as contract
from ckptdrain.operator.apiserver import kube
from ckptdrain.operator.peers import certs as peer_certs
from ckptdrain.operator.peers import sync as peer_sync
from ckptdrain.operator.policy import spec as policy


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    return install_fake_api(monkeypatch)


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


def test_a_pods_secret_deleted_by_hand_is_made_again_after_the_upkeep(
        api: FakeApi) -> None:
    run(body())
    del api.secrets["ml", PODS_SECRET]
    run(body(status=api.status[-1]))
    assert ("ml", PODS_SECRET) not in api.secrets  # checked hourly, not at every pass
    assert peer_sync.upkeep(STORE, lambda: {"u-1"}) == 0
    run(body(status=api.status[-1]))
    assert signed_by(api.data("ml", PODS_SECRET)["tls.crt"], api.data(STORE, CA_NAME)["ca.crt"])


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
