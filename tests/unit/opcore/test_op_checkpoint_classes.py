"""CheckpointClass, pure: a class body read (every problem naming its
field), a policy's class chosen (named, default, oldest of several
defaults, none), the class applied to parse (its root, resources and image
in place of the operator's), its stores' allow-list and the endpoint
filled in, and the ClassResolved condition."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.policy import classes
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
SPEC: dict[str, Any] = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
    "interval": "15m", "localTier": {"path": "/mnt/nvme/fast"},
    "storage": {"uri": "s3://ckpt/ml/runs", "credentialsSecretRef": {"name": "creds"}},
}


def body(name: str, *, default: bool = False, created: str = "2026-11-01T00:00:00Z",
         **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if default:
        meta["annotations"] = {classes.DEFAULT_ANNOTATION: "true"}
    return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
            "metadata": meta, "spec": {"nodeTier": {"root": "/mnt/nvme"}, **spec}}


STORES = [{"uriPrefix": "s3://ckpt/{namespace}", "endpoint": "http://minio:9000",
           "region": "eu-1", "addressingStyle": "path"}]


def resolve(spec: dict[str, Any], *bodies: dict[str, Any],
            namespace: str = "ml") -> classes.Resolution:
    """`spec` resolved as a policy created now: bound to the default class
    where it names none (admission's mutation)."""
    catalogue = classes.catalogue(list(bodies))
    default = classes.default_choice(catalogue).cls
    if default is not None and not spec.get("checkpointClassName"):
        spec = {**spec, "checkpointClassName": default.name}
    return classes.resolve(namespace, spec, CFG, catalogue)


# read


def test_a_class_reads_into_its_typed_value() -> None:
    cls = classes.read(body("fast", default=True, stores=STORES, agentImage="ckptdrain:2.0",
                            bandwidthWeight=4, nodeTier={"root": "/mnt/nvme/"}))
    assert cls.name == "fast" and cls.default and cls.root == "/mnt/nvme"
    assert cls.stores == (classes.Store("s3://ckpt/{namespace}", "http://minio:9000", "eu-1",
                                        "path"),)
    assert (cls.agent_image, cls.bandwidth_weight) == ("ckptdrain:2.0", 4)


@pytest.mark.parametrize(("spec", "field"), [
    ({"nodeTier": {}}, "spec.nodeTier.root"),
    ({"nodeTier": {"root": "mnt/nvme"}}, "spec.nodeTier.root"),
    ({"nodeTier": {"root": "/"}}, "spec.nodeTier.root"),
    ({"nodeTier": {"root": "/mnt/../etc"}}, "spec.nodeTier.root"),
    ({"stores": [{"uriPrefix": "file:///data"}]}, "spec.stores[0].uriPrefix"),
    ({"stores": [{"uriPrefix": "s3://"}]}, "spec.stores[0].uriPrefix"),
    ({"stores": [{"uriPrefix": "s3://b/{name}"}]}, "spec.stores[0].uriPrefix"),
    ({"stores": [{"uriPrefix": "s3://b/../x"}]}, "spec.stores[0].uriPrefix"),
    ({"stores": [{}]}, "spec.stores[0].uriPrefix"),
    ({"stores": [STORES[0], {"uriPrefix": "gs://g", "endpoint": ""}]},
     "spec.stores[1].endpoint"),
    ({"stores": "s3://b"}, "spec.stores"),
    ({"resources": {"agent": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}},
     "spec.resources.agent"),
    ({"resources": {"qos": "BestEffort"}}, "spec.resources.qos"),
    ({"resources": {"agent": {"requests": {"cpu": "lots"}}}}, "spec.resources.agent.requests.cpu"),
    ({"agentImage": ""}, "spec.agentImage"),
    ({"bandwidthWeight": 0}, "spec.bandwidthWeight"),
    ({"bandwidthWeight": 1001}, "spec.bandwidthWeight"),
    ({"bandwidthWeight": True}, "spec.bandwidthWeight"),
])
def test_a_bad_class_is_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(classes.ClassInvalid) as raised:
        classes.read(body("bad", **spec))
    assert any(e.field.startswith(field) for e in raised.value.errors), raised.value.errors
    assert str(raised.value).startswith("CheckpointClass bad: ")


def test_every_problem_of_a_class_is_named_at_once() -> None:
    with pytest.raises(classes.ClassInvalid) as raised:
        classes.read(body("bad", nodeTier={"root": "x"}, bandwidthWeight=0))
    assert {e.field for e in raised.value.errors} == {"spec.nodeTier.root",
                                                      "spec.bandwidthWeight"}


# choose


def test_a_named_class_is_chosen_over_the_default() -> None:
    catalogue = classes.catalogue([body("fast"), body("std", default=True)])
    choice = classes.choose({"checkpointClassName": "fast"}, catalogue)
    assert isinstance(choice.cls, classes.CheckpointClass) and choice.cls.name == "fast"


def test_the_default_is_bound_at_creation_never_chosen_later() -> None:
    catalogue = classes.catalogue([body("fast"), body("std", default=True)])
    choice = classes.default_choice(catalogue)
    assert isinstance(choice.cls, classes.CheckpointClass) and choice.cls.name == "std"
    assert choice.warning == ""
    # A policy stored without a class (none was the default when it was
    # created) keeps the operator's settings when a default appears.
    assert classes.choose({}, catalogue).cls is None
    assert classes.resolve("ml", SPEC, CFG, catalogue).reason == classes.NO_CLASS


def test_several_defaults_the_oldest_wins_then_the_name_with_a_warning() -> None:
    catalogue = classes.catalogue([
        body("b-old", default=True, created="2026-01-01T00:00:00Z"),
        body("a-new", default=True, created="2026-06-01T00:00:00Z"),
        body("a-old", default=True, created="2026-01-01T00:00:00Z")])
    choice = classes.default_choice(catalogue)
    assert isinstance(choice.cls, classes.CheckpointClass) and choice.cls.name == "a-old"
    assert "3 CheckpointClasses" in choice.warning and "a-old, is the default" in choice.warning


def test_an_unusable_default_fails_closed_rather_than_lift_its_stores() -> None:
    # The oldest default does not read: classless policies are refused
    # under it, never handed to a newer default or to no class at all.
    resolution = resolve(SPEC, body("broken", default=True, created="2026-01-01T00:00:00Z",
                                    stores=STORES, nodeTier={"root": "relative"}),
                         body("newer", default=True, created="2026-06-01T00:00:00Z"),
                         namespace="team-a")
    assert not resolution.resolved and resolution.reason == classes.INVALID
    assert resolution.class_name == "broken"
    assert "spec.nodeTier.root" in classes.condition(resolution)["message"]
    alone = resolve(SPEC, body("broken", default=True, nodeTier={"root": "x"}))
    assert alone.reason == classes.INVALID


def test_an_annotation_other_than_true_is_no_default() -> None:
    other = body("std")
    other["metadata"]["annotations"] = {classes.DEFAULT_ANNOTATION: "True"}
    assert classes.default_choice(classes.catalogue([other])).cls is None


def test_no_class_and_no_default_keeps_the_operators_configuration() -> None:
    resolution = resolve(SPEC, body("fast"))
    assert resolution.resolved and resolution.reason == classes.NO_CLASS
    assert resolution.config is CFG and resolution.spec == SPEC


def test_a_missing_class_is_named_in_the_problem() -> None:
    resolution = resolve({**SPEC, "checkpointClassName": "gone"}, body("std", default=True))
    assert not resolution.resolved and resolution.reason == classes.NOT_FOUND
    [problem] = resolution.problems
    assert problem.field == "spec.checkpointClassName" and "gone" in str(problem)


def test_a_class_that_does_not_read_refuses_its_policies_with_its_problems() -> None:
    resolution = resolve({**SPEC, "checkpointClassName": "bad"},
                         body("bad", nodeTier={"root": "x"}))
    assert resolution.reason == classes.INVALID
    condition = classes.condition(resolution)
    assert condition["status"] == "False" and "CheckpointClass bad" in condition["message"]
    assert "spec.nodeTier.root" in condition["message"]


# config_for: parse's own checks with the class's values


def test_the_class_root_replaces_the_allowed_root() -> None:
    resolution = resolve(SPEC, body("std", default=True))
    assert resolution.config.allowed_root == "/mnt/nvme"
    assert policy.parse("ml", "p", resolution.spec, resolution.config).local_path \
        == "/mnt/nvme/fast"
    # The operator's root alone refuses the same path.
    with pytest.raises(policy.PolicyInvalid, match=r"spec\.localTier\.path"):
        policy.parse("ml", "p", SPEC, CFG)


def test_a_path_outside_the_class_root_is_refused() -> None:
    spec = {**SPEC, "localTier": {"path": "/mnt/ckptdrain/x"}}
    resolution = resolve(spec, body("std", default=True))
    with pytest.raises(policy.PolicyInvalid, match="under /mnt/nvme"):
        policy.parse("ml", "p", resolution.spec, resolution.config)


def test_the_class_image_and_resources_replace_the_operators() -> None:
    cls = classes.read(body("std", agentImage="ckptdrain:2.0", resources={
        "qos": "Burstable", "agent": {"requests": {"cpu": "500m"}, "max": {"cpu": "1"}}}))
    cfg = classes.config_for(CFG, cls)
    assert cfg.image == "ckptdrain:2.0" and cfg.containers.qos == "Burstable"
    assert cfg.containers.agent.requests == {"cpu": "500m"}
    assert cfg.containers.agent.max == {"cpu": "1"}
    # Keys and containers the class leaves out keep the operator's.
    assert cfg.containers.agent.limits == CFG.containers.agent.limits
    assert cfg.containers.restore == CFG.containers.restore
    # parse holds a policy's spec.resources to the class's max.
    asked = {**SPEC, "resources": {"agent": {"requests": {"cpu": "1500m"}}}}
    [problem] = policy.validate(asked, cfg)
    assert problem.field.startswith("spec.resources.agent") and "1" in problem.expected
    # The operator's own max (2 cpu) allows it.
    assert policy.validate(asked, dataclasses.replace(CFG, allowed_root="/mnt/nvme")) == []


def test_a_class_without_image_or_resources_keeps_the_operators() -> None:
    cfg = classes.config_for(CFG, classes.read(body("std")))
    assert (cfg.image, cfg.containers) == (CFG.image, CFG.containers)


# stores


def test_a_uri_under_a_class_store_gets_its_settings() -> None:
    spec = {**SPEC, "storage": {"uri": "s3://ckpt/ml/runs"}}
    resolution = resolve(spec, body("std", default=True, stores=STORES))
    assert resolution.resolved
    assert resolution.spec["storage"] == {"uri": "s3://ckpt/ml/runs",
                                          "endpoint": "http://minio:9000", "region": "eu-1",
                                          "addressingStyle": "path"}
    assert spec["storage"] == {"uri": "s3://ckpt/ml/runs"}  # not mutated


@pytest.mark.parametrize("uri", ["s3://ckpt/other/runs", "s3://ckpt/mlx", "s3://ckpt",
                                 "s3://ckpt/ml/../other", "gs://ckpt/ml"])
def test_a_uri_outside_the_class_stores_is_refused_naming_field_and_class(uri: str) -> None:
    spec = {**SPEC, "storage": {"uri": uri}}
    resolution = resolve(spec, body("std", default=True, stores=STORES))
    assert resolution.reason == classes.REFUSED
    [problem] = resolution.problems
    assert problem.field == "spec.storage.uri"
    assert "CheckpointClass std" in str(problem) and "s3://ckpt/ml" in str(problem)


def test_the_namespace_placeholder_is_the_policys_namespace() -> None:
    spec = {**SPEC, "storage": {"uri": "s3://ckpt/team-b"}}
    assert resolve(spec, body("std", default=True, stores=STORES), namespace="team-b").resolved
    assert not resolve(spec, body("std", default=True, stores=STORES),
                       namespace="ml").resolved


def test_a_setting_the_class_decides_otherwise_is_refused() -> None:
    spec = copy.deepcopy(SPEC)
    spec["storage"].update(endpoint="http://elsewhere:9000", region="eu-1")
    resolution = resolve(spec, body("std", default=True, stores=STORES))
    [problem] = resolution.problems
    assert problem.field == "spec.storage.endpoint"
    assert "CheckpointClass std" in str(problem) and "http://minio:9000" in str(problem)


def test_the_same_setting_as_the_class_is_accepted() -> None:
    spec = copy.deepcopy(SPEC)
    spec["storage"].update(endpoint="http://minio:9000/", addressingStyle="path")
    assert resolve(spec, body("std", default=True, stores=STORES)).resolved


def test_a_class_without_stores_allows_any_store() -> None:
    assert resolve(SPEC, body("std", default=True)).resolved


def test_a_store_without_settings_leaves_the_policys() -> None:
    spec = copy.deepcopy(SPEC)
    spec["storage"]["endpoint"] = "http://mine:9000"
    resolution = resolve(spec, body("std", default=True,
                                    stores=[{"uriPrefix": "s3://ckpt"}]))
    assert resolution.resolved and resolution.spec["storage"]["endpoint"] == "http://mine:9000"


# condition


def test_the_condition_says_which_class() -> None:
    resolution = resolve(SPEC, body("a", default=True, created="2026-01-01T00:00:00Z"),
                         body("b", default=True, created="2026-02-01T00:00:00Z"))
    condition = classes.condition(resolution)
    assert condition["status"] == "True" and condition["reason"] == classes.RESOLVED
    assert condition["message"] == "CheckpointClass a"


def test_the_condition_of_a_refused_policy_names_field_and_class() -> None:
    spec = {**SPEC, "storage": {"uri": "s3://other/x"}}
    condition = classes.condition(resolve(spec, body("std", default=True, stores=STORES)))
    assert (condition["status"], condition["reason"]) == ("False", classes.REFUSED)
    assert "CheckpointClass std refuses this policy" in condition["message"]
    assert "spec.storage.uri" in condition["message"]


def test_problems_are_invalid_input() -> None:
    """Callers report them as they report a policy's own problems."""
    resolution = resolve({**SPEC, "checkpointClassName": "gone"})
    assert all(isinstance(p, InvalidInput) for p in resolution.problems)


# the classes' own conditions


def test_each_class_says_whether_it_is_accepted_and_which_default_wins() -> None:
    from ckptdrain.operator.policy import class_catalogue

    catalogue = classes.catalogue([
        body("old", default=True, created="2026-01-01T00:00:00Z"),
        body("new", default=True, created="2026-06-01T00:00:00Z"),
        body("plain"), body("bad", nodeTier={"root": "x"})])
    found = {name: {c["type"]: c for c in conds}
             for name, conds in class_catalogue.class_conditions(catalogue).items()}
    assert found["plain"] == {"Accepted": {"type": "Accepted", "status": "True",
                                           "reason": "Valid", "message": ""}}
    assert found["bad"]["Accepted"]["status"] == "False"
    assert "spec.nodeTier.root" in found["bad"]["Accepted"]["message"]
    assert (found["old"]["Default"]["status"], found["old"]["Default"]["reason"]) == (
        "True", "OldestDefault")
    assert (found["new"]["Default"]["status"], found["new"]["Default"]["reason"]) == (
        "False", "NewerDefault")
    assert "the oldest, old, is the default" in found["new"]["Default"]["message"]
    bad_default = class_catalogue.class_conditions(classes.catalogue(
        [body("bad", default=True, nodeTier={"root": "x"})]))
    assert {c["type"]: c["status"] for c in bad_default["bad"]} == {
        "Accepted": "False", "Default": "True"}
    alone = class_catalogue.class_conditions(classes.catalogue([body("only", default=True)]))
    assert alone["only"][1]["reason"] == "Default"


def test_a_uri_scheme_is_compared_without_case() -> None:
    store = classes.Store("s3://ckpt/{namespace}")
    assert store.admits("ml", "S3://ckpt/ml/runs")
    assert classes.Store("S3://ckpt/x").admits("ml", "s3://ckpt/x/y")
    assert not store.admits("ml", "S3://CKPT/ml/runs")  # bucket and key keep their case


def test_no_namespace_never_widens_a_namespaced_prefix_to_the_bucket() -> None:
    store = classes.Store("s3://ckpt/{namespace}")
    assert not store.admits("", "s3://ckpt/other-tenant/runs")
    with pytest.raises(ValueError):
        store.prefix_for("")
    spec = {**SPEC, "storage": {"uri": "s3://ckpt/anything"}}
    resolution = resolve(spec, body("std", default=True, stores=STORES), namespace="")
    assert not resolution.resolved
    assert resolution.problems[0].field == "metadata.namespace"


SEGMENT = st.text(alphabet="abcdefghij-0123456789._", min_size=1, max_size=6).filter(
    lambda s: s not in (".", ".."))


@given(namespace=st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
       prefix=st.lists(SEGMENT, max_size=3), uri=st.lists(SEGMENT, max_size=5))
def test_a_store_admits_a_uri_exactly_when_its_segments_start_with_the_prefix(
        namespace: str, prefix: list[str], uri: list[str]) -> None:
    store = classes.Store("/".join(["s3://bucket", "{namespace}", *prefix]))
    full = ["bucket", namespace, *prefix]
    given_uri = "s3://" + "/".join(["bucket", namespace, *uri])
    assert store.admits(namespace, given_uri) == (["bucket", namespace, *uri][:len(full)]
                                                  == full)
    # Another namespace's prefix never admits it (the placeholder is not a wildcard).
    assert not store.admits(namespace + "x", given_uri)
