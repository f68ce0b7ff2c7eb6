"""The CheckpointPolicy CRD's two versions: v1beta1 is v1alpha1 with the
listed fields spelled in Kubernetes' own types, and nothing else apart (a
field, default, enum or rule changed in one entry only fails here); every
v1beta1 spelling is also a v1alpha1 spelling of the same value, which is
what lets conversion keep it verbatim."""

from __future__ import annotations

import copy
import functools
import math
import re
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain import units
from ckptdrain.contract.policy_versions import (
    BYTES_PER_PARAMETER_MAX_LENGTH,
    V1BETA1_PATTERNS,
)

CRD = Path(__file__).resolve().parents[2] / "crds" / "checkpointpolicies.yaml"

DURATION = V1BETA1_PATTERNS["spec.interval"]
BYTES = V1BETA1_PATTERNS["spec.model.checkpointBytes"]
RATE = V1BETA1_PATTERNS["spec.caps.bandwidth"]
#: Every field whose type differs, and its v1beta1 pattern (None: a time).
#: The patterns are the converter's own: what it writes, the CRD admits.
CHANGED: dict[str, str | None] = {
    **V1BETA1_PATTERNS,
    "status.lastRestoreAgreement.startedAt": None,
    "status.lastRestoreFailure.startedAt": None,
    "status.goodput.heldSince": None,
    "status.goodput.endedAt": None,
}
#: Text outside those fields that shows a spelling: (object, key) reworded.
REWORDED = {("spec.model", "x-kubernetes-validations"), ("status.goodput", "description")}


@functools.cache
def _parsed() -> dict[str, Any]:
    return dict(yaml.safe_load(CRD.read_text()))


def _versions() -> dict[str, dict[str, Any]]:
    """The CRD's versions by name, a fresh copy (callers may change it)."""
    return {v["name"]: v for v in copy.deepcopy(_parsed())["spec"]["versions"]}


def _node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        node = node["properties"][part]
    return node


def _schema(version: str) -> dict[str, Any]:
    return dict(_versions()[version]["schema"]["openAPIV3Schema"])


def _common(version: str) -> dict[str, Any]:
    """The schema without the changed fields and reworded texts."""
    schema = copy.deepcopy(_schema(version))
    for path in CHANGED:
        parent, _, name = path.rpartition(".")
        del _node(schema, parent)["properties"][name]
    for path, key in REWORDED:
        del _node(schema, path)[key]
    return schema


def test_both_versions_are_served_and_v1beta1_is_stored() -> None:
    """v1beta1 is stored from 0.3.0, v1alpha1 still served: its rollback
    target, 0.2.0, serves v1beta1 and converts, so it reads every object
    (docs/api-versions.md, "Storage: v1beta1 from 0.3.0")."""
    versions = _versions()
    assert list(versions) == ["v1alpha1", "v1beta1"]
    assert (versions["v1alpha1"]["served"], versions["v1alpha1"]["storage"]) == (True, False)
    assert (versions["v1beta1"]["served"], versions["v1beta1"]["storage"]) == (True, True)
    for key in ("subresources", "additionalPrinterColumns"):
        assert versions["v1beta1"][key] == versions["v1alpha1"][key], key


def test_the_versions_differ_only_in_the_listed_fields() -> None:
    """Same fields, defaults, enums, bounds, descriptions and rules elsewhere."""
    assert _common("v1beta1") == _common("v1alpha1")


def test_the_comparison_sees_a_change_made_in_one_version_only() -> None:
    changed = _common("v1beta1")
    _node(changed, "spec.storage")["properties"]["keep"]["default"] = 4
    assert changed != _common("v1alpha1")


@pytest.mark.parametrize("path", sorted(CHANGED))
def test_each_listed_field_has_its_v1beta1_type(path: str) -> None:
    old, new = _node(_schema("v1alpha1"), path), _node(_schema("v1beta1"), path)
    pattern = CHANGED[path]
    if pattern is None:
        assert old["type"] == "number"
        assert (new["type"], new["format"]) == ("string", "date-time")
        assert new.get("nullable") == old.get("nullable")
        return
    assert new["pattern"] == pattern == V1BETA1_PATTERNS[path]
    assert new.get("default") == old.get("default")
    if pattern == DURATION or path == "spec.overlap":
        assert new["type"] == "string" and "x-kubernetes-int-or-string" not in new
    else:
        assert new["x-kubernetes-int-or-string"] is True
        assert new["anyOf"] == [{"type": "integer"}, {"type": "string"}]
        assert "type" not in new
    # A rule of v1alpha1 carries over, adapted to the new spelling.
    assert len(new.get("x-kubernetes-validations", [])) >= len(
        old.get("x-kubernetes-validations", []))


def test_every_converter_pattern_is_the_crds() -> None:
    """What the converter writes is what the CRD admits, and nothing more."""
    schema = _schema("v1beta1")
    for path, pattern in V1BETA1_PATTERNS.items():
        assert _node(schema, path)["pattern"] == pattern, path
    per_parameter = _node(schema, "spec.model.bytesPerParameter")
    assert per_parameter["maxLength"] == BYTES_PER_PARAMETER_MAX_LENGTH


