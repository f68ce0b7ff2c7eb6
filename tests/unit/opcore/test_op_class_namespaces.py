"""A CheckpointClass's namespace allow-list (spec.namespaces): read from the
class, a policy of a namespace it does not allow refused naming the field,
the class and the labels the namespace lacks, and the default class chosen
among those that allow the namespace."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.policy import class_catalogue, class_namespaces, classes

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
SPEC: dict[str, Any] = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
    "interval": "15m", "localTier": {"path": "/mnt/nvme/fast"},
    "storage": {"uri": "s3://ckpt/ml/runs", "credentialsSecretRef": {"name": "creds"}},
}
TEAM_A = {"from": "Selector", "selector": {"matchLabels": {"tenant": "a"}}}


def body(name: str, *, default: bool = False, created: str = "2026-11-01T00:00:00Z",
         **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if default:
        meta["annotations"] = {classes.DEFAULT_ANNOTATION: "true"}
    return {"metadata": meta, "spec": {"nodeTier": {"root": "/mnt/nvme"}, **spec}}


def resolve(class_name: str, labels: dict[str, str], *bodies: dict[str, Any]
            ) -> classes.Resolution:
    return classes.resolve("ml-b", {**SPEC, "checkpointClassName": class_name}, CFG,
                           classes.catalogue(list(bodies)), lambda: labels)


def test_unset_or_from_all_allows_every_namespace_without_reading_labels() -> None:
    def unread() -> dict[str, str]:
        raise AssertionError("labels read for a class that allows every namespace")

    for spec in ({}, {"namespaces": {"from": "All"}}):
        catalogue = classes.catalogue([body("open", **spec)])
        resolution = classes.resolve("ml", {**SPEC, "checkpointClassName": "open"}, CFG,
                                     catalogue, unread)
        assert resolution.resolved and resolution.reason == classes.RESOLVED
        assert not classes.needs_labels({"checkpointClassName": "open"}, catalogue)


def test_a_namespace_the_selector_matches_is_allowed() -> None:
    resolution = resolve("team-a", {"tenant": "a", "other": "x"}, body("team-a", namespaces=TEAM_A))
    assert resolution.resolved, resolution.problems


def test_another_namespace_is_refused_naming_field_class_and_missing_label() -> None:
    resolution = resolve("team-a", {"tenant": "b"}, body("team-a", namespaces=TEAM_A))
    assert (resolution.resolved, resolution.reason) == (False, classes.NOT_ALLOWED)
    message = classes.condition(resolution)["message"]
    assert message.startswith("CheckpointClass team-a does not allow this policy's namespace")
    assert "spec.checkpointClassName" in message and "ml-b lacks tenant=a" in message


def test_match_expressions_name_each_failing_term() -> None:
    rule = {"from": "Selector", "selector": {"matchExpressions": [
        {"key": "env", "operator": "In", "values": ["prod", "staging"]},
        {"key": "quarantine", "operator": "DoesNotExist"},
        {"key": "team", "operator": "Exists"}]}}
    resolution = resolve("c", {"env": "dev", "quarantine": "y", "team": "t"},
                         body("c", namespaces=rule))
    message = classes.condition(resolution)["message"]
    assert "lacks env in (prod, staging), no label quarantine" in message
    assert "a label team" not in message


def test_labels_that_cannot_be_read_are_no_judgement_the_error_passes_through() -> None:
    class Unreadable(InvalidInput):
        pass

    def failing() -> dict[str, str]:
        raise Unreadable("metadata.namespace", "readable labels", "timeout")

    with pytest.raises(Unreadable):
        classes.resolve("ml", {**SPEC, "checkpointClassName": "team-a"}, CFG,
                        classes.catalogue([body("team-a", namespaces=TEAM_A)]), failing)


@pytest.mark.parametrize(("raw", "field"), [
    ({"from": "Selector"}, "spec.namespaces.selector"),
    ({"from": "All", "selector": {}}, "spec.namespaces.selector"),
    ({"from": "Some"}, "spec.namespaces.from"),
    ({"from": "Selector", "selector": {"matchExpressions": [
        {"key": "a", "operator": "Near", "values": ["x"]}]}}, "spec.namespaces.selector"),
    ("tenant-a", "spec.namespaces"),
])
def test_a_wrong_rule_makes_the_class_invalid_naming_the_field(raw: object, field: str) -> None:
    with pytest.raises(classes.ClassInvalid) as caught:
        classes.read(body("bad", namespaces=raw))
    assert any(e.field.startswith(field) for e in caught.value.errors), caught.value.errors


def test_the_default_is_the_oldest_default_that_allows_the_namespace() -> None:
    catalogue = classes.catalogue([
        body("a-only", default=True, created="2026-01-01T00:00:00Z", namespaces=TEAM_A),
        body("everyone", default=True, created="2026-02-01T00:00:00Z"),
    ])
    assert classes.needs_labels({}, catalogue)
    assert classes.default_choice(catalogue, {"tenant": "a"}).cls.name == "a-only"
    # Tenant b is not allowed a-only: the next default, with no warning
    # about a class it could never get.
    choice = classes.default_choice(catalogue, {"tenant": "b"})
    assert (choice.cls.name, choice.warning) == ("everyone", "")
    # Without labels (the classes' own Default conditions): cluster-wide.
    assert classes.default_choice(catalogue).cls.name == "a-only"


def test_a_restricted_default_says_where_it_is_the_default_naming_its_selector() -> None:
    conditions = class_catalogue.class_conditions(classes.catalogue([
        body("a-only", default=True, created="2026-01-01T00:00:00Z", namespaces={
            "from": "Selector", "selector": {"matchLabels": {"tenant": "a"}, "matchExpressions": [
                {"key": "env", "operator": "In", "values": ["prod"]}]}}),
        body("everyone", default=True, created="2026-02-01T00:00:00Z")]))
    [default] = [c for c in conditions["a-only"] if c["type"] == class_catalogue.DEFAULT]
    assert default["status"] == "True"
    assert "only in namespaces its spec.namespaces.selector matches (tenant=a, env in " \
        "(prod))" in default["message"]
    [unrestricted] = [c for c in class_catalogue.class_conditions(classes.catalogue([
        body("everyone", default=True)]))["everyone"] if c["type"] == class_catalogue.DEFAULT]
    assert unrestricted["message"] == "policies that name no class get this one"


def test_no_default_allows_the_namespace_no_class() -> None:
    catalogue = classes.catalogue([body("a-only", default=True, namespaces=TEAM_A)])
    assert classes.default_choice(catalogue, {"tenant": "b"}).cls is None


def test_an_unusable_default_still_wins_for_every_namespace_fail_closed() -> None:
    catalogue = classes.catalogue([
        body("broken", default=True, created="2026-01-01T00:00:00Z",
             namespaces={"from": "Selector"}),
        body("everyone", default=True, created="2026-02-01T00:00:00Z")])
    assert classes.default_choice(catalogue, {"tenant": "b"}).cls.name == "broken"


LABEL = st.sampled_from(["a", "b", "c"])


@given(st.dictionaries(LABEL, LABEL, max_size=3), st.dictionaries(LABEL, LABEL, max_size=3))
def test_a_namespace_lacks_nothing_exactly_when_allowed(
        wanted: dict[str, str], labels: dict[str, str]) -> None:
    rule = class_namespaces.NamespaceRule({"matchLabels": wanted})
    assert rule.allows(labels) == (rule.lacks(labels) == [])
