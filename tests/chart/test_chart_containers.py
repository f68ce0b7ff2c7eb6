"""The chart's `containers` values reach the operator as the one JSON
variable its config reads (CKPTDRAIN_CONTAINERS), its defaults are the
operator's own, and the values schema refuses what the operator would."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from tests.chart.support import CHART, Tools

from ckptdrain.operator import config, containers

pytestmark = pytest.mark.cluster


def _env(tools: Tools, *args: str) -> dict[str, str]:
    out = tools.run("helm", "template", "ckptdrain", str(CHART), "--namespace", "ckptdrain",
                    *args).stdout
    deployment: dict[str, Any] = next(d for d in yaml.safe_load_all(out)
                                      if d and d["kind"] == "Deployment")
    return {e["name"]: e["value"]
            for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
            if "value" in e}


def test_the_defaults_are_the_operators_own(tools: Tools) -> None:
    """An install that sets nothing injects what the operator injects without
    the variable: the chart states every amount and the mode, each the
    operator's own default (not merely left for the operator to fill in)."""
    env = _env(tools)
    assert json.loads(env["CKPTDRAIN_CONTAINERS"]) == containers.to_raw(
        containers.DEFAULT_CONTAINERS)
    assert config.from_env(env).containers == containers.DEFAULT_CONTAINERS


def test_values_reach_the_operator_merged_into_the_defaults(tools: Tools) -> None:
    got = config.from_env(_env(
        tools, "--set", "containers.qos=Guaranteed", "--set", "containers.agent.limits.cpu=1",
        "--set", "containers.restore.max.memory=32Gi",
        "--set", "containers.prepare.limits.memory=null",
        "--set", "containers.peer.guaranteed.cpu=1500m")).containers
    assert got.qos == "Guaranteed"
    assert got.agent == containers.Resources(
        requests={"cpu": "100m", "memory": "256Mi"}, limits={"cpu": "1", "memory": "1Gi"},
        guaranteed={"cpu": "1", "memory": "1Gi"}, max={"cpu": "2", "memory": "8Gi"})
    assert got.peer.guaranteed == {"cpu": "1500m", "memory": "1Gi"}
    assert got.restore.max == {"cpu": "2", "memory": "32Gi"}
    assert got.prepare.limits == {}


@pytest.mark.parametrize(("args", "needle"), [
    (["--set", "containers.qos=Pinned"], "at '/containers/qos': value must be one of"),
    (["--set", "containers.agent.requests.gpu=1"],
     "at '/containers/agent/requests': additional properties 'gpu' not allowed"),
    (["--set", "containers.sidecar.requests.cpu=1"],
     "at '/containers': additional properties 'sidecar' not allowed"),
    (["--set", "containers.peer.limits.memory=1GB"], "at '/containers/peer/limits/memory'"),
    (["--set", "containers.agent.limits.ephemeral-storage=1Gi"],
     "at '/containers/agent/limits': additional properties 'ephemeral-storage' not allowed"),
    (["--set", "containers.agent.guaranteed.ephemeral-storage=1Gi"],
     "at '/containers/agent/guaranteed': additional properties 'ephemeral-storage'"),
    (["--set-json", 'containers.agent.requests.cpu=0.5'],
     "at '/containers/agent/requests/cpu'"),
])
def test_the_values_schema_refuses_what_the_operator_would(tools: Tools, args: list[str],
                                                            needle: str) -> None:
    result = tools.run("helm", "template", "ckptdrain", str(CHART), *args, check=False)
    assert result.returncode != 0 and needle in result.stderr, result.stderr
