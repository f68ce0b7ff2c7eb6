"""Injected containers' resources (operator/containers.py, admission/resources.py):
the pod's QoS class computed as the kubelet does, MatchPod keeping a Guaranteed
pod Guaranteed after injection, today's shape otherwise, and the platform's
block and a policy's overrides checked field by field."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config, containers
from ckptdrain.operator.admission import injection, resources
from ckptdrain.operator.policy import spec as policy
from ckptdrain.quantity import parse_quantity

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
SPEC: dict[str, Any] = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
    "interval": "15m", "writers": 8, "localTier": {"path": "/mnt/ckptdrain/nvme"},
    "storage": {"uri": "s3://bucket/runs", "credentialsSecretRef": {"name": "creds"}},
}
#: What every injected pod got before the resources were configurable.
TODAY_SIDECAR = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
TODAY_PREPARE = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
EQUAL = {"cpu": "4", "memory": "16Gi"}


def res(requests: dict[str, str] | None = None,
        limits: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if requests is not None:
        out["requests"] = requests
    if limits is not None:
        out["limits"] = limits
    return out


def pod(*containers_: dict[str, Any], init: list[dict[str, Any]] | None = None,
        pod_level: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [
        {"name": f"c{i}", "image": "t:1", "resources": r} for i, r in enumerate(containers_)]}
    if init is not None:
        spec["initContainers"] = init
    if pod_level is not None:
        spec["resources"] = pod_level
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
            "spec": spec}


QOS_TABLE = {
    "nothing": (pod({}), "BestEffort"),
    "zero requests count as none": (pod(res({"cpu": "0", "memory": "0"})), "BestEffort"),
    "only ephemeral-storage": (pod(res({"ephemeral-storage": "1Gi"})), "BestEffort"),
    "requests only": (pod(res({"cpu": "1"})), "Burstable"),
    "limits equal requests": (pod(res(EQUAL, EQUAL)), "Guaranteed"),
    "limits only (requests default to them)": (pod(res(None, EQUAL)), "Guaranteed"),
    "same amount, other notation": (pod(res({"cpu": "1000m", "memory": "1Gi"},
                                            {"cpu": "1", "memory": "1073741824"})),
                                    "Guaranteed"),
    "memory limit only": (pod(res({"cpu": "1", "memory": "1Gi"}, {"memory": "1Gi"})),
                          "Burstable"),
    "request below limit": (pod(res({"cpu": "1", "memory": "1Gi"},
                                    {"cpu": "2", "memory": "1Gi"})), "Burstable"),
    "one container without limits": (pod(res(EQUAL, EQUAL), {}), "Burstable"),
    # The kubelet compares sums over the containers: each equal, amounts apart.
    "containers equal, each its own amounts": (
        pod(res({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}),
            res(None, {"cpu": "500m", "memory": "4Gi"})), "Guaranteed"),
    # A request of 0 is not counted, its limit is: the sums differ.
    "a cpu request of 0 under a limit": (
        pod(res({"cpu": "0", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"})), "Burstable"),
    "hugepages beside equal cpu and memory": (
        pod(res({**EQUAL, "hugepages-2Mi": "1Gi"}, {**EQUAL, "hugepages-2Mi": "1Gi"})),
        "Guaranteed"),
    "a plain init container without resources": (
        pod(res(EQUAL, EQUAL), init=[{"name": "i", "image": "x"}]), "Burstable"),
    "an init container with equal amounts": (
        pod(res(EQUAL, EQUAL), init=[{"name": "i", "image": "x",
                                      "resources": res({"cpu": "1", "memory": "1Gi"},
                                                       {"cpu": "1", "memory": "1Gi"})}]),
        "Guaranteed"),
    "a sidecar with a request only": (
        pod(res(EQUAL, EQUAL), init=[{"name": "s", "image": "x", "restartPolicy": "Always",
                                      "resources": res({"cpu": "100m"})}]), "Burstable"),
    "pod-level limits decide, containers aside": (
        pod({}, pod_level=res(EQUAL, EQUAL)), "Guaranteed"),
    "pod-level memory limit only": (
        pod(res(EQUAL, EQUAL), pod_level=res(None, {"memory": "16Gi"})), "Burstable"),
    "pod-level requests below limits": (
        pod(res(EQUAL, EQUAL), pod_level=res({"cpu": "4", "memory": "16Gi"},
                                             {"cpu": "8", "memory": "16Gi"})), "Burstable"),
}


@pytest.mark.parametrize("case", sorted(QOS_TABLE))
def test_qos_class_as_the_kubelet_computes_it(case: str) -> None:
    body, expected = QOS_TABLE[case]
    assert resources.qos_class(body) == expected


def _policy(cfg: config.OperatorConfig = CFG, **extra: Any) -> policy.Policy:
    return policy.parse("ml", "p", {**SPEC, **extra}, cfg)


def _inject(body: dict[str, Any], p: policy.Policy, cfg: config.OperatorConfig = CFG,
            **kw: Any) -> dict[str, Any]:
    ops = injection.build_pod_patch(body, p, cfg, default_rate=1e9, rank=0, **kw)
    return dict(jsonpatch.apply_patch(copy.deepcopy(body), ops))


def _ours(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c["resources"] for c in body["spec"]["initContainers"]
            if c["name"].startswith("ckptdrain-")}


def _with_qos(qos: str) -> config.OperatorConfig:
    return dataclasses.replace(CFG, containers=dataclasses.replace(
        containers.DEFAULT_CONTAINERS, qos=qos))


amounts = st.sampled_from(["1", "2", "500m", "7", "1500m"])
memories = st.sampled_from(["1Gi", "512Mi", "64Gi", "1000000000"])


@st.composite
def guaranteed_pods(draw: st.DrawFn) -> dict[str, Any]:
    def equal() -> dict[str, Any]:
        amount = {"cpu": draw(amounts), "memory": draw(memories)}
        return res(amount if draw(st.booleans()) else None, amount)
    init = [{"name": f"i{i}", "image": "x", "resources": equal(),
             **({"restartPolicy": "Always"} if draw(st.booleans()) else {})}
            for i in range(draw(st.integers(0, 2)))]
    return pod(*[equal() for _ in range(draw(st.integers(1, 3)))], init=init or None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=guaranteed_pods(), peer=st.booleans(), memory_tier=st.booleans(),
       prepare=st.booleans())
def test_match_pod_keeps_a_guaranteed_pod_guaranteed(body: dict[str, Any], peer: bool,
                                                     memory_tier: bool, prepare: bool) -> None:
    assert resources.qos_class(body) == "Guaranteed"
    local = {"path": "/mnt/ckptdrain/nvme",
             **({"memory": {"sizeLimit": "64Gi"}} if memory_tier else {})}
    cfg = dataclasses.replace(CFG, prepare_local_tier=prepare)
    p = _policy(cfg, localTier=local, **({"peerTier": {"enabled": True}} if peer else {}))
    out = _inject(body, p, cfg)
    assert resources.qos_class(out) == "Guaranteed"
    names = set(_ours(out))
    assert names == {"ckptdrain-restore", "ckptdrain-agent"} | (
        {"ckptdrain-peer"} if peer else set()) | ({"ckptdrain-prepare"} if prepare else set())
    # The `guaranteed` amounts: a whole core, not the Burstable shape's 100m.
    assert _ours(out)["ckptdrain-agent"] == {"requests": {"cpu": "1", "memory": "1Gi"},
                                             "limits": {"cpu": "1", "memory": "1Gi"}}
    if prepare:
        assert _ours(out)["ckptdrain-prepare"] == {
            "requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {"cpu": "100m", "memory": "64Mi"}}


def test_a_guaranteed_reader_with_a_disk_work_dir_stays_guaranteed() -> None:
    """A reader's work dir is a disk emptyDir: its ephemeral-storage request
    (added to the platform's own) is no QoS resource."""
    cfg = dataclasses.replace(CFG, containers=containers.read_platform("x", {"restore": {
        "requests": {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "1Gi"}}}))
    out = _inject(pod(res(EQUAL, EQUAL)), _policy(cfg), cfg, reader=True)
    assert resources.qos_class(out) == "Guaranteed"
    work = next(v for v in out["spec"]["volumes"] if v["name"] == "ckptdrain-work")
    size = parse_quantity("x", work["emptyDir"]["sizeLimit"])
    restore = _ours(out)["ckptdrain-restore"]
    assert parse_quantity("x", restore["requests"]["ephemeral-storage"]) == size + 2**30
    assert restore["limits"] == {"cpu": "1", "memory": "1Gi"}


@pytest.mark.parametrize("body", [pod(res({"cpu": "1"})), pod({}), pod(res(EQUAL, EQUAL))],
                         ids=["burstable", "best-effort", "guaranteed"])
def test_burstable_mode_and_other_pods_get_todays_shape(body: dict[str, Any]) -> None:
    guaranteed = resources.qos_class(body) == "Guaranteed"
    cfg = _with_qos("Burstable") if guaranteed else CFG
    out = _inject(body, _policy(cfg, peerTier={"enabled": True}), cfg)
    assert _ours(out) == {"ckptdrain-prepare": TODAY_PREPARE, "ckptdrain-peer": TODAY_SIDECAR,
                          "ckptdrain-restore": TODAY_SIDECAR, "ckptdrain-agent": TODAY_SIDECAR}
    # What MatchPod exists for: today's shape makes a Guaranteed pod Burstable.
    assert resources.qos_class(out) == "Burstable"


def test_guaranteed_mode_sets_limits_equal_to_requests_in_every_pod() -> None:
    cfg = _with_qos("Guaranteed")
    out = _inject(pod(res({"cpu": "1"})), _policy(cfg), cfg)
    for got in _ours(out).values():
        for name in ("cpu", "memory"):
            assert got["requests"][name] == got["limits"][name], got
    assert _ours(out)["ckptdrain-prepare"]["limits"] == {"cpu": "100m", "memory": "64Mi"}


def test_policy_overrides_reach_the_injected_containers() -> None:
    p = _policy(resources={"agent": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}},
                           "restore": {"limits": {"memory": "2Gi"}}})
    got = _ours(_inject(pod({}), p))
    assert got["ckptdrain-agent"] == {"requests": {"cpu": "500m", "memory": "256Mi"},
                                      "limits": {"memory": "1Gi", "cpu": "1"}}
    assert got["ckptdrain-restore"] == {"requests": {"cpu": "100m", "memory": "256Mi"},
                                        "limits": {"memory": "2Gi"}}


