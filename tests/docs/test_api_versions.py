"""docs/api-versions.md: its v1beta1 example is its v1alpha1 example,
converted, and the operator accepts it; its table names every field whose
type differs."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

import yaml
from tests.docs import blocks
from tests.docs.blocks import REPO
from tests.docs.conftest import default_config, policy_problems
from tests.docs.refusal_example import refusal_example

from ckptdrain import units
from ckptdrain.contract import policy_versions as pv
from ckptdrain.operator.policy import spec as operator_policy
from ckptdrain.operator.policy import version_messages

PAGE = REPO / "docs" / "api-versions.md"
READ = {"spec.model.parameters": units.parse_count, "spec.caps.bandwidth": units.parse_rate,
        "spec.caps.perDrainer": units.parse_rate, "spec.localTier.capacity": units.parse_bytes,
        "spec.mtti": units.parse_duration, "spec.localWriteTime": units.parse_duration,
        "spec.restore.retryDeadline": units.parse_duration, "spec.overlap": units.parse_fraction}


def examples() -> tuple[dict[str, Any], dict[str, Any]]:
    """The page's v1beta1 policy and its v1alpha1 equivalent."""
    found = [b for b in blocks.parse(PAGE) if b.lang == "yaml"]
    (v1beta1,) = [b for b in found if b.kind == "fragment" and b.note.startswith("v1beta1")]
    (v1alpha1,) = [b for b in found if b.kind == ""]
    return yaml.safe_load(v1beta1.text), yaml.safe_load(v1alpha1.text)


def at(obj: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        obj = obj[key]
    return obj


def test_the_v1alpha1_example_converts_to_the_v1beta1_one() -> None:
    v1beta1, v1alpha1 = examples()
    assert (v1beta1["apiVersion"], v1alpha1["apiVersion"]) == (pv.V1BETA1, pv.V1ALPHA1)
    assert pv.convert(v1alpha1, pv.V1BETA1) == v1beta1


def test_the_v1beta1_example_reads_as_the_v1alpha1_one_and_comes_back_exactly() -> None:
    v1beta1, v1alpha1 = examples()
    stored = pv.convert(v1beta1, pv.V1ALPHA1)
    assert pv.convert(stored, pv.V1BETA1) == v1beta1
    for path, read in READ.items():
        assert read(path, at(stored, path)) == read(path, at(v1alpha1, path)), path
    assert without(stored, READ) == without(v1alpha1, READ)  # the rest as it is


def without(obj: dict[str, Any], paths: Iterable[str]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    for path in paths:
        *parents, name = path.split(".")
        del at(out, ".".join(parents))[name]
    return out


def test_the_operator_accepts_the_example() -> None:
    _, v1alpha1 = examples()
    assert policy_problems(v1alpha1["spec"], default_config(), "api-versions") == []


def test_the_v1beta1_example_uses_v1beta1_spellings() -> None:
    v1beta1, _ = examples()
    for path, pattern in pv.V1BETA1_PATTERNS.items():
        try:
            value = at(v1beta1, path)
        except KeyError:
            continue
        assert isinstance(value, int) or re.fullmatch(pattern, value), (path, value)


def test_the_table_names_every_field_whose_type_differs() -> None:
    text = PAGE.read_text()
    assert [p for p in pv.FIELDS if f"`{p}`" not in text] == []


def test_the_refusal_example_is_what_the_operator_says_at_each_version() -> None:
    example = refusal_example()
    assert example.policy["apiVersion"] == pv.V1BETA1
    at_v1beta1 = example.policy["spec"]
    at_v1alpha1 = pv.convert(example.policy, pv.V1ALPHA1)["spec"]
    # The page names what differs at v1alpha1.
    assert (at_v1alpha1["localTier"]["capacity"], at_v1alpha1["model"]["bytesPerParameter"]) \
        == ("1000000000000", 12.5)
    for spec, version, told in ((at_v1beta1, pv.V1BETA1, example.at_v1beta1),
                                (at_v1alpha1, pv.V1ALPHA1, example.at_v1alpha1)):
        problems = operator_policy.validate(spec, default_config(), "small-tier")
        assert [str(version_messages.in_version(p, version)) for p in problems] == [told]


def test_the_bound_the_refusal_example_names_pasted_back_is_accepted() -> None:
    example = refusal_example()
    page = PAGE.read_text()
    assert "the least capacity is 1.3125T, said as 1.32T" in page
    for version, told in ((pv.V1BETA1, example.at_v1beta1), (pv.V1ALPHA1, example.at_v1alpha1)):
        bound = re.search(r"capacity: expected at least ([0-9.]+ ?[A-Z]+) ", told)
        assert bound, told
        # Pasted into the policy as written at that version.
        spec = pv.convert(copy.deepcopy(example.policy), version)["spec"]
        spec["localTier"]["capacity"] = bound[1]
        assert operator_policy.validate(spec, default_config(), "small-tier") == [], bound[1]
    # 1.3125T, to the nearest 1.31T: refused, as the page says.
    policy = copy.deepcopy(example.policy)
    policy["spec"]["localTier"]["capacity"] = "1.31T"
    assert operator_policy.validate(policy["spec"], default_config(), "small-tier") != []
