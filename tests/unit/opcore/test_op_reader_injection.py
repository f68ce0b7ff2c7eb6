"""What the webhook gives a reader (a pod that restores a shard and never
writes), per docs/pod-contract.md, and that the node side reads it back."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from ckptdrain.contract.env import Env
from ckptdrain.node import config as node_config
from ckptdrain.operator import config
from ckptdrain.operator.admission import injection
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
SPEC: dict[str, Any] = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "40GB"},
    "interval": "15m", "writers": 4, "readers": "Replicas",
    "localTier": {"path": "/mnt/ckptdrain/nvme"},
    "storage": {"uri": "s3://bucket/runs", "credentialsSecretRef": {"name": "creds"}},
}


def pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-6", "namespace": "ml", "labels": {"app": "t"}},
            "spec": {"containers": [{"name": "trainer", "image": "t:1"}],
                     "initContainers": [{"name": "user-init", "image": "x"}]}}


def injected(spec: dict[str, Any] = SPEC, **kw: Any) -> dict[str, Any]:
    body = pod()
    p = policy.parse("ml", "llama", spec, CFG)
    return jsonpatch.apply_patch(copy.deepcopy(body),
                                 injection.build_pod_patch(body, p, CFG, 1e9, **kw))


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_a_reader_gets_restore_alone_with_the_local_tier_read_only() -> None:
    out = injected(rank=2, reader=True)
    inits = out["spec"]["initContainers"]
    # No agent to capture or drain, no peer server, no root container.
    assert [c["name"] for c in inits] == ["ckptdrain-restore", "user-init"]
    restore = inits[0]
    local = next(m for m in restore["volumeMounts"] if m["name"] == "ckptdrain-local")
    assert local == {"name": "ckptdrain-local", "mountPath": "/ckptdrain/local",
                     "readOnly": True}
    env = env_of(restore)
    assert (env[Env.ROLE], env[Env.WRITER_ID], env[Env.READERS]) == ("reader", "2", "true")
    assert env[Env.LOCAL_DIR] == "/ckptdrain/local/writer-$(CKPTDRAIN_WRITER_ID)"
    # The work dir still takes the restored shard: the scheduler must count it.
    assert "ephemeral-storage" in restore["resources"]["requests"]
    trainer = env_of(out["spec"]["containers"][0])
    assert (trainer[Env.ROLE], trainer[Env.WRITER_ID], trainer[Env.WRITERS]) == (
        "reader", "2", "4")


def test_a_reader_is_labelled_as_one_and_never_as_a_writer() -> None:
    out = injected(rank=2, reader=True, workload_writers=8)
    labels, notes = out["metadata"]["labels"], out["metadata"]["annotations"]
    assert labels == {"app": "t", "ckptdrain.io/reader": "2", "ckptdrain.io/policy": "llama"}
    # No share to seed, no writer count to check: it does not drain.
    assert "ckptdrain.io/bandwidth" not in notes
    assert "ckptdrain.io/workload-writers" not in notes
    assert notes["ckptdrain.io/injected"] == "true"
    assert "ckptdrain-share" not in {v["name"] for v in out["spec"]["volumes"]}


def test_a_reader_restores_from_peers_without_serving_any() -> None:
    out = injected({**SPEC, "peerTier": {"enabled": True}}, rank=1, reader=True)
    names = [c["name"] for c in out["spec"]["initContainers"]]
    assert names == ["ckptdrain-restore", "user-init"]
    restore = out["spec"]["initContainers"][0]
    assert Env.PEERS_FILE in env_of(restore)
    assert {"ckptdrain-peer-tls", "ckptdrain-peers"} <= {
        m["name"] for m in restore["volumeMounts"]}
    # The label a NetworkPolicy lets reach the peer port.
    assert out["metadata"]["labels"]["ckptdrain.io/policy"] == "llama"


def test_writers_beside_readers_are_told_so() -> None:
    alone = env_of(injected(rank=0)["spec"]["initContainers"][1])
    beside = env_of(injected(rank=0, readers_alongside=True)["spec"]["initContainers"][1])
    assert (alone[Env.ROLE], alone[Env.READERS]) == ("writer", "false")
    assert (beside[Env.ROLE], beside[Env.READERS]) == ("writer", "true")


def test_the_restore_step_reads_a_readers_environment_back() -> None:
    restore = injected(rank=3, reader=True)["spec"]["initContainers"][0]
    environ = {e["name"]: e["value"].replace("$(CKPTDRAIN_WRITER_ID)", "3")
               for e in restore["env"] if "value" in e}
    cfg = node_config.load(environ=environ)
    assert (cfg.role, cfg.writer, cfg.writers, cfg.reader) == ("reader", 3, 4, True)
    assert not cfg.restores_alone
    assert str(cfg.local_dir) == "/ckptdrain/local/writer-3"
    assert cfg.restore_reshard == "dcp"