@pytest.mark.parametrize(("override", "field", "expected"), [
    ({"agent": {"requests": {"cpu": "3"}}}, "spec.resources.agent.requests.cpu",
     "at most 2 (the platform's max)"),
    ({"peer": {"limits": {"memory": "9Gi"}}}, "spec.resources.peer.limits.memory",
     "at most 8Gi (the platform's max)"),
    ({"agent": {"requests": {"memory": "2Gi"}}}, "spec.resources.agent.requests.memory",
     "at most the limit (1Gi); raise spec.resources.agent.limits.memory with it"),
    ({"agent": {"limits": {"memory": "128Mi"}}}, "spec.resources.agent.limits.memory",
     "at least the request (256Mi); lower spec.resources.agent.requests.memory with it"),
    ({"agent": {"requests": {"cpu": "lots"}}}, "spec.resources.agent.requests.cpu",
     "a Kubernetes quantity"),
    ({"agent": {"requests": {"gpu": "1"}}}, "spec.resources.agent.requests.gpu",
     "one of cpu, memory, ephemeral-storage"),
    ({"trainer": {}}, "spec.resources.trainer", "one of agent, restore, peer, prepare"),
    ({"agent": {"max": {"cpu": "9"}}}, "spec.resources.agent.max", "one of requests, limits"),
    ({"agent": {"guaranteed": {"cpu": "0"}}}, "spec.resources.agent.guaranteed.cpu",
     "an amount above 0 with qos MatchPod"),
    ({"agent": {"guaranteed": {"cpu": "3"}}}, "spec.resources.agent.guaranteed.cpu",
     "at most 2 (the platform's max)"),
    ({"agent": {"guaranteed": {"ephemeral-storage": "1Gi"}}},
     "spec.resources.agent.guaranteed.ephemeral-storage", "one of cpu, memory"),
    ({"agent": {"limits": {"ephemeral-storage": "1Gi"}}},
     "spec.resources.agent.limits.ephemeral-storage", "caps the training pod's disk"),
    ({"agent": {"requests": {"cpu": 0.5}}}, "spec.resources.agent.requests.cpu",
     "a Kubernetes quantity as a string"),
    ({"agent": {"requests": {"cpu": 1e22}}}, "spec.resources.agent.requests.cpu",
     "a Kubernetes quantity as a string"),
    ({"agent": {"requests": {"cpu": "1e22"}}}, "spec.resources.agent.requests.cpu",
     "a Kubernetes quantity"),
])
def test_overrides_out_of_bounds_are_refused_naming_the_field(
        override: dict[str, Any], field: str, expected: str) -> None:
    problems = policy.validate({**SPEC, "resources": override}, CFG)
    assert [e.field for e in problems] == [field], problems
    assert expected in problems[0].expected


