"""operator/policy/spec.py: spec → sizing input, and every refusal names its field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptdrain.operator import config
from ckptdrain.operator.policy import spec as policy
from ckptdrain.operator.policy.identity import Rule

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")


def spec(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "t"}},
        "model": {"parameters": "405B"}, "interval": "15m", "overlap": "10%",
        "localTier": {"path": "/mnt/ckptdrain/nvme"},
        "storage": {"uri": "s3://bucket/prefix", "credentialsSecretRef": {"name": "creds"}},
    }
    body.update(over)
    return body


def fields(s: dict[str, Any], cfg: config.OperatorConfig = CFG) -> set[str]:
    return {e.field for e in policy.validate(s, cfg)}


def test_the_405B_example_needs_63_GBps() -> None:
    p = policy.parse("ns", "llama", spec(), CFG)
    assert policy.compute_sizing(p).required_bandwidth == pytest.approx(63e9)
    assert p.node_path() == "/mnt/ckptdrain/nvme/ns/llama"
    assert p.credentials == policy.SecretRef("creds")


def test_global_every_multiplies_the_interval() -> None:
    p = policy.parse("ns", "n", spec(globalEvery=4), CFG)
    assert policy.compute_sizing(p).required_bandwidth == pytest.approx(63e9 / 4)


def test_mtti_alone_gives_a_tenth_as_interval() -> None:
    s = spec(mtti="150m")
    del s["interval"]
    assert policy.parse("ns", "n", s, CFG).interval_s == 900


def test_cluster_cap_from_config_binds() -> None:
    cfg = config.OperatorConfig(cluster_bandwidth=30e9)
    sized = policy.compute_sizing(policy.parse("ns", "n", spec(), cfg))
    assert sized.binding_cap == "cluster" and sized.allowed_bandwidth == 30e9


def test_a_valid_spec_has_no_errors() -> None:
    assert policy.validate(spec(), CFG) == []


@pytest.mark.parametrize(("override", "field"), [
    ({"overlap": "150%"}, "spec.overlap"),
    ({"overlap": "0"}, "spec.overlap"),
    ({"interval": "0s"}, "spec.interval"),
    ({"interval": "soon"}, "spec.interval"),
    ({"localTier": {"path": "/etc"}}, "spec.localTier.path"),
    ({"localTier": {"path": "/mnt/ckptdrain-evil/x"}}, "spec.localTier.path"),
    ({"localTier": {"path": "/mnt/ckptdrain/../etc"}}, "spec.localTier.path"),
    ({"localTier": {"path": "relative/path"}}, "spec.localTier.path"),
    ({"storage": {"uri": "ftp://host/x"}}, "spec.storage.uri"),
    ({"storage": {"uri": "s3://"}}, "spec.storage.uri"),
    ({"storage": {"uri": "s3://Bad_Bucket/x"}}, "spec.storage.uri"),
    ({"caps": {"bandwidth": "1GB/s", "perDrainer": "2GB/s"}}, "spec.caps.perDrainer"),
    ({"caps": {"bandwidth": "0GB/s"}}, "spec.caps.bandwidth"),
    ({"model": {}}, "spec.model"),
    ({"model": {"parameters": "-5B"}}, "spec.model.parameters"),
    ({"model": {"parameters": "405B", "bytesPerParameter": 0}}, "spec.model.bytesPerParameter"),
    ({"globalEvery": 0}, "spec.globalEvery"),
    ({"gracePolicy": "Sometimes"}, "spec.gracePolicy"),
    ({"restore": {"prefer": "tape"}}, "spec.restore.prefer"),
    ({"selector": None}, "spec.selector"),
    ({"storage": {"uri": "s3://bucket/x", "endpoint": "minio:9000"}}, "spec.storage.endpoint"),
    ({"storage": {"uri": "s3://bucket/x", "endpoint": "http://bad_host:9000"}},
     "spec.storage.endpoint"),
])
def test_each_refusal_names_its_field(override: dict[str, Any], field: str) -> None:
    assert field in fields(spec(**override))


def test_local_tier_must_hold_keep_plus_one_shards() -> None:
    # 5.67 TB over 4 writers = 1.4175 TB a shard; keep 2 + 1 in flight = 4.2525 TB,
    # said as 4.26 TB (4.25 TB would be refused).
    # The work dir on the same disk does not raise the minimum: a policy stored
    # with it must stay readable (its pods injected) after an upgrade.
    tier = {"path": "/mnt/ckptdrain/x", "keep": 2}
    ok = spec(writers=4, localTier={**tier, "capacity": "4.3TB"})
    small = spec(writers=4, localTier={**tier, "capacity": "4.2TB"})
    assert policy.validate(ok, CFG) == []
    errors = policy.validate(small, CFG)
    assert [e.field for e in errors] == ["spec.localTier.capacity"]
    assert "at least 4.26 TB" in errors[0].expected


def test_with_a_memory_tier_the_local_tier_holds_only_its_steps() -> None:
    memory = {"path": "/mnt/ckptdrain/x", "keep": 2, "memory": {"sizeLimit": "1.5TB"}}
    assert policy.validate(spec(writers=4, localTier={**memory, "capacity": "4.3TB"}), CFG) == []
    errors = policy.validate(spec(writers=4, localTier={**memory, "capacity": "4.2TB"}), CFG)
    assert [e.field for e in errors] == ["spec.localTier.capacity"]
    assert "4.26 TB" in errors[0].expected and "work dir" not in errors[0].expected


def test_memory_tier_must_hold_one_shard() -> None:
    s = spec(writers=64, localTier={"path": "/mnt/ckptdrain/x", "memory": {"sizeLimit": "64Gi"}})
    assert "spec.localTier.memory.sizeLimit" in fields(s)  # 88.6 GB a shard > 68.7 GB
    s["writers"] = 128
    assert fields(s) == set()


def test_parse_raises_with_every_error() -> None:
    with pytest.raises(policy.PolicyInvalid) as caught:
        policy.parse("ns", "n", spec(overlap="200%", interval="0"), CFG)
    assert {e.field for e in caught.value.errors} == {"spec.overlap", "spec.interval"}
    assert "spec.overlap" in str(caught.value) and "spec.interval" in str(caught.value)


@given(st.dictionaries(st.sampled_from(["overlap", "interval", "mtti", "globalEvery", "writers",
                                        "model", "localTier", "storage", "caps"]),
                       st.one_of(st.none(), st.text(max_size=8), st.integers(-5, 5),
                                 st.floats(allow_nan=True), st.dictionaries(
                                     st.text(max_size=5), st.text(max_size=5), max_size=2))))
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_arbitrary_specs_never_crash_and_errors_name_spec_fields(junk: dict[str, Any]) -> None:
    for error in policy.validate(spec(**junk), CFG):
        assert error.field.startswith("spec.")


@given(st.dictionaries(st.sampled_from("abc"), st.sampled_from("xyz"), max_size=3),
       st.dictionaries(st.sampled_from("abc"), st.sampled_from("xyz"), max_size=3))
def test_match_labels_is_a_subset_test(want: dict[str, str], have: dict[str, str]) -> None:
    expected = all(have.get(k) == v for k, v in want.items())
    assert policy.selector_matches({"matchLabels": want}, have) is expected


def test_match_expressions() -> None:
    sel = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]},
                                {"key": "skip", "operator": "DoesNotExist"}]}
    assert policy.selector_matches(sel, {"app": "a"})
    assert not policy.selector_matches(sel, {"app": "c"})
    assert not policy.selector_matches(sel, {"app": "a", "skip": "1"})


def test_an_endpoint_with_a_password_is_refused_without_showing_it() -> None:
    body = spec(storage={"uri": "s3://bucket/x", "endpoint": "http://u:Canary-9f@minio:9000"})
    errors = [str(e) for e in policy.validate(body, CFG)]
    assert any("spec.storage.endpoint" in e for e in errors)
    assert not any("Canary-9f" in e for e in errors)


@pytest.mark.parametrize("uri", [
    "s3://bucket/prefix", "s3://my.bucket-2", "file:///mnt/shared/ckpt",
    "s3://Bad_Bucket/x", "s3://192.168.1.1/x", "s3://bucket:9000/x", "s3a://bucket/x",
    "file://relative/x", "s3://bucket/a/../b", "s3://bucket/x?versionId=1", "gs://bucket",
    "s3://user:secret-pw@bucket/x",
])
def test_the_webhook_and_the_cli_accept_the_same_store_uris(uri: str) -> None:
    from ckptdrain.errors import InvalidInput
    from ckptdrain.store import parse_store_uri

    try:
        parse_store_uri(uri)
        cli_error = None
    except InvalidInput as error:
        cli_error = error
    errors = [e for e in policy.validate(spec(storage={"uri": uri}), CFG)
              if e.field == "spec.storage.uri"]
    if cli_error is None:
        assert errors == []
    else:
        assert len(errors) == 1 and errors[0].expected == cli_error.expected
        assert "secret-pw" not in str(errors[0])


def test_identity_names_exactly_one_valid_key() -> None:
    assert policy.parse("ml", "x", spec(identity={"rankLabel": "example.com/rank"}),
                        CFG).identity == Rule(label="example.com/rank")
    assert policy.parse("ml", "x", spec(identity={"rankAnnotation": "rank"}),
                        CFG).identity == Rule(annotation="rank")
    assert policy.parse("ml", "x", spec(), CFG).identity is None
    both = {"rankLabel": "a", "rankAnnotation": "b"}
    errors = policy.validate(spec(identity=both), CFG)
    assert [e.field for e in errors] == ["spec.identity"]
    assert "one of rankLabel or rankAnnotation" in str(errors[0])
    assert fields(spec(identity={})) == {"spec.identity"}
    assert fields(spec(identity={"rankLabel": "bad key!"})) == {"spec.identity.rankLabel"}


@pytest.mark.parametrize("key", [
    "a..b/rank", "a-.b/rank", "-a.b/rank", "rank\n", "example.com/rank\n", "/rank",
    "a" * 254 + "/rank", "example.com/" + "r" * 64, "example.com/rank/x"])
def test_a_rank_key_the_apiserver_would_refuse_on_a_pod_is_refused(key: str) -> None:
    for field in ("rankLabel", "rankAnnotation"):
        errors = policy.validate(spec(identity={field: key}), CFG)
        assert [e.field for e in errors] == [f"spec.identity.{field}"]
        assert "DNS subdomain prefix" in str(errors[0])


@pytest.mark.parametrize("key", [
    "rank", "Rank_1.x", "a" * 253 + "/" + "r" * 63, "a.b-c.d/rank", "r" * 63])
def test_every_qualified_name_is_a_rank_key(key: str) -> None:
    assert policy.parse("ml", "x", spec(identity={"rankLabel": key}),
                        CFG).identity == Rule(label=key)
