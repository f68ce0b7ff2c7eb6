"""A policy's problems said in the version its writer wrote
(policy/version_messages.py): v1beta1 writers are told v1beta1 spellings
and shown their value as they wrote it; v1alpha1 writers are told what they
always were."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain import units
from ckptdrain.contract.policy_versions import (
    V1ALPHA1,
    V1BETA1,
    V1BETA1_PATTERNS,
    spellings,
    to_v1alpha1,
)
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import classes
from ckptdrain.operator.policy import spec as pol
from ckptdrain.operator.policy import version_messages as said

CFG = OperatorConfig(allowed_root="/mnt/ckptdrain")
#: Spellings v1alpha1 takes and v1beta1 refuses, as they appear in v1alpha1's texts.
V1ALPHA1_ONLY = re.compile(r"[0-9] ?(B|[kMGTP]B|[KMGTP]iB)\b|/s\b|\b0\.1\b| or 90\b|[0-9]d\b")


def beta_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "llama"}},
        "model": {"parameters": 70_000_000_000, "bytesPerParameter": "12.5"},
        "interval": "1h30m", "overlap": "12.5%",
        "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2,
                      "capacity": 20_000_000_000_000},
        "caps": {"bandwidth": 10_000_000_000},
        "storage": {"uri": "s3://bucket/llama"}}
    spec.update(changes)
    return spec


def beta_problems(**changes: Any) -> tuple[list[InvalidInput], list[InvalidInput]]:
    """The problems of a v1beta1 spec as admission sees it (unconverted),
    and as the operator does (read at v1alpha1)."""
    spec = beta_spec(**changes)
    stored = to_v1alpha1({"apiVersion": V1BETA1, "kind": "CheckpointPolicy", "spec": spec})
    return pol.validate(spec, CFG, "llama"), pol.validate(stored["spec"], CFG, "llama")


def test_a_bound_is_said_in_v1beta1_quantities_and_the_value_as_written() -> None:
    at_admission, at_operator = beta_problems(
        localTier={"path": "/mnt/ckptdrain/nvme", "keep": 2, "capacity": 1_000_000_000_000})
    expected = ("spec.localTier.capacity: expected at least 2.63T (keep=2 checkpoints plus "
                "the one being captured, 875G per writer), got 1000000000000")
    assert [str(said.in_version(p, V1BETA1)) for p in at_admission] == [expected]
    # Read at v1alpha1 the value is the string "1000000000000": said as written.
    assert [str(said.in_version(p, V1BETA1)) for p in at_operator] == [expected]
    # A writer of v1alpha1 is told what it always was.
    assert [str(said.in_version(p, V1ALPHA1)) for p in at_operator] == [
        "spec.localTier.capacity: expected at least 2.63 TB (keep=2 checkpoints plus the one "
        "being captured, 875 GB per writer), got '1000000000000'"]


@pytest.mark.parametrize("changes, field, seen", [
    ({"model": {"parameters": 0}}, "spec.model.parameters", 0),
    ({"model": {"bytesPerParameter": "12.5"}}, "spec.model", {"bytesPerParameter": "12.5"}),
    ({"model": {"parameters": "70G", "checkpointBytes": 0}}, "spec.model.checkpointBytes", 0),
    ({"mtti": "0s", "interval": None}, "spec.mtti", "0s"),
    ({"overlap": "150%"}, "spec.overlap", "150%"),
    ({"caps": {"bandwidth": 0}}, "spec.caps.bandwidth", 0),
    ({"caps": {"bandwidth": "10G", "perDrainer": "20G"}}, "spec.caps.perDrainer", "20G"),
    ({"restore": {"retryDeadline": "0.0s"}}, "spec.restore.retryDeadline", "0.0s"),
    ({"peerTier": "on"}, "spec.peerTier", "on"),
    ({"localTier": {"path": "/mnt/ckptdrain/nvme", "memory": {"sizeLimit": "1Gi"}}},
     "spec.localTier.memory.sizeLimit", "1Gi"),
])
def test_v1beta1_problems_name_the_field_no_v1alpha1_spelling_and_the_value_written(
        changes: dict[str, Any], field: str, seen: object) -> None:
    at_admission, at_operator = beta_problems(**changes)
    for problems in (at_admission, at_operator):
        (problem,) = problems
        # The v1alpha1 text names a v1alpha1 spelling (so this test can tell) ...
        assert V1ALPHA1_ONLY.search(problem.expected), problem.expected
        # ... and the v1beta1 one none, with the value as written at v1beta1.
        told = said.in_version(problem, V1BETA1)
        assert (told.field, told.seen) == (field, seen)
        assert not V1ALPHA1_ONLY.search(told.expected), told.expected


def test_each_v1beta1_text_replaces_v1alpha1_spellings() -> None:
    for v1alpha1, v1beta1 in said.V1BETA1_EXPECTED.items():
        assert V1ALPHA1_ONLY.search(v1alpha1), v1alpha1
        assert not V1ALPHA1_ONLY.search(v1beta1), v1beta1
    assert said.expected_in_v1beta1("spec.restore.retryDeadline", units.DURATION_EXPECTED) \
        .endswith("or 0s")
    assert not said.expected_in_v1beta1("spec.mtti", units.DURATION_EXPECTED).endswith("0s")


@given(st.floats(min_value=1.0, max_value=9.9e17))
def test_a_formatted_amount_becomes_a_v1beta1_quantity_of_the_same_value(size: float) -> None:
    for text, field, kind in ((units.format_bytes(size), "spec.localTier.capacity",
                               spellings.BYTES),
                              (units.format_rate(size), "spec.caps.bandwidth", spellings.RATE)):
        got = said.expected_in_v1beta1(field, f"at least {text} per writer")
        amount = got.removeprefix("at least ").removesuffix(" per writer")
        assert re.fullmatch(r"[0-9]+", amount) or re.fullmatch(V1BETA1_PATTERNS[field], amount)
        read = kind.read(amount)
        assert read is not None and abs(float(read[2]) - size) <= size * 0.006, (text, amount)


def test_the_same_text_for_a_field_of_one_type_in_both_versions_is_left_alone() -> None:
    problem = InvalidInput("spec.localTier.path", "an absolute path under /mnt/ckptdrain",
                           "/etc/ckpt")
    assert str(said.in_version(problem, V1BETA1)) == str(problem)
    # An amount in a field whose type is the same (resources: Kubernetes' own) is kept.
    assert said.expected_in_v1beta1("spec.resources.agent", "at most 8 GB") == "at most 8 GB"


def test_the_message_of_an_invalid_policy_joins_each_problem_said_in_the_version() -> None:
    stored = to_v1alpha1({"apiVersion": V1BETA1, "kind": "CheckpointPolicy", "spec": beta_spec(
        overlap="150%", caps={"bandwidth": 0})})
    with pytest.raises(pol.PolicyInvalid) as raised:
        pol.parse("ml", "llama", stored["spec"], CFG)
    fields = ("spec.overlap", "spec.caps.bandwidth")
    assert said.message(raised.value, dict.fromkeys(fields, V1ALPHA1)) == str(raised.value)
    assert said.message(raised.value, dict.fromkeys(fields, V1BETA1)) == (
        "spec.overlap: expected a percentage in (0%, 100%] such as 10% or 12.5%, got '150%'; "
        "spec.caps.bandwidth: expected a positive rate in bytes per second such as 63G, 500Mi "
        "or 1000000000, got 0")
    # A class that does not take the policy names class fields: said as it is.
    refused = classes.resolve("ml", {"checkpointClassName": "none"}, CFG, {})
    unresolved = classes.ClassUnresolved(refused)
    assert said.message(unresolved, {}) == str(unresolved)


def test_a_problem_whose_writer_is_not_known_expects_v1beta1_spellings_of_the_value_stored(
        ) -> None:
    _, at_operator = beta_problems(
        localTier={"path": "/mnt/ckptdrain/nvme", "keep": 2, "capacity": 1_000_000_000_000},
        interval="0s")
    # No managedFields entry owns the fields (or the owners disagree).
    told = said.message(pol.PolicyInvalid(at_operator), {})
    assert told == (
        "spec.interval: expected a positive Go duration such as 15m, 900s or 1h30m, got '0s'")
    (small,) = beta_problems(localTier={"path": "/mnt/ckptdrain/nvme", "keep": 2,
                                        "capacity": 1_000_000_000_000})[1]
    assert str(said.in_version(small, None)) == (
        "spec.localTier.capacity: expected at least 2.63T (keep=2 checkpoints plus the one "
        "being captured, 875G per writer), got '1000000000000'")