def test_descriptions_of_the_listed_fields_use_the_new_spellings() -> None:
    schema = yaml.safe_dump(_schema("v1beta1"), width=10**6)
    for old_spelling in ("405B", "5.67TB", "10GB/s", "2GB/s", "8TB", "64GB", "2TB", "or 0.1",
                         "Unix"):
        assert old_spelling not in schema, old_spelling


# -- every v1beta1 spelling is a v1alpha1 spelling of the same value --------

_SI = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_BINARY = {f"{p}i": 2 ** (10 * (n + 1)) for n, p in enumerate("KMGTPE")}
_SECONDS = {"h": Fraction(3600), "m": Fraction(60), "s": Fraction(1), "ms": Fraction(1, 1000)}


def _quantity(text: str) -> Fraction:
    """A Kubernetes quantity's exact value (decimal SI, binary or an exponent)."""
    number = re.fullmatch(r"[0-9]+(\.[0-9]+)?", text)
    if number:
        return Fraction(Decimal(text))
    head = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([eE][+-]?[0-9]+|[kMGTPE]|[KMGTPE]i)", text)
    assert head, text
    mantissa, suffix = Fraction(Decimal(head[1])), head[2]
    if suffix[0] in "eE" and suffix[1:2] not in ("", "i"):  # not exa ("E", "Ei")
        # Past ±400 no float holds it either: clamp, not a huge power.
        return mantissa * Fraction(10) ** max(-400, min(400, int(suffix[1:])))
    return mantissa * (_BINARY.get(suffix) or _SI[suffix])


def _go_duration(text: str) -> Fraction:
    return sum((Fraction(Decimal(n)) * _SECONDS[u]
                for n, _, u in re.findall(r"([0-9]+(\.[0-9]+)?)(ms|h|m|s)", text)), Fraction(0))


def _close(a: float, b: Fraction) -> bool:
    return math.isclose(a, float(b), rel_tol=1e-9, abs_tol=1e-9)


def _v1alpha1_pattern(path: str) -> str:
    version = _parsed()["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    return str(_node(version["schema"]["openAPIV3Schema"], path)["pattern"])


def _spellings(path: str) -> st.SearchStrategy[str]:
    pattern = CHANGED[path]
    assert pattern is not None
    return st.from_regex(pattern, fullmatch=True)


@given(st.data())
def test_a_v1beta1_size_or_rate_reads_the_same_in_v1alpha1(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from([p for p, r in CHANGED.items() if r in (BYTES, RATE)]))
    text = data.draw(_spellings(path))
    assert re.fullmatch(_v1alpha1_pattern(path), text), (path, text)
    value = _quantity(text)
    if value >= Fraction(10) ** 300:
        return  # past a float: v1alpha1 refuses it, and so does any real size
    if CHANGED[path] == BYTES:
        assert units.parse_bytes(path, text) == round(value) or _close(
            units.parse_bytes(path, text), value)
    elif value > 0:
        assert _close(units.parse_rate(path, text), value), (path, text)


@given(st.data())
def test_a_v1beta1_count_reads_the_same_in_v1alpha1(data: st.DataObject) -> None:
    text = data.draw(_spellings("spec.model.parameters"))
    assert re.fullmatch(_v1alpha1_pattern("spec.model.parameters"), text), text
    value = _quantity(text)
    # Past a float's range v1alpha1 refuses the count, as the webhook refuses
    # any count that rounds to zero parameters.
    if Fraction(1, 10**300) < value < Fraction(10) ** 300:
        assert _close(units.parse_count("spec.model.parameters", text), value), text


@given(st.data())
def test_a_v1beta1_duration_reads_the_same_in_v1alpha1(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from([p for p, r in CHANGED.items() if r == DURATION]))
    text = data.draw(_spellings(path))
    assert re.fullmatch(_v1alpha1_pattern(path), text), (path, text)
    value = _go_duration(text)
    if value > 0:
        assert _close(units.parse_duration(path, text), value), text


@given(st.data())
def test_a_v1beta1_overlap_reads_the_same_in_v1alpha1(data: st.DataObject) -> None:
    text = data.draw(_spellings("spec.overlap"))
    assert re.fullmatch(_v1alpha1_pattern("spec.overlap"), text), text
    value = Fraction(Decimal(text[:-1])) / 100
    if 0 < value <= 1:
        assert _close(units.parse_fraction("spec.overlap", text), value), text


def test_the_brief_examples_read_as_written() -> None:
    """A few values by hand, so the helpers above are not trusted blindly."""
    assert _quantity("405G") == 405 * 10**9
    assert _quantity("1.5Ti") == Fraction(3, 2) * 2**40
    assert _quantity("4.05e11") == 405 * 10**9
    assert _quantity("2E") == 2 * 10**18
    assert _go_duration("1h30m") == 5400
    assert _go_duration("1.5ms") == Fraction(3, 2000)
    assert units.parse_bytes("f", "5.67T") == 5_670_000_000_000
    assert units.parse_duration("f", "24h") == 86400