def test_the_platform_max_bounds_overrides() -> None:
    raised = dataclasses.replace(CFG, containers=containers.read_platform_json(
        "CKPTDRAIN_CONTAINERS", '{"agent": {"requests": {"cpu": "100m", "memory": "256Mi"}, '
        '"max": {"cpu": "8"}}}'))
    assert policy.validate({**SPEC, "resources": {"agent": {"requests": {"cpu": "3"}}}},
                           raised) == []


def test_the_platform_block_from_the_environment() -> None:
    cfg = config.from_env({"CKPTDRAIN_CONTAINERS": '{"qos": "Burstable", "restore": '
                           '{"requests": {"cpu": "1"}, "max": {"cpu": "4"}}}'})
    assert cfg.containers.qos == "Burstable"
    # Per key, as the chart merges: the default limits and guaranteed stay.
    assert cfg.containers.restore == dataclasses.replace(
        containers.DEFAULT_CONTAINERS.restore, requests={"cpu": "1"}, max={"cpu": "4"})
    assert cfg.containers.agent == containers.DEFAULT_CONTAINERS.agent  # left out: defaults
    assert config.from_env({}).containers == containers.DEFAULT_CONTAINERS


@pytest.mark.parametrize(("text", "needles"), [
    ("{agent: 1}", ["CKPTDRAIN_CONTAINERS: expected JSON"]),
    ('{"qos": "Pinned"}', ["CKPTDRAIN_CONTAINERS.qos: expected one of MatchPod, Burstable, "
                           "Guaranteed"]),
    ('{"agent": {"requests": {"cpu": "3"}, "max": {"cpu": "2"}}}',
     ["CKPTDRAIN_CONTAINERS.agent.requests.cpu: expected at most 2"]),
    ('{"agent": {"guaranteed": {"cpu": "0", "memory": "1Gi"}, "max": {"memory": "512Mi"}}}',
     ["CKPTDRAIN_CONTAINERS.agent.guaranteed.cpu: expected an amount above 0 with qos "
      "MatchPod", "CKPTDRAIN_CONTAINERS.agent.guaranteed.memory: expected at most 512Mi",
      "CKPTDRAIN_CONTAINERS.agent.limits.memory: expected at most 512Mi"]),
    ('{"peer": {"limits": {"ephemeral-storage": "10Gi"}}}',
     ["CKPTDRAIN_CONTAINERS.peer.limits.ephemeral-storage: expected no ephemeral-storage "
      "limit"]),
    ('{"agent": {"requests": {"cpu": 1e22}}}',
     ["CKPTDRAIN_CONTAINERS.agent.requests.cpu: expected a Kubernetes quantity as a string"]),
    ('{"prepare": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "1Gi"}}}',
     ["CKPTDRAIN_CONTAINERS.prepare.requests.memory: expected at most the limit (1Gi)"]),
    ('{"sidecar": {}}', ["CKPTDRAIN_CONTAINERS.sidecar: expected one of qos, agent"]),
])
def test_a_bad_platform_block_fails_at_start_naming_the_field(text: str,
                                                              needles: list[str]) -> None:
    with pytest.raises(InvalidInput) as raised:
        config.from_env({"CKPTDRAIN_CONTAINERS": text})
    for needle in needles:
        assert needle in str(raised.value)


