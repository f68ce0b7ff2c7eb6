"""Injected containers' resources at their edges: what a default install
injects into a pod that is not Guaranteed (unchanged), pods with pod-level
resources, a platform max lowered under stored policies (clamped at pod
admission, never un-injected), ephemeral-storage limits, quantity text."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import pytest

from ckptdrain import sizing
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config, containers
from ckptdrain.operator.admission import injection, resources
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.policy import spec as policy
from ckptdrain.operator.policy import status

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
SPEC: dict[str, Any] = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
    "interval": "15m", "writers": 8, "localTier": {"path": "/mnt/ckptdrain/nvme"},
    "storage": {"uri": "s3://bucket/runs", "credentialsSecretRef": {"name": "creds"}},
}
EQUAL = {"cpu": "4", "memory": "16Gi"}


def pod(resources_: dict[str, Any], pod_level: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c0", "image": "t:1",
                                            "resources": resources_}]}
    if pod_level is not None:
        spec["resources"] = pod_level
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
            "spec": spec}


def inject(body: dict[str, Any], p: policy.Policy, cfg: config.OperatorConfig = CFG,
           **kw: Any) -> dict[str, dict[str, Any]]:
    ops = injection.build_pod_patch(body, p, cfg, default_rate=1e9, rank=0, **kw)
    out = jsonpatch.apply_patch(copy.deepcopy(body), ops)
    return {c["name"]: c["resources"] for c in out["spec"]["initContainers"]}


def with_platform(raw: dict[str, Any]) -> config.OperatorConfig:
    return dataclasses.replace(CFG, containers=containers.read_platform("x", raw))


def test_a_default_install_injects_what_it_always_did_into_a_burstable_pod() -> None:
    body = pod({"requests": {"cpu": "1"}})
    p = policy.parse("ml", "p", {**SPEC, "peerTier": {"enabled": True}}, CFG)
    sidecar = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
    assert inject(body, p) == {
        "ckptdrain-prepare": {"requests": {"cpu": "10m", "memory": "32Mi"},
                              "limits": {"memory": "64Mi"}},
        "ckptdrain-peer": sidecar, "ckptdrain-restore": sidecar, "ckptdrain-agent": sidecar}
    assert inject(body, p, reader=True) == {"ckptdrain-restore": {
        "requests": {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "29362411Ki"},
        "limits": {"memory": "1Gi"}}}


@pytest.mark.parametrize("qos", ["MatchPod", "Guaranteed"])
def test_a_pod_with_pod_level_resources_gets_the_configured_shape(qos: str) -> None:
    """Its QoS class comes from the pod level; equal amounts there buy
    nothing and could pass the pod-level requests (the apiserver refuses)."""
    body = pod({"requests": {"cpu": "1", "memory": "1Gi"}},
               pod_level={"requests": EQUAL, "limits": EQUAL})
    assert resources.qos_class(body) == "Guaranteed"
    cfg = with_platform({"qos": qos})
    got = inject(body, policy.parse("ml", "p", SPEC, cfg), cfg)
    assert got["ckptdrain-agent"] == {"requests": {"cpu": "100m", "memory": "256Mi"},
                                      "limits": {"memory": "1Gi"}}
    # The same containers without the pod level: equal amounts.
    del body["spec"]["resources"]
    body["spec"]["containers"][0]["resources"] = {"requests": EQUAL, "limits": EQUAL}
    assert inject(body, policy.parse("ml", "p", SPEC, cfg), cfg)["ckptdrain-agent"] == {
        "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def test_a_guaranteed_pod_with_hugepages_stays_guaranteed() -> None:
    amounts = {**EQUAL, "hugepages-2Mi": "2Gi"}
    body = pod({"requests": amounts, "limits": amounts})
    ops = injection.build_pod_patch(body, policy.parse("ml", "p", SPEC, CFG), CFG,
                                    default_rate=1e9, rank=0)
    assert resources.qos_class(jsonpatch.apply_patch(copy.deepcopy(body), ops)) == "Guaranteed"


RAISED = {"agent": {"max": {"cpu": "8", "memory": "8Gi"}}}
GREEDY = {**SPEC, "resources": {"agent": {"requests": {"cpu": "4"}, "limits": {"cpu": "6"},
                                          "guaranteed": {"cpu": "5"}}}}


def test_a_policy_above_the_max_is_refused_at_its_own_admission() -> None:
    problems = policy.validate(GREEDY, with_platform({"agent": {"max": {"cpu": "2"}}}))
    assert {e.field for e in problems} == {"spec.resources.agent.requests.cpu",
                                           "spec.resources.agent.limits.cpu",
                                           "spec.resources.agent.guaranteed.cpu"}
    assert policy.validate(GREEDY, with_platform(RAISED)) == []


def test_a_max_lowered_under_a_stored_policy_clamps_and_warns_at_pod_admission() -> None:
    lowered = with_platform({"agent": {"max": {"cpu": "2"}}})
    p = policy.parse("ml", "p", GREEDY, lowered)
    assert p.resource_notes == (
        "spec.resources.agent.requests.cpu: 4 is above the platform's max (2); 2 is used",
        "spec.resources.agent.limits.cpu: 6 is above the platform's max (2); 2 is used",
        "spec.resources.agent.guaranteed.cpu: 5 is above the platform's max (2); 2 is used")
    assert inject(pod({}), p, lowered)["ckptdrain-agent"] == {
        "requests": {"cpu": "2", "memory": "256Mi"}, "limits": {"memory": "1Gi", "cpu": "2"}}
    assert inject(pod({"limits": EQUAL}), p, lowered)["ckptdrain-agent"] == {
        "requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "1Gi", "cpu": "2"}}
    assert policy.parse("ml", "p", GREEDY, with_platform(RAISED)).resource_notes == ()


def test_a_qos_change_falls_back_to_the_platforms_guaranteed_amount_at_pod_admission(
        ) -> None:
    """Admitted under Burstable with guaranteed.cpu 0; the platform then
    moves to MatchPod: refused at the policy's own admission, but its pods
    get the platform's amount, with a warning, rather than no pods at all."""
    spec = {**SPEC, "writers": 1, "resources": {"agent": {"guaranteed": {"cpu": "0"}}}}
    assert policy.validate(spec, with_platform({"qos": "Burstable"})) == []
    matchpod = with_platform({"qos": "MatchPod"})
    assert [e.field for e in policy.validate(spec, matchpod)] \
        == ["spec.resources.agent.guaranteed.cpu"]
    note = ("spec.resources.agent.guaranteed.cpu: 0 is not above 0, which qos MatchPod "
            "needs; the platform's 1 is used")
    p = policy.parse("ml", "p", spec, matchpod)
    assert p.resource_notes == (note,)
    body = pod({"requests": EQUAL, "limits": EQUAL})
    assert inject(body, p, matchpod)["ckptdrain-agent"]["requests"]["cpu"] == "1"
    body["spec"]["terminationGracePeriodSeconds"] = 3600
    ops, warnings = _admit(body, spec, matchpod)
    assert any(op["path"] == "/spec/initContainers" for op in ops)
    assert f"ckptdrain: policy p: {note}" in warnings


