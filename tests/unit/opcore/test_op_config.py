"""operator/config.py: one config object, validated at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config


def test_defaults() -> None:
    cfg = config.from_env({})
    assert cfg.allowed_root == "/mnt/ckptdrain" and cfg.cluster_bandwidth is None
    assert cfg.webhook_port == 9443 and cfg.namespace == ""


def test_values_in_human_units() -> None:
    cfg = config.from_env({"CKPTDRAIN_CLUSTER_BANDWIDTH": "100GB/s",
                           "CKPTDRAIN_ALLOWED_ROOT": "/mnt/nvme/", "CKPTDRAIN_EXPIRED_TTL": "0"})
    assert cfg.cluster_bandwidth == 100e9 and cfg.allowed_root == "/mnt/nvme"
    assert cfg.expired_ttl_s == 0
    assert config.from_env({}).starting_limit_s == 600
    assert config.from_env({"CKPTDRAIN_STARTING_LIMIT": "30m"}).starting_limit_s == 1800


@pytest.mark.parametrize(("env", "name"), [
    ({"CKPTDRAIN_CLUSTER_BANDWIDTH": "fast"}, "CKPTDRAIN_CLUSTER_BANDWIDTH"),
    ({"CKPTDRAIN_ALLOWED_ROOT": "/"}, "CKPTDRAIN_ALLOWED_ROOT"),
    ({"CKPTDRAIN_STARTING_LIMIT": "soon"}, "CKPTDRAIN_STARTING_LIMIT"),
    ({"CKPTDRAIN_ALLOWED_ROOT": "relative"}, "CKPTDRAIN_ALLOWED_ROOT"),
    ({"CKPTDRAIN_WEBHOOK_PORT": "99999"}, "CKPTDRAIN_WEBHOOK_PORT"),
    ({"CKPTDRAIN_WEBHOOK_CERT": "/nonexistent"}, "CKPTDRAIN_WEBHOOK_CERT/CKPTDRAIN_WEBHOOK_KEY"),
    ({"CKPTDRAIN_IMAGE_PULL_POLICY": "Sometimes"}, "CKPTDRAIN_IMAGE_PULL_POLICY"),
    ({"CKPTDRAIN_WEBHOOK_SECRET": "no-namespace"}, "CKPTDRAIN_WEBHOOK_SECRET"),
    ({"CKPTDRAIN_WEBHOOK_SECRET": "ns/"}, "CKPTDRAIN_WEBHOOK_SECRET"),
    ({"CKPTDRAIN_BANDWIDTH_WEIGHTS": "team-a"}, "CKPTDRAIN_BANDWIDTH_WEIGHTS"),
    ({"CKPTDRAIN_BANDWIDTH_WEIGHTS": "team-a=0"}, "CKPTDRAIN_BANDWIDTH_WEIGHTS"),
    ({"CKPTDRAIN_BANDWIDTH_WEIGHTS": "team-a=1001"}, "CKPTDRAIN_BANDWIDTH_WEIGHTS"),
    ({"CKPTDRAIN_BANDWIDTH_WEIGHTS": "team-a=2.5"}, "CKPTDRAIN_BANDWIDTH_WEIGHTS"),
    ({"CKPTDRAIN_BANDWIDTH_WEIGHTS": "Team_A=2"}, "CKPTDRAIN_BANDWIDTH_WEIGHTS"),
    ({"CKPTDRAIN_BANDWIDTH_WEIGHTS": "a=2,a=3"}, "CKPTDRAIN_BANDWIDTH_WEIGHTS"),
])
def test_bad_values_name_the_variable(env: dict[str, str], name: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        config.from_env(env)
    assert caught.value.field == name


def test_namespace_weights_under_the_cluster_cap() -> None:
    assert config.from_env({}).bandwidth_weights == ()
    cfg = config.from_env({"CKPTDRAIN_BANDWIDTH_WEIGHTS": " team-b=2, team-a=4 ,"})
    assert cfg.bandwidth_weights == (("team-a", 4), ("team-b", 2))


def test_the_operator_managed_certificate_is_one_source(tmp_path: Path) -> None:
    cfg = config.from_env({"CKPTDRAIN_WEBHOOK_SECRET": "ckptdrain/ckptdrain-webhook-cert",
                           "CKPTDRAIN_WEBHOOK_CONFIGS": "ckptdrain"})
    assert (cfg.webhook_secret, cfg.webhook_configs) == ("ckptdrain/ckptdrain-webhook-cert",
                                                          "ckptdrain")
    pem = tmp_path / "tls.pem"
    pem.write_text("x")
    with pytest.raises(InvalidInput) as caught:
        config.from_env({"CKPTDRAIN_WEBHOOK_SECRET": "a/b", "CKPTDRAIN_WEBHOOK_CERT": str(pem),
                         "CKPTDRAIN_WEBHOOK_KEY": str(pem)})
    assert caught.value.field == "CKPTDRAIN_WEBHOOK_SECRET/CKPTDRAIN_WEBHOOK_CERT"


def test_unselected_pods_are_refused_unless_flag_is_asked_for() -> None:
    assert config.from_env({}).unselected_pods == "Refuse"
    assert config.from_env({"CKPTDRAIN_UNSELECTED_PODS": "Flag"}).unselected_pods == "Flag"
    with pytest.raises(InvalidInput) as caught:
        config.from_env({"CKPTDRAIN_UNSELECTED_PODS": "flag"})  # the values are exact
    assert caught.value.field == "CKPTDRAIN_UNSELECTED_PODS"
    assert str(caught.value) == ("CKPTDRAIN_UNSELECTED_PODS: expected Refuse or Flag, "
                                 "got 'flag'")