def test_burstable_platform_needs_no_guaranteed_amounts() -> None:
    got = containers.read_platform("x", {"qos": "Burstable", "agent": {"guaranteed": {}}})
    assert got.agent.guaranteed == {}
    with pytest.raises(InvalidInput, match=r"x\.agent\.guaranteed\.cpu: expected an amount"):
        containers.read_platform("x", {"agent": {"guaranteed": {}}})


def test_a_request_added_past_a_limit_raises_the_limit() -> None:
    extra: dict[str, Any] = {"requests": {"ephemeral-storage": "1Gi"}}
    resources.add_request(extra, "ephemeral-storage", "512Mi")
    assert extra == {"requests": {"ephemeral-storage": "1536Mi"}}
    capped: dict[str, Any] = {"requests": {}, "limits": {"ephemeral-storage": "1Gi"}}
    resources.add_request(capped, "ephemeral-storage", "2Gi")
    assert capped == {"requests": {"ephemeral-storage": "2Gi"},
                      "limits": {"ephemeral-storage": "2Gi"}}


@pytest.mark.parametrize(("a", "b"), [("1Gi", "1073741824"), ("1000m", "1"), ("1e3", "1k"),
                                      ("0.5", "500m"), ("1.5Gi", "1536Mi")])
def test_quantities_compare_exactly(a: str, b: str) -> None:
    assert parse_quantity("x", a) == parse_quantity("x", b)


@pytest.mark.parametrize(("less", "more"), [("1G", "1Gi"), ("1k", "1Ki"), ("999m", "1"),
                                            ("1073741823", "1Gi"), ("1e3", "1001"),
                                            ("1n", "1u"), ("0", "1n")])
def test_quantities_that_differ_compare_apart(less: str, more: str) -> None:
    assert parse_quantity("x", less) < parse_quantity("x", more)


@pytest.mark.parametrize("text", ["-1", "1GB", "1 Gi", "1e19", "", "1.2.3", "m"])
def test_what_is_no_quantity_is_refused_naming_the_field(text: str) -> None:
    with pytest.raises(InvalidInput, match=r"^spec\.x: expected a Kubernetes quantity"):
        parse_quantity("spec.x", text)
