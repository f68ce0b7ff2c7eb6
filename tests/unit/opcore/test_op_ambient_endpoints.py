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
    "https://s3.amazonaws.com",
    "https://s3-fips.us-gov-west-1.amazonaws.com",
    "https://s3.dualstack.eu-central-1.amazonaws.com",
    "https://s3-fips.dualstack.us-east-2.amazonaws.com",
    "https://s3-us-west-2.amazonaws.com",
    "https://s3-external-1.amazonaws.com",
    "https://s3-accelerate.amazonaws.com",
    "https://bucket.vpce-0a1b-2c3d.s3.us-east-1.vpce.amazonaws.com",
    "https://vpce-0a1b-2c3d.s3.us-east-1.vpce.amazonaws.com",
    "https://s3.cn-north-1.amazonaws.com.cn",
    "https://s3.us-east-1.amazonaws.com:443",
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
    # Hosts under amazonaws.com that a tenant can own.
    "https://abc123.execute-api.us-east-1.amazonaws.com",
    "https://my-lb-1234.us-east-1.elb.amazonaws.com",
    "https://s3-1234567.us-east-1.elb.amazonaws.com",
    "https://ec2-3-3-3-3.compute-1.amazonaws.com",
    "https://search-x.us-east-1.es.amazonaws.com",
    # Someone else's bucket in the host: path-style writes would land there.
    "https://attackerbucket.s3.us-east-1.amazonaws.com",
    "https://s3.s3.us-east-1.amazonaws.com",
    "https://s3.us-west-2.amazonaws.com:8443",
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


def test_a_private_ca_goes_only_with_a_listed_endpoint_or_a_secret() -> None:
    """S3's certificates are public: a tenant's CA would let another host pose as it."""
    def with_ca(endpoint: str, secret: bool = False) -> list[str]:
        s = spec(endpoint, secret)
        s["storage"]["caBundle"] = {"configMapKeyRef": {"name": "ca", "key": "ca.crt"}}
        return [e.field for e in policy.validate(s, CFG)]

    assert with_ca("https://s3.us-west-2.amazonaws.com") == ["spec.storage.caBundle"]
    assert with_ca("https://minio.storage.svc:9000") == []
    assert with_ca("https://s3.us-west-2.amazonaws.com", secret=True) == []


def test_by_default_only_aws_endpoints_take_the_pods_identity() -> None:
    default = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
    assert [e.field for e in policy.validate(spec("https://minio.storage.svc:9000"),
                                               default)] == ["spec.storage.endpoint"]
    assert policy.validate(spec("https://s3.eu-west-1.amazonaws.com"), default) == []


@pytest.mark.parametrize("text", ["minio:9000", "https://user:pw@minio", "ftp://x",
                                  "https://*.example", "https://*.", "https://*.10.0.0.1"])
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


def test_a_secret_with_empty_keys_never_falls_back_to_the_pods_identity() -> None:
    """botocore skips empty keys and goes on down its chain (IRSA, the
    instance profile): the policy's endpoint would then get the pod's identity."""
    from ckptdrain.store import explicit_keys, open_store

    irsa = {"AWS_ROLE_ARN": "arn:aws:iam::1:role/platform",
            "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/token"}
    for empty in ({"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""},
                  {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": " "},
                  {"AWS_ACCESS_KEY_ID": "AKIA"}):
        with pytest.raises(InvalidInput) as error:
            open_store("s3://ckpt-bucket/p", endpoint_url="https://collector.example",
                       environ={**irsa, **empty})
        assert error.value.field in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        assert "AKIA" not in str(error.value)
    assert explicit_keys(irsa) == (None, None, None)  # no keys: the chain, as before
    assert explicit_keys({"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s",
                          "AWS_SESSION_TOKEN": "t"}) == ("AKIA", "s", "t")
    store = open_store("s3://ckpt-bucket/p", endpoint_url="https://minio.corp:9000",
                       environ={"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s"})
    credentials = store._client._request_signer._credentials  # what every request signs with
    assert (credentials.access_key, credentials.secret_key) == ("AKIA", "s")
