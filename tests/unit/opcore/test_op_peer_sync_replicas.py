"""operator/peers/sync.py across restarts, leadership terms, replicas and
installations: previous holders read back, the CAs of deleted policies
removed by the active replica only, another installation's left alone, and
the upkeep thread kept alive."""

from __future__ import annotations

import base64
import json
import threading
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
    pod,
    run,
    signed_by,
)

from ckptdrain.operator.apiserver import leadership
from ckptdrain.operator.peers import certs as peer_certs
from ckptdrain.operator.peers import sync as peer_sync
from ckptdrain.operator.policy import spec as policy


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    return install_fake_api(monkeypatch)


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
