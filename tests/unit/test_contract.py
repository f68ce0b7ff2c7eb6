"""The node↔cluster contract: one list of env names that the webhook injects
and the node config reads back to the policy's values; the record format."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ckptdrain import client, units
from ckptdrain.agent.report import State as ReportedState
from ckptdrain.contract import api
from ckptdrain.contract import record as fmt
from ckptdrain.contract.env import CREDENTIALS, MOUNT_ONLY, TRAINER_ONLY, Env
from ckptdrain.node import config as node_config
from ckptdrain.operator import config
from ckptdrain.operator.admission import pod_env
from ckptdrain.operator.policy import identity
from ckptdrain.operator.policy import spec as policy
from ckptdrain.peer import config as peer_config

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
SPEC: dict[str, Any] = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "7B"},
    "interval": "10m", "overlap": "5%", "globalEvery": 3,
    "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 4},
    "storage": {"uri": "s3://bucket/runs", "endpoint": "http://minio:9000",
                "region": "eu-1", "keep": 5, "credentialsSecretRef": {"name": "creds"}},
    "restore": {"prefer": "global"},
}
POD: dict[str, Any] = {
    "metadata": {"name": "w-0", "namespace": "ml",
                 "annotations": {identity.JOB_INDEX: "0"}},
    "spec": {"terminationGracePeriodSeconds": 120, "containers": [{"name": "t"}]},
}


def _injected_env() -> list[dict[str, Any]]:
    p = policy.parse("ml", "llama", SPEC, CFG)
    return pod_env.agent_env(POD, p, default_rate=50e6, rank=0)


def test_every_injected_name_is_in_the_contract() -> None:
    p = policy.parse("ml", "llama", SPEC, CFG)
    names = [e["name"] for e in _injected_env() + pod_env.trainer_env(POD, p)]
    assert names and all(isinstance(n, str) and n in set(Env) for n in names), names


def test_every_contract_name_is_read_by_the_node_side() -> None:
    read = {f.env for f in node_config.FIELDS if f.env is not None} | peer_config.READS
    # The trainer's client reads the few it needs itself; credentials go to boto3.
    unread = set(Env) - read - CREDENTIALS - TRAINER_ONLY - MOUNT_ONLY
    assert unread == set(), f"in the contract but read by nobody: {sorted(unread)}"


def test_what_the_webhook_injects_the_agent_reads_back_as_the_policy_says() -> None:
    environ = {e["name"]: e["value"] for e in _injected_env() if "value" in e}
    cfg = node_config.load(environ=environ)
    assert (cfg.interval_s, cfg.overlap, cfg.global_every) == (600.0, 0.05, 3)
    assert (cfg.local_keep, cfg.global_keep, cfg.restore_prefer) == (4, 5, "global")
    assert (cfg.store_uri, cfg.s3_endpoint, cfg.region) == (
        "s3://bucket/runs/ml/llama", "http://minio:9000", "eu-1")
    assert (cfg.grace_s, cfg.default_rate, cfg.writer) == (120.0, 50e6, 0)
    assert cfg.policy == "ml/llama" and units.format_duration(cfg.interval_s) == "10m"


def test_the_trainer_client_reads_the_names_the_webhook_gives_the_trainer() -> None:
    p = policy.parse("ml", "llama", SPEC, CFG)
    environ = {e["name"]: e["value"] for e in pod_env.trainer_env(POD, p, rank=0)
               if "value" in e}
    c = client.Client(environ=environ)
    assert str(c.work_dir) == environ[Env.WORK_DIR.value]
    assert str(c.restore_result) == environ[Env.RESTORE_RESULT.value]
    assert (c.writer, c.writers) == ("0", 1)


def test_the_agent_reports_only_record_states() -> None:
    assert set(ReportedState) <= set(fmt.State) and fmt.STATES[-1] == "Expired"


def test_one_time_format_round_trips() -> None:
    assert api.timestamp(NOW) == "2026-01-02T03:04:05Z"
    assert api.parse_timestamp(api.timestamp(NOW)) == NOW
    with pytest.raises(ValueError):
        api.parse_timestamp("2026-01-02 03:04:05")


def test_a_record_speaks_the_api_group_and_version() -> None:
    rec = fmt.build_record("ns", "pol", 7, 2, policy_uid="u")
    assert rec["apiVersion"] == f"{api.GROUP}/{api.VERSION}" == "ckptdrain.io/v1alpha1"
    assert rec["metadata"]["labels"] == {api.LABEL_POLICY: "pol"}
    assert rec["metadata"]["ownerReferences"][0]["kind"] == api.KIND_POLICY
    claim = fmt.writer_patch("1", "Local", 10, ["local"], NOW)["status"]["writers"]["1"]
    assert claim["updateTime"] == "2026-01-02T03:04:05Z"


def test_record_names_are_deterministic_dns_names() -> None:
    assert fmt.record_name("Llama_405B", 1200) == "llama-405b-s1200"


def test_writer_patch_refuses_unknown_states() -> None:
    with pytest.raises(ValueError, match="state"):
        fmt.writer_patch("a", "Done", 1, [], NOW)




def test_a_claim_carries_what_the_drain_cost_and_the_crd_admits_it() -> None:
    import yaml

    from ckptdrain.request_counts import RequestCounts

    cost = RequestCounts(put=7, get=3, list=2, bytes_up=100).as_record()
    claim = fmt.writer_patch("0", "Global", 100, ["global"], NOW,
                             requests=cost)["status"]["writers"]["0"]
    assert claim["requests"] == cost
    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "checkpoints.yaml")
                         .read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    writer = schema["properties"]["status"]["properties"]["writers"]["additionalProperties"]
    assert set(writer["properties"]["requests"]["properties"]) == set(cost) == \
        fmt.REQUEST_FIELDS
    with pytest.raises(ValueError, match="requests"):
        fmt.writer_patch("0", "Global", 1, [], NOW, requests={"posts": 1})


def test_the_crd_admits_every_tier_a_claim_may_name() -> None:
    """The apiserver refuses a whole record patch over one unknown enum value."""
    import yaml

    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "checkpoints.yaml")
                         .read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    writer = schema["properties"]["status"]["properties"]["writers"]["additionalProperties"]
    assert set(fmt.TIERS) <= set(writer["properties"]["tiers"]["items"]["enum"])
    claim = fmt.writer_patch("0", "Local", 1, list(fmt.TIERS), NOW, node="n0", peer_holder=1,
                             peer_node="n1")["status"]["writers"]["0"]
    assert set(claim["tiers"]) == set(fmt.TIERS)
    # Every field a claim may carry is in the schema: the apiserver would drop the rest.
    assert set(claim) <= set(writer["properties"])


def test_a_reader_trainer_knows_its_role_and_shard() -> None:
    p = policy.parse("ml", "llama", {**SPEC, "writers": 4}, CFG)
    environ = {e["name"]: e["value"] for e in pod_env.trainer_env(POD, p, 2, reader=True)
               if "value" in e}
    c = client.Client(environ=environ)
    assert (c.role, c.writer, c.writers) == ("reader", "2", 4)
    writer = client.Client(environ={e["name"]: e["value"] for e in
                                    pod_env.trainer_env(POD, p, 2) if "value" in e})
    assert writer.role == "writer"
