"""operator/peers/sync.py when the apiserver refuses or fails it (RBAC,
unreadable CAs and nodes, no CA namespace): the status says why, and what
can be tried again is, without a retry loop."""

from __future__ import annotations

import pytest
from tests.support.peer_sync_api import PODS_SECRET, FakeApi, body, install_fake_api, run

from ckptdrain.operator.apiserver import kube
from ckptdrain.operator.peers import kube as peer_kube
from ckptdrain.operator.peers import sync as peer_sync


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    return install_fake_api(monkeypatch)


def test_without_a_ca_namespace_nothing_is_signed_and_the_status_says_why(
        api: FakeApi) -> None:
    run(body(), store="")
    assert not api.secrets
    assert api.status[-1]["peer"]["reason"] == "CredentialsFailed"
    assert "CKPTDRAIN_PEER_CA_NAMESPACE" in api.status[-1]["peer"]["message"]


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
