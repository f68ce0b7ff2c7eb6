"""What the policy adds to a pod for a local tier that never fills the node
and a restore that does not fail it: quantities the apiserver accepts, a
sized work dir, node placement, restore's retry deadline and skip switch."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain import units
from ckptdrain.contract.env import Env
from ckptdrain.operator import config
from ckptdrain.operator.admission import injection, pod_env, work_dir
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
#: A Kubernetes quantity, as resource.ParseQuantity reads one (no exponent here).
QUANTITY = r"^[0-9]+(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"


def spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
        "interval": "15m", "writers": 8,
        "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
        "storage": {"uri": "s3://bucket/runs"}}
    base.update(over)
    return base


def pod(**spec_: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "trainer", "image": "t:1"}]}
    body.update(spec_)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
            "spec": body}


def inject(s: dict[str, Any], p: dict[str, Any] | None = None) -> dict[str, Any]:
    p = p or pod()
    ops = injection.build_pod_patch(p, policy.parse("ml", "p", s, CFG), CFG, default_rate=1e9)
    return jsonpatch.apply_patch(copy.deepcopy(p), ops)


def fields(s: dict[str, Any]) -> set[str]:
    return {e.field for e in policy.validate(s, CFG)}


def _volume(p: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in p["spec"]["volumes"] if v["name"] == name)


def _agent(p: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in p["spec"]["initContainers"] if c["name"] == injection.AGENT)


@pytest.mark.parametrize(("given_", "written"), [
    ("64GB", "64G"), ("64Gi", "64Gi"), ("64GiB", "64Gi"), ("64G", "64G"),
    ("12.5GB", "12500M"), ("68719476736", "64Gi")])
def test_memory_size_limit_is_written_as_a_kubernetes_quantity(given_: str, written: str) -> None:
    s = spec(localTier={"path": "/mnt/ckptdrain/nvme", "memory": {"sizeLimit": given_}})
    assert _volume(inject(s), "ckptdrain-work")["emptyDir"] == {
        "medium": "Memory", "sizeLimit": written}


@given(st.integers(min_value=0, max_value=2**53))  # parse_bytes is exact up to 8 PiB
def test_every_byte_count_formats_as_a_quantity_of_the_same_size(size: int) -> None:
    text = units.format_quantity(size)
    assert re.match(QUANTITY, text), text
    assert units.parse_bytes("q", text) == size


def test_a_reader_disk_work_dir_gets_a_size_limit_and_restore_requests_it() -> None:
    p = policy.parse("ml", "p", spec(), CFG)
    ops = injection.build_pod_patch(pod(), p, CFG, default_rate=1e9, rank=3, reader=True)
    out = jsonpatch.apply_patch(copy.deepcopy(pod()), ops)
    limit = _volume(out, "ckptdrain-work")["emptyDir"]["sizeLimit"]
    shard = 80e9 / 8
    assert units.parse_bytes("l", limit) >= work_dir.WORK_SHARDS * shard
    restore = next(c for c in out["spec"]["initContainers"] if c["name"] == injection.RESTORE)
    assert restore["resources"]["requests"]["ephemeral-storage"] == limit


def test_a_writer_on_the_node_has_no_work_emptydir_and_requests_no_ephemeral_storage() -> None:
    p = inject(spec())
    assert "ckptdrain-work" not in {v["name"] for v in p["spec"]["volumes"]}
    assert "ephemeral-storage" not in _agent(p)["resources"]["requests"]


def test_a_memory_work_dir_requests_no_ephemeral_storage() -> None:
    s = spec(localTier={"path": "/mnt/ckptdrain/nvme", "memory": {"sizeLimit": "64Gi"}})
    assert "ephemeral-storage" not in _agent(inject(s))["resources"]["requests"]


def test_capacity_and_retry_deadline_reach_the_agent_and_restore() -> None:
    s = spec(localTier={"path": "/mnt/ckptdrain/nvme", "capacity": "60Gi"},
             restore={"retryDeadline": "3m"})
    p = inject(s)
    restore = next(c for c in p["spec"]["initContainers"] if c["name"] == injection.RESTORE)
    env = {e["name"]: e for e in restore["env"]}
    assert env[Env.LOCAL_CAPACITY]["value"] == str(60 << 30)
    assert env[Env.RESTORE_RETRY_DEADLINE]["value"] == "3m"
    assert env[Env.RESTORE_MODE]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['ckptdrain.io/restore']"
    assert restore["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # The agent of a running pod never reads the annotation: a typo there
    # must not crash-loop the sidecar.
    assert Env.RESTORE_MODE not in {e["name"] for e in _agent(p)["env"]}
    assert Env.LOCAL_CAPACITY in {e["name"] for e in _agent(p)["env"]}


def test_retry_deadline_defaults_to_10m_and_0_means_one_try() -> None:
    assert policy.parse("ml", "p", spec(), CFG).restore_retry_deadline_s == 600
    assert policy.parse("ml", "p", spec(restore={"retryDeadline": "0"}), CFG) \
        .restore_retry_deadline_s == 0


@pytest.mark.parametrize(("given", "env"), [(None, "true"), (True, "true"), (False, "false")])
def test_direct_io_reaches_the_restore_and_its_config(given: bool | None, env: str) -> None:
    from ckptdrain.node import config as node_config

    s = spec(restore={} if given is None else {"directIO": given})
    p = inject(s)
    restore = next(c for c in p["spec"]["initContainers"] if c["name"] == injection.RESTORE)
    values = {e["name"]: e.get("value") for e in restore["env"]}
    assert values[Env.RESTORE_DIRECT_IO] == env
    environ = {k: v for k, v in values.items() if v is not None}
    assert node_config.load(environ=environ).restore_direct_io is (env == "true")


@pytest.mark.parametrize("bad", ["yes", 1, "sometimes"])
def test_a_bad_direct_io_is_refused_naming_the_field(bad: object) -> None:
    errors = policy.validate(spec(restore={"directIO": bad}), CFG)
    assert [e.field for e in errors] == ["spec.restore.directIO"]


@pytest.mark.parametrize("bad", ["soon", "-5m", "10 minutes", True])
def test_a_bad_retry_deadline_is_refused_naming_the_field(bad: object) -> None:
    errors = policy.validate(spec(restore={"retryDeadline": bad}), CFG)
    assert [e.field for e in errors] == ["spec.restore.retryDeadline"]
    assert "duration" in str(errors[0])


NVME = {"key": "example.com/nvme", "operator": "In", "values": ["true"]}
TAINT = {"key": "nvme", "operator": "Exists", "effect": "NoSchedule"}


def test_placement_adds_a_node_requirement_and_a_toleration() -> None:
    p = inject(spec(placement={"nodeAffinity": {"matchExpressions": [NVME]},
                               "tolerations": [TAINT]}))
    terms = p["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [NVME]}]
    assert p["spec"]["tolerations"] == [TAINT]


def test_placement_is_anded_into_every_term_the_pod_already_has() -> None:
    zone_a = {"key": "zone", "operator": "In", "values": ["a"]}
    gpu = {"key": "gpu", "operator": "Exists"}
    mine = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [zone_a]}, {"matchExpressions": [gpu]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [zone_a]}}]}
    have = pod(affinity={"nodeAffinity": mine, "podAntiAffinity": {"x": 1}},
               tolerations=[TAINT])
    p = inject(spec(placement={"nodeAffinity": {"matchExpressions": [NVME]},
                               "tolerations": [TAINT]}), have)
    node = p["spec"]["affinity"]["nodeAffinity"]
    terms = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [zone_a, NVME]}, {"matchExpressions": [gpu, NVME]}]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == \
        mine["preferredDuringSchedulingIgnoredDuringExecution"]
    assert p["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}
    assert p["spec"]["tolerations"] == [TAINT]  # not added twice


def test_an_empty_term_of_the_pod_stays_empty_and_matches_no_node() -> None:
    # The scheduler reads an empty node-selector term as matching no node:
    # the pod below may run only where gpu exists, with the policy's nvme too.
    gpu = {"key": "gpu", "operator": "Exists"}
    mine = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {}, {"matchExpressions": [gpu]}, {"matchExpressions": [], "matchFields": []}]}}
    p = inject(spec(placement={"nodeAffinity": {"matchExpressions": [NVME]}}),
               pod(affinity={"nodeAffinity": mine}))
    terms = p["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{}, {"matchExpressions": [gpu, NVME]},
                     {"matchExpressions": [], "matchFields": []}]


def test_no_placement_changes_no_affinity() -> None:
    p = inject(spec())
    assert "affinity" not in p["spec"] and "tolerations" not in p["spec"]


@pytest.mark.parametrize(("placement", "field"), [
    ({"nodeAffinity": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
     "spec.placement.nodeAffinity.matchExpressions[0].values"),
    ({"nodeAffinity": {"matchExpressions": [{"key": "a", "operator": "Exists",
                                              "values": ["x"]}]}},
     "spec.placement.nodeAffinity.matchExpressions[0].values"),
    ({"nodeAffinity": {"matchExpressions": [{"key": "a", "operator": "Gt",
                                              "values": ["many"]}]}},
     "spec.placement.nodeAffinity.matchExpressions[0].values"),
    ({"nodeAffinity": {"matchExpressions": [{"key": "bad key!", "operator": "Exists"}]}},
     "spec.placement.nodeAffinity.matchExpressions[0].key"),
    ({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]},
     "spec.placement.tolerations[0].value"),
    ({"tolerations": [{"key": "a", "tolerationSeconds": 5, "effect": "NoSchedule"}]},
     "spec.placement.tolerations[0].tolerationSeconds"),
])
def test_bad_placement_is_refused_naming_the_field(placement: dict[str, Any],
                                                  field: str) -> None:
    assert fields(spec(placement=placement)) == {field}


def test_what_is_injected_the_node_side_reads_back() -> None:
    from ckptdrain.node import config as node_config

    s = spec(localTier={"path": "/mnt/ckptdrain/nvme", "capacity": "60Gi"},
             restore={"retryDeadline": "90s"})
    env = pod_env.agent_env(pod(), policy.parse("ml", "p", s, CFG), 1e9, rank=0)
    environ = {e["name"]: e["value"] for e in env if "value" in e}
    cfg = node_config.load(environ={**environ, Env.RESTORE_MODE.value: ""})
    assert (cfg.local_capacity, cfg.restore_retry_deadline_s, cfg.restore_skip) == (
        60 << 30, 90.0, False)
    assert node_config.load(environ={**environ, Env.RESTORE_MODE.value: "skip"}).restore_skip
    no_retry = spec(restore={"retryDeadline": "0"})
    env = pod_env.agent_env(pod(), policy.parse("ml", "p", no_retry, CFG), 1e9, rank=0)
    environ = {e["name"]: e["value"] for e in env if "value" in e}
    assert node_config.load(environ=environ).restore_retry_deadline_s == 0


def _node(op: str, values: list[str] | None = None, key: str = "example.com/gpus") -> Any:
    expr: dict[str, Any] = {"key": key, "operator": op}
    if values is not None:
        expr["values"] = values
    return {"nodeAffinity": {"matchExpressions": [expr]}}


EXPR = "spec.placement.nodeAffinity.matchExpressions[0]"


# What the apiserver refuses in a pod's node affinity and tolerations (checked
# against kube-apiserver v1.33), or the scheduler cannot read (a Gt/Lt value
# beyond int64): every injected pod of such a policy would fail.
@pytest.mark.parametrize(("placement", "field"), [
    (_node("Gt", ["-3"]), f"{EXPR}.values"),
    (_node("Lt", ["--3"]), f"{EXPR}.values"),
    (_node("Gt", ["+3"]), f"{EXPR}.values"),
    (_node("Gt", ["1" * 19]), f"{EXPR}.values"),
    (_node("Gt", ["1" * 25]), f"{EXPR}.values"),
    (_node("Exists", key="a..b/rank"), f"{EXPR}.key"),
    (_node("Exists", key="a-.b/x"), f"{EXPR}.key"),
    (_node("Exists", key="nvme\n"), f"{EXPR}.key"),
    (_node("In", ["ok", "bad value"]), f"{EXPR}.values[1]"),
    (_node("NotIn", ["x" * 64]), f"{EXPR}.values[0]"),
    ({"tolerations": [{"operator": "Equal", "value": "x"}]},
     "spec.placement.tolerations[0].operator"),
    ({"tolerations": [{"key": "", "effect": "NoSchedule"}]},
     "spec.placement.tolerations[0].operator"),
    ({"tolerations": [{"key": "a..b/nvme", "operator": "Exists"}]},
     "spec.placement.tolerations[0].key"),
    ({"tolerations": [{"key": "nvme", "value": "bad value"}]},
     "spec.placement.tolerations[0].value"),
    ({"tolerations": [{"key": "nvme", "value": "x" * 64}]},
     "spec.placement.tolerations[0].value"),
    ({"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(1001)]},
     "spec.placement.tolerations"),
])
def test_placement_a_pod_could_not_carry_is_refused(placement: dict[str, Any],
                                                    field: str) -> None:
    assert fields(spec(placement=placement)) == {field}


@pytest.mark.parametrize("placement", [
    _node("Gt", ["3"]), _node("Lt", ["0"]), _node("Gt", ["9" * 18]), _node("Gt", ["03"]),
    _node("In", [f"node-{i}" for i in range(200)], key="kubernetes.io/hostname"),
    _node("In", ["v" * 63]), _node("Exists", key="a" * 253 + "/" + "n" * 63),
    {"nodeAffinity": {"matchExpressions": [_node("Exists", key=f"k{i}")["nodeAffinity"][
        "matchExpressions"][0] for i in range(1000)]}},
    {"tolerations": [{"operator": "Exists"}]},
    {"tolerations": [{"key": "nvme", "value": "v" * 63, "effect": "NoSchedule"}]},
    {"tolerations": [{"key": "nvme", "operator": "Equal"}]},
    {"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(100)]},
])
def test_placement_a_pod_can_carry_is_accepted(placement: dict[str, Any]) -> None:
    assert fields(spec(placement=placement)) == set()