def test_a_platform_request_raised_over_a_policys_limit_raises_the_limit() -> None:
    spec = {**SPEC, "resources": {"restore": {"limits": {"memory": "512Mi"}}}}
    assert policy.validate(spec, CFG) == []
    raised = with_platform({"restore": {"requests": {"cpu": "100m", "memory": "1Gi"}}})
    p = policy.parse("ml", "p", spec, raised)
    assert p.resource_notes == ("spec.resources.restore.limits.memory: 512Mi is below the "
                                "request (1Gi); 1Gi is used",)
    assert inject(pod({}), p, raised)["ckptdrain-restore"]["limits"] == {"memory": "1Gi"}


def _admit(body: dict[str, Any], spec: dict[str, Any],
           cfg: config.OperatorConfig) -> tuple[list[dict[str, Any]], list[str]]:
    warnings: list[str] = []
    candidates = [{"metadata": {"name": "p", "namespace": "ml", "uid": "u"}, "spec": spec}]
    ops = asyncio.run(admission.admit_pod(body, "ml", cfg, warnings, logging.getLogger("t"),
                                          candidates, lambda name: lambda rank: [],
                                          every=candidates))
    return ops, warnings


def test_the_pod_is_injected_with_a_warning_naming_the_clamped_field() -> None:
    body = pod({})
    body["spec"]["terminationGracePeriodSeconds"] = 3600
    one_writer = {**GREEDY, "writers": 1}  # no workload to find a rank in
    ops, warnings = _admit(body, one_writer, with_platform({"agent": {"max": {"cpu": "2"}}}))
    assert any(op["path"] == "/spec/initContainers" for op in ops)
    assert "ckptdrain: policy p: spec.resources.agent.requests.cpu: 4 is above the " \
           "platform's max (2); 2 is used" in warnings


