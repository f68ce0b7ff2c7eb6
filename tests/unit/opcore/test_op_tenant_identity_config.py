"""CKPTDRAIN_AGENT_IDENTITIES (operator/tenant_identities.py, read by
operator/config.py): each namespace's role, its token's audience and
lifetime; a bad entry stops the operator at start with one line naming the
variable, the namespace and the key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config, tenant_identities
from ckptdrain.operator.tenant_identities import WebIdentity

VAR = "CKPTDRAIN_AGENT_IDENTITIES"
ROLE_A = "arn:aws:iam::111122223333:role/ckpt-team-a"


def read(value: Any) -> tenant_identities.Identities:
    text = value if isinstance(value, str) else json.dumps(value)
    return config.from_env({VAR: text}).identities


def refusal(value: Any) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        read(value)
    return caught.value


def test_none_by_default() -> None:
    assert config.from_env({}).identities == ()
    assert read("") == read("{}") == ()


def test_each_namespace_gets_its_role_and_the_defaults() -> None:
    got = read({"team-b": {"awsRoleArn": "arn:aws-us-gov:iam::444455556666:role/ml/ckpt/b",
                           "audience": "ckptdrain.io/store", "expirationSeconds": 600},
                "team-a": {"awsRoleArn": ROLE_A}})
    assert got == (("team-a", WebIdentity(ROLE_A, "sts.amazonaws.com", 3600)),
                   ("team-b", WebIdentity("arn:aws-us-gov:iam::444455556666:role/ml/ckpt/b",
                                          "ckptdrain.io/store", 600)))
    assert tenant_identities.of(got, "team-a") == WebIdentity(ROLE_A)
    assert tenant_identities.of(got, "team-c") is None


@pytest.mark.parametrize("namespace", ["Team-A", "team_a", "-team", "a" * 64, "ns.dotted", ""])
def test_a_key_that_is_no_namespace_is_refused_naming_it(namespace: str) -> None:
    error = refusal({namespace: {"awsRoleArn": ROLE_A}})
    assert error.field == f"{VAR}[{namespace}]" and "namespace" in error.expected


@pytest.mark.parametrize("arn", [
    None,
    "",
    "ckpt-team-a",
    "arn:aws:iam::11112222333:role/ckpt",      # 11 digits
    "arn:aws:iam::111122223333:user/ckpt",     # a user, not a role
    "arn:aws:iam:us-east-1:111122223333:role/ckpt",  # IAM has no region
    "arn:aws:s3:::my-checkpoints",
    "arn:aws:iam::111122223333:role/",
    "arn:aws:iam::111122223333:role/has space",
    "arn:aws:iam::111122223333:role/" + "r" * 65,
    " " + ROLE_A,
    12,
])
def test_a_bad_role_arn_is_refused_naming_the_key(arn: Any) -> None:
    entry = {} if arn is None else {"awsRoleArn": arn}
    error = refusal({"team-a": entry})
    assert error.field == f"{VAR}[team-a].awsRoleArn", error
    assert "arn:<partition>:iam::" in error.expected


@pytest.mark.parametrize("seconds", [599, 0, -1, 2**32 + 1, "3600", 3600.5, True, None])
def test_a_bad_expiration_is_refused_naming_the_key(seconds: Any) -> None:
    error = refusal({"team-a": {"awsRoleArn": ROLE_A, "expirationSeconds": seconds}})
    assert error.field == f"{VAR}[team-a].expirationSeconds", error
    assert "600" in error.expected


@pytest.mark.parametrize("audience", ["", "two words", 7, None])
def test_a_bad_audience_is_refused_naming_the_key(audience: Any) -> None:
    error = refusal({"team-a": {"awsRoleArn": ROLE_A, "audience": audience}})
    assert error.field == f"{VAR}[team-a].audience", error


def test_a_misspelt_key_is_refused_rather_than_ignored() -> None:
    """`roleArn` left unread would leave the namespace on the pod's identity."""
    error = refusal({"team-a": {"awsRoleArn": ROLE_A, "expiration": 900}})
    assert error.field == f"{VAR}[team-a].expiration"


@pytest.mark.parametrize("value", ["team-a=arn:aws:iam::111122223333:role/x", "[1]",
                                   '{"team-a": "arn:aws:iam::111122223333:role/x"}'])
def test_anything_but_a_map_of_maps_is_refused_naming_the_variable(value: str) -> None:
    error = refusal(value)
    assert error.field.startswith(VAR) and str(error).startswith(VAR)
