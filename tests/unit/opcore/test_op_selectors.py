"""policy/selectors.py: a witness both selectors pick, or proof there is none.

Checked against Kubernetes' own matching (policy.spec.selector_matches):
every witness is picked by both selectors, and when there is no witness a
brute force over every label set of a small universe finds none either."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptdrain.operator.policy.selectors import (
    VALUE_EXPECTED,
    common,
    overlap,
    problems,
    valid_key,
    valid_value,
)
from ckptdrain.operator.policy.spec import selector_matches

KEYS = ["app", "team", "tier"]
VALUES = ["a", "b", "c"]


def test_equal_labels_overlap_with_those_labels() -> None:
    a = {"matchLabels": {"app": "llama"}}
    assert overlap(a, a) == {"app": "llama"}


def test_different_values_of_one_key_never_overlap() -> None:
    assert overlap({"matchLabels": {"app": "a"}}, {"matchLabels": {"app": "b"}}) is None


def test_a_label_one_requires_and_the_other_excludes_never_overlaps() -> None:
    a = {"matchLabels": {"app": "llama", "stage": "train"}}
    b = {"matchLabels": {"app": "llama"},
         "matchExpressions": [{"key": "stage", "operator": "NotIn", "values": ["train"]}]}
    assert overlap(a, b) is None
    c = {"matchExpressions": [{"key": "stage", "operator": "DoesNotExist"}]}
    assert overlap(a, c) is None


def test_a_wider_selector_overlaps_through_a_label_it_does_not_name() -> None:
    a = {"matchLabels": {"app": "llama"}}
    b = {"matchExpressions": [{"key": "gpu", "operator": "Exists"},
                              {"key": "app", "operator": "NotIn", "values": ["other"]}]}
    assert overlap(a, b) == {"app": "llama", "gpu": "any"}


def test_a_value_any_of_them_excludes_is_not_given() -> None:
    a = {"matchExpressions": [{"key": "k", "operator": "Exists"}]}
    b = {"matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["any", "any-1"]}]}
    assert overlap(a, b) == {"k": "any-2"}


def test_an_empty_selector_overlaps_anything_that_picks_a_pod() -> None:
    assert overlap({}, {"matchLabels": {"app": "x"}}) == {"app": "x"}
    assert overlap({}, {}) == {}
    assert overlap({}, {"matchExpressions": [{"key": "k", "operator": "In", "values": []}]}) \
        is None


def test_more_than_two_selectors_intersect() -> None:
    assert common({"matchLabels": {"a": "1"}}, {}, {"matchLabels": {"b": "2"}}) == \
        {"a": "1", "b": "2"}


def test_an_unknown_operator_is_an_error_naming_the_field() -> None:
    try:
        overlap({"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1"]}]}, {})
    except ValueError as error:
        assert "operator" in str(error) and "'Gt'" in str(error)
    else:
        raise AssertionError("accepted an operator selectors cannot have")


_values = st.lists(st.sampled_from(VALUES), max_size=3, unique=True)
_expr = st.one_of(
    st.builds(lambda k, vs: {"key": k, "operator": "In", "values": vs},
              st.sampled_from(KEYS), _values),
    st.builds(lambda k, vs: {"key": k, "operator": "NotIn", "values": vs},
              st.sampled_from(KEYS), _values),
    st.builds(lambda k: {"key": k, "operator": "Exists"}, st.sampled_from(KEYS)),
    st.builds(lambda k: {"key": k, "operator": "DoesNotExist"}, st.sampled_from(KEYS)),
)
SELECTORS = st.builds(
    lambda labels, exprs: {"matchLabels": labels, "matchExpressions": exprs},
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2),
    st.lists(_expr, max_size=3))


def _every_label_set() -> list[dict[str, str]]:
    """Every label set over KEYS with values from VALUES, a key absent
    included. A witness needs no value outside VALUES unless every value
    of VALUES is excluded, and then any fresh value is as good as another:
    one fresh value ("z") stands for them all."""
    choices = [None, *VALUES, "z"]
    return [{k: v for k, v in zip(KEYS, combo, strict=True) if v is not None}
            for combo in itertools.product(choices, repeat=len(KEYS))]


ALL_LABELS = _every_label_set()


@settings(max_examples=400, deadline=None)
@given(SELECTORS, SELECTORS)
def test_a_witness_is_picked_by_both_and_none_means_no_pod_is(
        a: dict[str, Any], b: dict[str, Any]) -> None:
    witness = overlap(a, b)
    if witness is not None:
        assert selector_matches(a, witness) and selector_matches(b, witness)
    else:
        assert not [labels for labels in ALL_LABELS
                    if selector_matches(a, labels) and selector_matches(b, labels)]
    assert (witness is None) == (overlap(b, a) is None)


def test_label_syntax_problems_name_the_field() -> None:
    found = problems({
        "matchLabels": {"app": "llama", "bad key!": "x", "team": "-x"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "no spaces"]},
            {"key": "example.com/role", "operator": "Exists"},
            {"key": "x", "operator": "In", "values": []},
            {"key": "Bad_Prefix.com/x", "operator": "DoesNotExist", "values": ["a"]},
            {"key": "y", "operator": "Near"}]})
    assert [p for p, _, _ in found] == [
        "selector.matchLabels", "selector.matchLabels.team",
        "selector.matchExpressions[0].values[1]", "selector.matchExpressions[2].values",
        "selector.matchExpressions[3].key", "selector.matchExpressions[3].values",
        "selector.matchExpressions[4].operator"]
    assert found[0][2] == "bad key!" and found[2][2] == "no spaces"
    assert problems({"matchLabels": {"a.b/c-d_e.f": "", "k": "v" * 63}}) == []
    assert problems({"matchLabels": {"k": "v" * 64}})[0][0] == "selector.matchLabels.k"


def test_a_policy_with_a_bad_selector_label_is_invalid_naming_the_field() -> None:
    from ckptdrain.operator import config
    from ckptdrain.operator.policy import spec as pol

    spec = {"selector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["llama", "bad value"]}]},
        "model": {"parameters": "7B"}, "interval": "10m",
        "localTier": {"path": "/mnt/ckptdrain/n"}, "storage": {"uri": "s3://bucket/p"}}
    errors = pol.validate(spec, config.OperatorConfig(allowed_root="/mnt/ckptdrain"))
    assert [str(e) for e in errors] == [
        f"spec.selector.matchExpressions[0].values[1]: expected {VALUE_EXPECTED}, "
        "got 'bad value'"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3))
def test_every_witness_is_a_label_set_a_pod_can_carry(keys: list[str]) -> None:
    # Exists on every key, with values forbidden: the witness makes values up.
    selector = {"matchExpressions": [{"key": k, "operator": "Exists"} for k in keys]
                + [{"key": k, "operator": "NotIn", "values": ["any", "any-1"]} for k in keys]}
    witness = common(selector, {})
    assert witness is not None
    assert all(valid_key(k) and valid_value(v) for k, v in witness.items())


def test_a_stored_policy_with_a_selector_admission_now_refuses_still_parses() -> None:
    # Stored before the syntax checks (Exists with values): admission refuses
    # it on a spec change, but the operator and pod admission keep using it.
    from ckptdrain.operator import config
    from ckptdrain.operator.policy import spec as pol

    selector = {"matchExpressions": [{"key": "app", "operator": "Exists",
                                      "values": ["llama"]}]}
    spec = {"selector": selector, "model": {"parameters": "7B"}, "interval": "10m",
            "localTier": {"path": "/mnt/ckptdrain/n"}, "storage": {"uri": "s3://bucket/p"}}
    cfg = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
    assert [str(e).split(":")[0] for e in pol.validate(spec, cfg)] == [
        "spec.selector.matchExpressions[0].values"]
    parsed = pol.parse("ml", "old", spec, cfg)
    assert parsed.name == "old"
    assert selector_matches(selector, {"app": "anything"})
