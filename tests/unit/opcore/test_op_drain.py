"""The policy's drain section: drain.stallTimeout from the CRD to the agent's config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ckptdrain.contract.drain import DEFAULT_STALL_AFTER
from ckptdrain.operator import config
from ckptdrain.operator.admission import pod_env
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
CRD = Path(__file__).resolve().parents[3] / "crds" / "checkpointpolicies.yaml"


def spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
        "interval": "15m", "writers": 8,
        "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
        "storage": {"uri": "s3://bucket/runs"}}
    base.update(over)
    return base


def _agent_config(s: dict[str, Any]) -> Any:
    from ckptdrain.node import config as node_config

    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
           "spec": {"containers": [{"name": "trainer", "image": "t:1"}]}}
    env = pod_env.agent_env(pod, policy.parse("ml", "p", s, CFG), 1e9, rank=0)
    return node_config.load(environ={e["name"]: e["value"] for e in env if "value" in e})


def test_the_stall_timeout_reaches_the_agent_and_defaults_to_five_minutes() -> None:
    assert _agent_config(spec(drain={"stallTimeout": "90s"})).stall_timeout_s == 90.0
    assert _agent_config(spec()).stall_timeout_s == DEFAULT_STALL_AFTER == 300.0


@pytest.mark.parametrize("bad", ["3s", "never", "0"])
def test_a_bad_stall_timeout_is_refused_naming_the_field(bad: str) -> None:
    errors = policy.validate(spec(drain={"stallTimeout": bad}), CFG)
    assert [e.field for e in errors] == ["spec.drain.stallTimeout"]
    assert "at least 10s" in str(errors[0]) or "duration" in str(errors[0])


def test_the_crd_default_is_the_code_default() -> None:
    """In every served version (each spells it its own way)."""
    crd = yaml.safe_load(CRD.read_text())
    assert len(crd["spec"]["versions"]) >= 2
    for version in crd["spec"]["versions"]:
        props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        field = props["properties"]["drain"]["properties"]["stallTimeout"]
        assert policy.parse("ml", "p", spec(drain={"stallTimeout": field["default"]}),
                            CFG).stall_timeout_s == DEFAULT_STALL_AFTER, version["name"]
