"""A CheckpointClass's placement, pure: spec.nodeTier.nodeSelector and
tolerations read (each problem naming its field), and what a selected pod
gets of them: the nodeSelector merged into the pod's, the tolerations the
pod lacks added once, a pod that asks for another value of a class key
named as a conflict, and so is each term of a pod's required node
affinity when every term is ruled out on the class's nodes (anything
malformed counting as a term that may hold); the JSON patch right with and without the pod's own
nodeSelector and tolerations."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.admission import injection
from ckptdrain.operator.policy import class_placement, classes
from ckptdrain.operator.policy import spec as policy
from ckptdrain.operator.policy.class_placement import Placement, read_placement
from ckptdrain.operator.policy.fields import MAX_PLACEMENT_ITEMS

CFG = config.OperatorConfig(allowed_root="/mnt/nvme", image="ckptdrain:1.0")
NVME = {"key": "example.com/nvme", "operator": "Exists", "effect": "NoSchedule"}
DEDICATED = {"key": "dedicated", "operator": "Equal", "value": "ckpt", "effect": "NoExecute",
             "tolerationSeconds": 30}
PLACED = Placement((("example.com/pool", "nvme"), ("zone", "a")), (NVME, DEDICATED))
POLICY = policy.parse("ml", "p", {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "8GB"},
    "interval": "15m", "localTier": {"path": "/mnt/nvme/p"},
    "storage": {"uri": "s3://ckpt/ml"}}, CFG)


def read(tier: dict[str, Any]) -> tuple[Placement, list[str]]:
    problems: list[InvalidInput] = []
    placement = read_placement(tier, problems)
    return placement, [str(p) for p in problems]


# read


def test_a_placement_reads_as_written_and_none_is_anywhere() -> None:
    placement, problems = read({"root": "/mnt/nvme", "nodeSelector": {
        "zone": "a", "example.com/pool": "nvme"}, "tolerations": [NVME, DEDICATED]})
    assert problems == [] and placement == PLACED
    assert read({"root": "/mnt/nvme"}) == (class_placement.ANYWHERE, [])


@pytest.mark.parametrize(("tier", "field"), [
    ({"nodeSelector": ["pool=nvme"]}, "spec.nodeTier.nodeSelector"),
    ({"nodeSelector": {"node pool": "nvme"}}, "spec.nodeTier.nodeSelector"),
    ({"nodeSelector": {"pool": "nvme/a"}}, "spec.nodeTier.nodeSelector.pool"),
    ({"nodeSelector": {"pool": 3}}, "spec.nodeTier.nodeSelector.pool"),
    ({"nodeSelector": {f"k{i}": "v" for i in range(65)}}, "spec.nodeTier.nodeSelector"),
    ({"tolerations": {"key": "nvme"}}, "spec.nodeTier.tolerations"),
    ({"tolerations": [{"key": "nvme", "operator": "Exists", "value": "x"}]},
     "spec.nodeTier.tolerations[0].value"),
    ({"tolerations": [NVME, {"key": "nvme", "effect": "NoRun"}]},
     "spec.nodeTier.tolerations[1].effect"),
    ({"tolerations": [{"operator": "Equal", "value": "x"}]},
     "spec.nodeTier.tolerations[0].key"),
    ({"tolerations": [{"operator": "Exists"}]}, "spec.nodeTier.tolerations[0].key"),
    ({"tolerations": [NVME, {"key": "", "operator": "Exists", "effect": "NoExecute"}]},
     "spec.nodeTier.tolerations[1].key"),
    ({"tolerations": [NVME] * (MAX_PLACEMENT_ITEMS + 1)}, "spec.nodeTier.tolerations"),
    ({"tolerations": [{"key": "a b", "operator": "Exists"}]}, "spec.nodeTier.tolerations[0].key"),
])
def test_a_wrong_placement_is_named_by_its_field(tier: dict[str, Any], field: str) -> None:
    placement, problems = read(tier)
    assert placement == class_placement.ANYWHERE
    assert [p.split(": expected ")[0] for p in problems] == [field], problems


@pytest.mark.parametrize("keyless", [{"operator": "Exists"}, {"key": "", "value": "x"}])
def test_a_keyless_class_toleration_says_a_key_is_required(keyless: dict[str, Any]) -> None:
    # The chart's csiDriver.tolerations default, copied into a class, would
    # keep every training pod on cordoned and unreachable nodes.
    _, problems = read({"tolerations": [keyless]})
    assert len(problems) == 1 and "a key is required" in problems[0], problems
    assert "never be evicted" in problems[0]


def test_operator_omitted_is_equal_and_an_empty_effect_matches_every_effect() -> None:
    tolerations = [{"key": "dedicated", "value": "ckpt", "effect": ""},
                   {"key": "example.com/nvme", "operator": "Exists", "effect": ""}]
    placement, problems = read({"tolerations": tolerations})
    assert problems == [] and list(placement.tolerations) == tolerations
    assert read({"tolerations": [{"key": "dedicated", "operator": "Exists", "value": "x"}]}
                )[1] != []


def test_a_class_with_a_wrong_placement_cannot_be_used() -> None:
    read_class = classes.catalogue([{"metadata": {"name": "c"}, "spec": {"nodeTier": {
        "root": "/mnt/nvme", "nodeSelector": {"pool": "a b"}}}}])["c"]
    assert isinstance(read_class, classes.ClassInvalid)
    assert read_class.errors[0].field == "spec.nodeTier.nodeSelector.pool"


def test_the_class_placement_reaches_its_policies_resolution() -> None:
    cls = {"metadata": {"name": "c"}, "spec": {"nodeTier": {
        "root": "/mnt/nvme", "nodeSelector": {"zone": "a", "example.com/pool": "nvme"},
        "tolerations": [NVME, DEDICATED]}}}
    resolution = classes.resolve("ml", {"checkpointClassName": "c"}, CFG,
                                 classes.catalogue([cls]))
    assert resolution.resolved and resolution.placement == PLACED
    assert classes.resolve("ml", {}, CFG, classes.catalogue([cls])).placement == \
        class_placement.ANYWHERE


def _placed_policy(*requirements: dict[str, Any]) -> dict[str, Any]:
    return {"checkpointClassName": "c", "placement": {"nodeAffinity": {
        "matchExpressions": list(requirements)}}}


PLACED_CLASS = {"metadata": {"name": "c"}, "spec": {"nodeTier": {
    "root": "/mnt/nvme", "nodeSelector": {"zone": "a", "example.com/pool": "nvme"}}}}


def test_a_policy_whose_placement_no_class_node_meets_is_refused_by_the_class() -> None:
    # Its pods would be given pool=nvme and required pool In [hdd]: Pending forever.
    gpu = {"key": "gpu", "operator": "Exists"}
    resolution = classes.resolve("ml", _placed_policy(
        gpu, {"key": "example.com/pool", "operator": "In", "values": ["hdd"]},
        {"key": "zone", "operator": "NotIn", "values": ["a"]}), CFG,
        classes.catalogue([PLACED_CLASS]))
    assert resolution.reason == classes.REFUSED, resolution
    first, second = resolution.problems
    assert first.field == "spec.placement.nodeAffinity.matchExpressions[1]"
    assert "CheckpointClass c" in str(first) and "example.com/pool=nvme" in str(first)
    assert "example.com/pool In [hdd]" in str(first)
    assert second.field == "spec.placement.nodeAffinity.matchExpressions[2]"
    assert "zone=a" in str(second)


@pytest.mark.parametrize("requirements", [
    [{"key": "example.com/pool", "operator": "In", "values": ["hdd", "nvme"]}],
    [{"key": "gpu", "operator": "In", "values": ["h100"]}],
    [{"key": ["not", "a", "key"], "operator": "In", "values": ["x"]}, "junk"],
    # Malformed: the policy parser names what is wrong, not the class.
    [{"key": "example.com/pool", "operator": "In", "values": []}],
    [{"key": "zone", "operator": "DoesNotExist", "values": ["a"]}],
    [],
])
def test_a_policy_placement_the_class_nodes_may_meet_resolves(
        requirements: list[Any]) -> None:
    resolution = classes.resolve("ml", _placed_policy(*requirements), CFG,
                                 classes.catalogue([PLACED_CLASS]))
    assert resolution.resolved, resolution.problems


# merge and conflict


def test_a_key_set_to_another_value_conflicts_naming_field_class_and_value() -> None:
    [problem] = class_placement.conflicts(
        {"nodeSelector": {"zone": "a", "example.com/pool": "hdd", "gpu": "h100"}}, PLACED, "fast")
    assert problem.field == "spec.nodeSelector.example.com/pool"
    assert "CheckpointClass fast" in str(problem) and "example.com/pool=nvme" in str(problem)
    assert str(problem).endswith("got 'hdd'")


def test_a_conflict_on_a_later_class_key_is_found_too() -> None:
    # zone sorts after example.com/pool: each class key is compared.
    [problem] = class_placement.conflicts({"nodeSelector": {"example.com/pool": "nvme",
                                                            "zone": "b"}}, PLACED, "fast")
    assert problem.field == "spec.nodeSelector.zone" and "zone=a" in str(problem)


@pytest.mark.parametrize("spec", [{}, {"nodeSelector": None}, {"nodeSelector": {"gpu": "h"}},
                                  {"nodeSelector": {"zone": "a"}}])
def test_no_conflict_when_the_pod_leaves_a_key_or_agrees(spec: dict[str, Any]) -> None:
    assert class_placement.conflicts(spec, PLACED, "fast") == []


REQUIRED = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
POOL_HDD = {"key": "example.com/pool", "operator": "In", "values": ["hdd"]}
GPU = {"key": "gpu", "operator": "Exists"}


def affine(*terms: Any) -> dict[str, Any]:
    """A pod spec whose required node affinity is `terms`."""
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


def test_a_term_no_class_node_meets_conflicts_naming_the_requirement() -> None:
    [problem] = class_placement.conflicts(affine({"matchExpressions": [GPU, POOL_HDD]}),
                                          PLACED, "fast")
    assert problem.field == f"{REQUIRED}.nodeSelectorTerms[0].matchExpressions[1]"
    assert "a requirement nodes labelled example.com/pool=nvme meet" in str(problem)
    assert "CheckpointClass fast" in str(problem)
    assert str(problem).endswith("got 'example.com/pool In [hdd]'")


@pytest.mark.parametrize(("requirement", "labels", "said"), [
    ({"key": "example.com/pool", "operator": "NotIn", "values": ["nvme", "ssd"]},
     "example.com/pool=nvme", "example.com/pool NotIn [nvme, ssd]"),
    ({"key": "zone", "operator": "DoesNotExist"}, "zone=a", "zone DoesNotExist"),
    ({"key": "zone", "operator": "Gt", "values": ["3"]}, "zone=a", "zone Gt [3]"),
    ({"key": "cores", "operator": "Gt", "values": ["16"]}, "cores=8", "cores Gt [16]"),
    ({"key": "cores", "operator": "Lt", "values": ["8"]}, "cores=8", "cores Lt [8]"),
])
def test_each_operator_that_cannot_hold_on_a_class_key_conflicts(
        requirement: dict[str, Any], labels: str, said: str) -> None:
    placed = Placement((*PLACED.node_selector, ("cores", "8")))
    [problem] = class_placement.conflicts(affine({"matchExpressions": [requirement]}),
                                          placed, "fast")
    assert problem.field == f"{REQUIRED}.nodeSelectorTerms[0].matchExpressions[0]"
    assert f"nodes labelled {labels} meet" in str(problem) and said in str(problem)


def test_every_term_ruled_out_is_named_once_beside_the_nodeselector() -> None:
    zone_b = {"key": "zone", "operator": "In", "values": ["b"]}
    found = class_placement.conflicts({"nodeSelector": {"zone": "b"}, **affine(
        {"matchExpressions": [POOL_HDD, zone_b]}, {"matchExpressions": [GPU, zone_b]})},
        PLACED, "fast")
    assert [p.field for p in found] == [
        "spec.nodeSelector.zone", f"{REQUIRED}.nodeSelectorTerms[0].matchExpressions[0]",
        f"{REQUIRED}.nodeSelectorTerms[1].matchExpressions[1]"]


@pytest.mark.parametrize("spec", [
    # Terms are ORed: one the class's nodes may meet is enough.
    affine({"matchExpressions": [POOL_HDD]},
           {"matchExpressions": [{"key": "example.com/pool", "operator": "In",
                                  "values": ["hdd", "nvme"]}]}),
    # Keys the class does not set, node fields, operators unknown here.
    affine({"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}),
    affine({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}),
    affine({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}),
    affine({"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["b"]}]}),
    affine({"matchExpressions": [{"key": "zone", "operator": "Exists"}, GPU]}),
    affine(),
    # Preferred is never a conflict.
    {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [POOL_HDD]}}]}}},
])
def test_an_affinity_the_class_nodes_may_meet_is_no_conflict(spec: dict[str, Any]) -> None:
    assert class_placement.conflicts(spec, PLACED, "fast") == []


@pytest.mark.parametrize("spec", [
    {"affinity": "pool=hdd"}, {"affinity": None}, {"affinity": {"nodeAffinity": ["x"]}},
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}}},
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": {"matchExpressions": [POOL_HDD]}}}}},
    affine("junk", {"matchExpressions": [POOL_HDD]}),
    affine({"matchExpressions": "example.com/pool In hdd"}, {"matchExpressions": [POOL_HDD]}),
    affine({"matchExpressions": [{"key": ["example.com/pool"], "operator": "In",
                                  "values": ["hdd"]}]}),
    affine({"matchExpressions": [{"key": "example.com/pool", "operator": "In", "values": 3}]}),
    affine({"matchExpressions": [{"key": "example.com/pool", "operator": "In",
                                  "values": "hdd"}]}),
    affine({"matchExpressions": ["junk", None]}),
])
def test_a_malformed_affinity_is_no_conflict_and_no_crash(spec: dict[str, Any]) -> None:
    assert class_placement.conflicts(spec, PLACED, "fast") == []


@pytest.mark.parametrize("requirement", [
    {"key": "example.com/pool", "operator": "In"},
    {"key": "example.com/pool", "operator": "In", "values": []},
    {"key": "example.com/pool", "operator": "NotIn", "values": []},
    {"key": "zone", "operator": "DoesNotExist", "values": ["a"]},
    {"key": "zone", "operator": "Exists", "values": ["b"]},
    {"key": "zone", "operator": "Gt", "values": []},
    {"key": "zone", "operator": "Lt", "values": ["1", "2"]},
], ids=["In-no-values", "In-empty", "NotIn-empty", "DoesNotExist-values", "Exists-values",
        "Gt-none", "Lt-two"])
def test_a_requirement_kubernetes_refuses_is_left_to_the_apiserver(
        requirement: dict[str, Any]) -> None:
    """Not a conflict with the class's nodes: the apiserver refuses the pod
    with its own error, which names what is wrong with the requirement."""
    assert class_placement.conflicts(affine({"matchExpressions": [requirement]}),
                                     PLACED, "fast") == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    | st.sampled_from(["example.com/pool", "zone", "In", "NotIn", "DoesNotExist", "Gt"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["key", "operator", "values", "matchExpressions", "matchFields"]), inner, max_size=4),
    max_leaves=10)


@given(JSON, st.integers(0, 4))
def test_any_json_anywhere_in_the_affinity_never_crashes(junk: Any, depth: int) -> None:
    # A well-formed pod spec with `junk` in place of one of its levels.
    nested: Any = junk
    for key in ("matchExpressions", None, "nodeSelectorTerms",
                "requiredDuringSchedulingIgnoredDuringExecution", "nodeAffinity")[depth:]:
        nested = [nested] if key is None else {key: nested}
    found = class_placement.conflicts({"affinity": nested}, PLACED, "fast")
    assert all(p.field.startswith(REQUIRED) for p in found)


def test_a_class_that_says_nothing_of_placement_never_conflicts() -> None:
    assert class_placement.conflicts(affine({"matchExpressions": [POOL_HDD]}),
                                     class_placement.ANYWHERE, "fast") == []


def test_only_identical_tolerations_are_left_out() -> None:
    # A missing operator is Equal, as the apiserver reads it.
    have = [{"key": "dedicated", "value": "ckpt", "effect": "NoExecute", "tolerationSeconds": 30}]
    assert class_placement.tolerations_to_add(have, [NVME, DEDICATED, NVME]) == [NVME]
    longer = {**DEDICATED, "tolerationSeconds": 60}
    assert class_placement.tolerations_to_add(have, [longer]) == [longer]
    assert class_placement.tolerations_to_add(None, []) == []


# the patch


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": "ml", "labels": {"app": "t"}},
            "spec": {"containers": [{"name": "trainer", "image": "t"}], **spec}}


def patched(given: dict[str, Any], placement: Placement = PLACED) -> dict[str, Any]:
    ops = injection.build_pod_patch(given, POLICY, CFG, default_rate=1e9, placement=placement)
    return jsonpatch.apply_patch(copy.deepcopy(given), ops)["spec"]


def test_a_bare_pod_gets_the_class_nodeselector_and_tolerations() -> None:
    spec = patched(pod())
    assert spec["nodeSelector"] == {"example.com/pool": "nvme", "zone": "a"}
    assert spec["tolerations"] == [NVME, DEDICATED]


def test_a_pod_with_its_own_keeps_them_and_gets_the_rest_once() -> None:
    own = {"key": "gpu", "operator": "Exists"}
    spec = patched(pod(nodeSelector={"gpu": "h100", "zone": "a"},
                       tolerations=[own, {**NVME, "operator": "Exists"}]))
    assert spec["nodeSelector"] == {"gpu": "h100", "zone": "a", "example.com/pool": "nvme"}
    assert spec["tolerations"] == [own, NVME, DEDICATED]


def test_an_empty_nodeselector_is_filled_and_anywhere_adds_nothing() -> None:
    assert patched(pod(nodeSelector={}))["nodeSelector"] == dict(PLACED.node_selector)
    spec = patched(pod(), class_placement.ANYWHERE)
    assert "nodeSelector" not in spec and "tolerations" not in spec


def test_class_and_policy_tolerations_together_are_added_once() -> None:
    placed = policy.parse("ml", "p", {
        "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "8GB"},
        "interval": "15m", "localTier": {"path": "/mnt/nvme/p"},
        "storage": {"uri": "s3://ckpt/ml"},
        "placement": {"tolerations": [NVME, {"key": "policy", "operator": "Exists"}]}}, CFG)
    ops = injection.build_pod_patch(pod(), placed, CFG, default_rate=1e9, placement=PLACED)
    spec = jsonpatch.apply_patch(pod(), ops)["spec"]
    assert spec["tolerations"] == [NVME, DEDICATED, {"key": "policy", "operator": "Exists"}]


def test_a_placement_edit_is_one_line_naming_the_pods_it_strands() -> None:
    # The class moved its pods from pool hdd to nvme: pods admitted with
    # pool=hdd (merged then, or their template's own) are counted and
    # named, with key, values and class; one that agrees or leaves the key
    # is not. One line for all: a job of thousands of pods, one Event.
    pods = [("w-0", {"example.com/pool": "hdd", "zone": "a"}), ("w-1", {"gpu": "h100"}),
            ("w-2", {"example.com/pool": "nvme", "zone": "b"})]
    said = class_placement.stranded(pods, PLACED, "fast")
    assert said is not None and said.startswith("2 live pod(s) (w-0, w-2) have nodeSelector "
                                                 "example.com/pool=hdd, zone=b"), said
    assert "CheckpointClass fast now gives example.com/pool=nvme, zone=a" in said
    assert class_placement.stranded(pods, class_placement.ANYWHERE, "fast") is None
    many = [(f"w-{i}", {"zone": "b"}) for i in range(5000)]
    said = class_placement.stranded(many, PLACED, "fast")
    assert said is not None and "5000 live pod(s) (w-0, w-1, w-10 and 4997 more)" in said
