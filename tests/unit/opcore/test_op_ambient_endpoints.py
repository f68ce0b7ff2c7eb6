"""spec.storage.endpoint without a credentials Secret: the pod's own
identity goes there, so only AWS's endpoints and the platform's list
(store/ambient_endpoints.py)."""

from __future__ import annotations

from typing import Any

import pytest

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.policy import spec as policy
from ckptdrain.store import ambient_endpoints

LISTED = "https://minio.storage.svc:9000, https://*.s3.corp.example, http://rgw.lab"
CFG = config.from_env({"CKPTDRAIN_ALLOWED_ROOT": "/mnt/ckptdrain",
                       "CKPTDRAIN_AMBIENT_ENDPOINTS": LISTED})


def spec(endpoint: str, secret: bool = False) -> dict[str, Any]:
    storage: dict[str, Any] = {"uri": "s3://ckpt-bucket/runs", "endpoint": endpoint}
    if secret:
        storage["credentialsSecretRef"] = {"name": "s3-creds"}
    return {"selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "7B"},
            "interval": "10m", "localTier": {"path": "/mnt/ckptdrain/nvme"},
            "storage": storage}


@pytest.mark.parametrize("endpoint", [
    "https://s3.us-west-2.amazonaws.com",
    "https://bucket.vpce-0a1b-2c3d.s3.us-east-1.vpce.amazonaws.com",
    "https://s3.cn-north-1.amazonaws.com.cn",
    "https://minio.storage.svc:9000",
    "https://MINIO.storage.svc:9000/",  # case and a trailing slash
    "https://rack1.s3.corp.example",
    "http://rgw.lab:80",
])
def test_aws_and_listed_endpoints_take_the_pods_identity(endpoint: str) -> None:
    assert policy.validate(spec(endpoint), CFG) == []


@pytest.mark.parametrize("endpoint", [
    "https://attacker.example",
    "http://s3.us-west-2.amazonaws.com",  # the session token in clear
    "https://s3.amazonaws.com.attacker.example",
    "https://amazonaws.com.evil",
    "https://minio.storage.svc",  # listed on another port
    "http://minio.storage.svc:9000",  # listed with another scheme
    "https://s3.corp.example",  # the wildcard is for hosts under it, not itself
    "https://evil-s3.corp.example",
])
def test_any_other_endpoint_without_a_secret_is_refused_naming_the_field(
        endpoint: str) -> None:
    errors = policy.validate(spec(endpoint), CFG)
    assert [e.field for e in errors] == ["spec.storage.endpoint"], errors
    assert "CKPTDRAIN_AMBIENT_ENDPOINTS" in str(errors[0])
    assert "credentialsSecretRef" in str(errors[0])
    # With the policy's own keys, it is the tenant's business where they go.
    assert policy.validate(spec(endpoint, secret=True), CFG) == []


def test_by_default_only_aws_endpoints_take_the_pods_identity() -> None:
    default = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
    assert [e.field for e in policy.validate(spec("https://minio.storage.svc:9000"),
                                               default)] == ["spec.storage.endpoint"]
    assert policy.validate(spec("https://s3.eu-west-1.amazonaws.com"), default) == []


@pytest.mark.parametrize("text", ["minio:9000", "https://user:pw@minio", "ftp://x",
                                  "https://*.example", "https://*."])
def test_a_bad_list_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(InvalidInput) as error:
        config.from_env({"CKPTDRAIN_AMBIENT_ENDPOINTS": text})
    assert error.value.field == "CKPTDRAIN_AMBIENT_ENDPOINTS"
    assert "pw" not in str(error.value)


def test_the_list_reads_origins() -> None:
    assert ambient_endpoints.parse_allowed(LISTED) == (
        ("https", "minio.storage.svc", 9000), ("https", "*.s3.corp.example", 443),
        ("http", "rgw.lab", 80))
    assert ambient_endpoints.parse_allowed(" , ") == ()