def test_the_policy_status_says_its_amounts_were_clamped() -> None:
    s = sizing.compute(policy.parse("ml", "p", SPEC, CFG).sizing_input)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    note = "spec.resources.agent.requests.cpu: 4 is above the platform's max (2); 2 is used"
    clamped = status.for_sizing(s, 1, now, resource_notes=(note,))
    adjusted = _condition(clamped, "ResourcesAdjusted")
    assert (adjusted["status"], adjusted["reason"], adjusted["message"]) \
        == ("True", "ResourcesClamped", note)
    # Degraded is the stall watchdog's (its alert's runbook is about drains).
    assert _condition(clamped, "Degraded")["status"] == "False"
    assert _condition(status.for_sizing(s, 1, now), "ResourcesAdjusted")["status"] == "False"


def test_a_clamp_and_a_stall_do_not_erase_each_other() -> None:
    s = sizing.compute(policy.parse("ml", "p", SPEC, CFG).sizing_input)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    note = "spec.resources.agent.requests.cpu: 4 is above the platform's max (2); 2 is used"
    clamped = status.for_sizing(s, 1, now, resource_notes=(note,))
    stall = status.with_stall(clamped, "no checkpoint for 1h", 1, now)
    assert stall is not None and stall["phase"] == "Stalled"
    assert _condition(stall, "ResourcesAdjusted")["message"] == note  # the stall kept it
    resized = status.for_sizing(s, 1, now, stall["conditions"], resource_notes=(note,))
    assert _condition(resized, "Degraded")["reason"] == "DrainStalled"  # sizing kept it
    assert resized["phase"] == "Stalled"
    healed = status.with_stall(resized, None, 1, now)
    assert healed is not None and _condition(healed, "ResourcesAdjusted")["status"] == "True"


def _condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == kind)


@pytest.mark.parametrize("raw", [{"peer": {"limits": {"ephemeral-storage": "1Gi"}}},
                                 {"restore": {"limits": {"memory": "1Gi",
                                                         "ephemeral-storage": "8Gi"}}}])
def test_an_ephemeral_storage_limit_is_refused_saying_why(raw: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput, match="caps the training pod's disk"):
        containers.read_platform("CKPTDRAIN_CONTAINERS", raw)
    problems = policy.validate({**SPEC, "resources": raw}, CFG)
    assert [e.field.rsplit(".", 1)[1] for e in problems] == ["ephemeral-storage"]
    assert "the kubelet adds the containers' ephemeral-storage limits" in problems[0].expected


def test_quantity_text_is_written_stripped_and_whole_numbers_as_digits() -> None:
    cfg = with_platform({"agent": {"requests": {"cpu": " 100m ", "memory": 268435456}}})
    assert cfg.containers.agent.requests == {"cpu": "100m", "memory": "268435456"}
    p = policy.parse("ml", "p", {**SPEC, "resources": {"restore": {"requests": {
        "cpu": "\t200m"}}}}, CFG)
    assert inject(pod({}), p)["ckptdrain-restore"]["requests"]["cpu"] == "200m"


@pytest.mark.parametrize("value", [0.5, 1e22, True, -1, "1e22"])
def test_a_quantity_that_is_no_text_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidInput) as raised:
        containers.read_platform("CKPTDRAIN_CONTAINERS", {"agent": {"limits": {"cpu": value}}})
    assert str(raised.value).startswith("CKPTDRAIN_CONTAINERS.agent.limits.cpu: expected a "
                                        "Kubernetes quantity")


def test_a_block_given_in_part_keeps_the_other_keys_defaults() -> None:
    got = config.from_env({"CKPTDRAIN_CONTAINERS": '{"agent": {"requests": {"cpu": "1"}}}'})
    default = containers.DEFAULT_CONTAINERS.agent
    assert got.containers.agent == containers.Resources(
        requests={"cpu": "1"}, limits=default.limits, guaranteed=default.guaranteed,
        max=default.max)
    # The max still holds policies.
    assert [e.field for e in policy.validate(
        {**SPEC, "resources": {"agent": {"requests": {"cpu": "3"}}}}, got)] \
        == ["spec.resources.agent.requests.cpu"]
