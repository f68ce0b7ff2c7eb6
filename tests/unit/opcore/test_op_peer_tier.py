"""operator/policy/peer_tier.py: spec.peerTier, and what the webhook adds to a pod for it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from ckptdrain.contract.env import Env
from ckptdrain.operator import config
from ckptdrain.operator.admission import injection
from ckptdrain.operator.peers import certs as peer_certs
from ckptdrain.operator.policy import peer_tier
from ckptdrain.operator.policy import spec as policy
from ckptdrain.operator.policy.peer_tier import PeerTier, not_ready
from ckptdrain.peer import config as peer_config
from ckptdrain.peer import protocol, tls

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
BASE = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "800GB"},
    "interval": "15m", "writers": 8,
    "localTier": {"path": "/mnt/ckptdrain/nvme"},
    "storage": {"uri": "s3://bucket/runs", "credentialsSecretRef": {"name": "creds"}},
}


def spec(**peer: Any) -> dict[str, Any]:
    return {**BASE, "peerTier": peer} if peer else dict(BASE)


def pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
            "spec": {"containers": [{"name": "trainer", "image": "t:1"}],
                     "initContainers": [{"name": "user-init", "image": "x"}]}}


def injected(p: policy.Policy, cfg: config.OperatorConfig = CFG) -> dict[str, Any]:
    body = pod()
    return jsonpatch.apply_patch(copy.deepcopy(body),
                                 injection.build_pod_patch(body, p, cfg, 1e9, rank=3))


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in items}


# -- the spec ---------------------------------------------------------------------


def test_off_unless_enabled() -> None:
    assert policy.parse("ml", "llama", spec(), CFG).peer == peer_tier.PeerTier()
    assert policy.parse("ml", "llama", spec(keep=3), CFG).peer.enabled is False


def test_enabled_with_keep_and_capacity() -> None:
    p = policy.parse("ml", "llama", spec(enabled=True, keep=3, capacity="1TB"), CFG)
    assert p.peer == peer_tier.PeerTier(True, 3, 10**12)


@pytest.mark.parametrize(("peer", "field"), [
    ({"enabled": "yes"}, "spec.peerTier.enabled"),
    ({"enabled": True, "keep": 0}, "spec.peerTier.keep"),
    ({"enabled": True, "keep": "two"}, "spec.peerTier.keep"),
    ({"enabled": True, "capacity": "lots"}, "spec.peerTier.capacity"),
    # 800GB over 8 writers: one copy is 100GB.
    ({"enabled": True, "capacity": "99GB"}, "spec.peerTier.capacity"),
    ({"enabled": True, "capacity": 0}, "spec.peerTier.capacity"),
])
def test_bad_values_name_their_field(peer: dict[str, Any], field: str) -> None:
    errors = policy.validate(spec(**peer), CFG)
    assert [e.field for e in errors] == [field]


def test_not_an_object_is_refused() -> None:
    errors = policy.validate({**BASE, "peerTier": True}, CFG)
    assert [e.field for e in errors] == ["spec.peerTier"]


def test_a_name_too_long_for_the_pods_label_is_refused_with_the_tier_on() -> None:
    long = "p" * 64
    errors = policy.validate(spec(enabled=True), CFG, name=long)
    assert [e.field for e in errors] == ["metadata.name"]
    assert "63" in str(errors[0])
    assert policy.validate(spec(enabled=True), CFG, name="p" * 63) == []
    assert policy.validate(spec(), CFG, name=long) == []


def test_capacity_of_exactly_one_copy_is_enough() -> None:
    assert policy.validate(spec(enabled=True, capacity="100GB"), CFG) == []


# -- the pod ----------------------------------------------------------------------


ON = policy.parse("ml", "llama", spec(enabled=True, keep=3, capacity="1TB"), CFG)
OFF = policy.parse("ml", "llama", spec(), CFG)


def test_peer_sidecar_runs_before_restore() -> None:
    names = [c["name"] for c in injected(ON)["spec"]["initContainers"]]
    assert names == ["ckptdrain-prepare", "ckptdrain-peer", "ckptdrain-restore",
                     "ckptdrain-agent", "user-init"]
    cfg = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0",
                                prepare_local_tier=False)
    names = [c["name"] for c in injected(ON, cfg)["spec"]["initContainers"]]
    assert names[:3] == ["ckptdrain-peer", "ckptdrain-restore", "ckptdrain-agent"]


def test_peer_sidecar_is_a_locked_down_native_sidecar_with_its_port() -> None:
    peer = by_name(injected(ON)["spec"]["initContainers"])["ckptdrain-peer"]
    assert peer["command"] == ["ckptdrain", "peer"] and peer["restartPolicy"] == "Always"
    assert peer["ports"] == [{"name": "ckptdrain-peer", "containerPort": 9109,
                              "protocol": "TCP"}]
    sc = peer["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}


def test_peer_sidecar_gets_no_store_credentials() -> None:
    peer = by_name(injected(ON)["spec"]["initContainers"])["ckptdrain-peer"]
    names = {e["name"] for e in peer["env"]}
    assert Env.ACCESS_KEY_ID.value not in names and Env.SECRET_ACCESS_KEY.value not in names
    assert "secretKeyRef" not in str(peer)
    mounts = {m["name"] for m in peer["volumeMounts"]}
    assert mounts == {"ckptdrain-local", "ckptdrain-tmp", "ckptdrain-peer-tls",
                      "ckptdrain-peers"}


def test_credentials_and_document_by_reference_read_only() -> None:
    out = injected(ON)
    vols = by_name(out["spec"]["volumes"])
    secret = vols["ckptdrain-peer-tls"]["secret"]
    assert secret["secretName"] == "llama-ckptdrain-peer"
    # Never the CA key, whatever the Secret holds.
    assert [i["key"] for i in secret["items"]] == ["ca.crt", "tls.crt", "tls.key"]
    assert "optional" not in secret
    cm = vols["ckptdrain-peers"]["configMap"]
    assert cm["name"] == "llama-ckptdrain-peers" and cm["optional"] is True
    assert cm["items"] == [{"key": "peers.json", "path": "peers.json"}]
    for c in out["spec"]["initContainers"][1:4]:
        mounted = by_name(c["volumeMounts"])
        assert mounted["ckptdrain-peer-tls"]["readOnly"] is True
        assert mounted["ckptdrain-peers"]["readOnly"] is True
    trainer = out["spec"]["containers"][0]
    assert all(m["name"] not in vols or not m["name"].startswith("ckptdrain-peer")
               for m in trainer.get("volumeMounts", []))


def test_agent_restore_and_peer_read_the_same_peer_settings(tmp_path: Path) -> None:
    """What peer/config.py makes of the injected environment: the contract both
    sides share, checked end to end (the paths exist only in the pod)."""
    containers = by_name(injected(ON)["spec"]["initContainers"])
    for name in ("ckptdrain-peer", "ckptdrain-restore", "ckptdrain-agent"):
        env = {e["name"]: e["value"] for e in containers[name]["env"] if "value" in e}
        loaded = peer_config.load("ml/llama", env)
        assert loaded is not None, name
        assert loaded.credentials.directory == Path(peer_tier.TLS_DIR)
        assert loaded.peers_file == Path("/etc/ckptdrain/peers/peers.json")
        assert (loaded.port, loaded.keep, loaded.capacity) == (9109, 3, 10**12)


def test_off_adds_nothing_of_the_peer_tier() -> None:
    out = injected(OFF)
    text = str(out)
    assert "ckptdrain-peer" not in text and "CKPTDRAIN_PEER" not in text
    env = {e["name"]: e["value"] for e in out["spec"]["initContainers"][2]["env"]
           if "value" in e}
    assert peer_config.load("ml/llama", env) is None


def test_constants_match_the_node_side() -> None:
    assert peer_tier.PEER_PORT == protocol.DEFAULT_PORT
    assert peer_tier.POD_KEYS == peer_certs.POD_KEYS == tls.FILES


def test_pods_carry_the_policy_label_a_network_policy_selects() -> None:
    assert injected(ON)["metadata"]["labels"] == {
        "app": "t", "ckptdrain.io/writer": "3", "ckptdrain.io/writer-policy": "llama",
        "ckptdrain.io/policy": "llama"}
    # Without the tier too: policy admission reads a policy's pods by it.
    assert injected(OFF)["metadata"]["labels"]["ckptdrain.io/policy"] == "llama"
    bare = pod()
    del bare["metadata"]["labels"]
    out = jsonpatch.apply_patch(bare, injection.build_pod_patch(bare, ON, CFG, 1e9))
    assert out["metadata"]["labels"] == {"ckptdrain.io/policy": "llama"}


def test_a_pod_gets_the_peer_tier_only_once_its_secrets_are_reported() -> None:
    on = PeerTier(enabled=True)
    assert not_ready(PeerTier(), {}) is None  # off: nothing to wait for
    assert "not reported" in (not_ready(on, {}) or "")
    assert "not reported" in (not_ready(on, {"peer": {"enabled": True}}) or "")
    failed = {"peer": {"reason": "CredentialsFailed", "message": "Forbidden",
                       "secret": "llama-ckptdrain-peer"}}
    assert "Forbidden" in (not_ready(on, failed) or "")
    ready = {"peer": {"reason": "Paired", "secret": "llama-ckptdrain-peer"}}
    assert not_ready(on, ready) is None
    assert "not reported" in (not_ready(on, {"peer": "garbage"}) or "")
