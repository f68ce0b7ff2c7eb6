"""Properties of the v1alpha1 <-> v1beta1 conversion, over every spelling
each version's patterns take: v1beta1 -> v1alpha1 -> v1beta1 is exact;
v1alpha1 -> v1beta1 -> v1alpha1 keeps the value ckptdrain.units reads; and
each side only ever writes spellings its own CRD pattern takes (v1alpha1's
read from crds/checkpointpolicies.yaml, v1beta1's from V1BETA1_PATTERNS)."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_policy_versions import down, up, v1alpha1_schema

from ckptdrain import units
from ckptdrain.contract import policy_versions as pv
from ckptdrain.contract.policy_versions import spellings
from ckptdrain.errors import InvalidInput
from ckptdrain.quantity import parse_quantity

PROPERTY = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

COUNT = ["spec.model.parameters"]
BYTES = ["spec.model.checkpointBytes", "spec.localTier.capacity",
         "spec.localTier.memory.sizeLimit", "spec.peerTier.capacity"]
RATES = ["spec.caps.bandwidth", "spec.caps.perDrainer"]
DURATIONS = ["spec.interval", "spec.mtti", "spec.localWriteTime", "spec.restore.retryDeadline",
             "spec.restore.agreementTimeout", "spec.drain.stallTimeout"]
AMOUNTS = COUNT + BYTES + RATES
STRINGS = AMOUNTS + DURATIONS + ["spec.overlap"]
#: Interruptions: objects whose times convert, in status.goodput.
INTERRUPTIONS = ["status.goodput.lastInterruption", "status.goodput.recent"]
TIMES = [p for p in pv.FIELDS if p.startswith("status.") and p not in INTERRUPTIONS]
#: What v1alpha1 means by each string field, as the operator reads it.
READ: dict[str, Callable[[str, object], float]] = {
    **dict.fromkeys(COUNT, units.parse_count), **dict.fromkeys(BYTES, units.parse_bytes),
    **dict.fromkeys(RATES, units.parse_rate), **dict.fromkeys(DURATIONS, units.parse_duration),
    "spec.overlap": units.parse_fraction,
}
KIND = {**dict.fromkeys(COUNT, spellings.COUNT), **dict.fromkeys(BYTES, spellings.BYTES),
        **dict.fromkeys(RATES, spellings.RATE)}


@functools.cache
def v1alpha1_pattern(path: str) -> str:
    # Go's \s is ASCII whitespace; Python's, in a str pattern, is Unicode's.
    return v1alpha1_schema(path)["pattern"].replace(r"\s", r"[ \t\n\f\r]")


def units_read(path: str, value: object) -> float | None:
    try:
        return READ[path](path, value)
    except InvalidInput:
        return None


def exact(path: str, value: str) -> Fraction | None:
    if path in KIND:
        read = KIND[path].read(value)
        return None if read is None else read[2]
    if path in DURATIONS:
        return spellings.read_duration(value)
    number = Fraction(value.strip().rstrip("%").strip())
    return number / 100 if value.strip().endswith("%") else number


# -- v1alpha1 -> v1beta1 -> v1alpha1 -------------------------------------------


@pytest.mark.parametrize("path", STRINGS)
@PROPERTY
@given(data=st.data())
def test_v1alpha1_values_survive_a_trip_through_v1beta1(path: str, data: st.DataObject) -> None:
    written = data.draw(st.from_regex(v1alpha1_pattern(path), fullmatch=True))
    operator_reads = units_read(path, written)
    assume(operator_reads is not None)
    v1beta1 = up(path, written)
    if isinstance(v1beta1, str):
        assert re.fullmatch(pv.V1BETA1_PATTERNS[path], v1beta1), (written, v1beta1)
    else:
        assert path in AMOUNTS and isinstance(v1beta1, int) and 0 <= v1beta1 < 2**63
    back = down(path, v1beta1)
    assert isinstance(back, str) and re.search(v1alpha1_pattern(path), back), (written, back)
    assert exact(path, back) == exact(path, written)
    again = units_read(path, back)
    assert again is not None and math.isclose(again, operator_reads, rel_tol=1e-12, abs_tol=1e-9)
    if re.fullmatch(pv.V1BETA1_PATTERNS[path], written):
        assert v1beta1 == back == written


@PROPERTY
@given(st.floats(min_value=1e-9, max_value=1e12, allow_nan=False, allow_infinity=False)
       | st.integers(min_value=1, max_value=2**53))
def test_bytes_per_parameter_survives_a_trip_through_v1beta1(written: float) -> None:
    path = "spec.model.bytesPerParameter"
    v1beta1 = up(path, written)
    if isinstance(v1beta1, str):
        assert re.fullmatch(pv.V1BETA1_PATTERNS[path], v1beta1), (written, v1beta1)
    else:
        assert isinstance(v1beta1, int)
    back = down(path, v1beta1)
    assert back == written and isinstance(back, int | float)


@pytest.mark.parametrize("path", TIMES)
@PROPERTY
@given(written=st.floats(min_value=-2e9, max_value=7e9, allow_nan=False)
       | st.integers(min_value=0, max_value=7 * 10**9))
def test_v1alpha1_times_survive_a_trip_through_v1beta1_to_the_microsecond(
        path: str, written: float) -> None:
    v1beta1 = up(path, written)
    assert isinstance(v1beta1, str) and re.fullmatch(
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z", v1beta1), v1beta1
    assert datetime.fromisoformat(v1beta1).tzinfo == UTC
    back = down(path, v1beta1)
    # Rounded to the microsecond, then to the nearest double.
    assert isinstance(back, float) and abs(back - written) <= 5e-7 + math.ulp(written)


# -- v1beta1 -> v1alpha1 -> v1beta1 ------------------------------------------------


def v1beta1_values(path: str) -> st.SearchStrategy[object]:
    strings = st.from_regex(pv.V1BETA1_PATTERNS[path], fullmatch=True)
    if path == "spec.model.bytesPerParameter":
        return strings.filter(lambda s: len(s) <= pv.BYTES_PER_PARAMETER_MAX_LENGTH) \
            | st.integers(min_value=1, max_value=2**63 - 1)
    if path in AMOUNTS:
        return strings | st.integers(min_value=0, max_value=2**63 - 1)
    return strings


def kubernetes_meaning(path: str, value: object) -> Fraction | None:
    """What a v1beta1 value means the Kubernetes way, independent of units.py."""
    if path in AMOUNTS:
        try:
            return parse_quantity(path, value)
        except InvalidInput:  # an exponent past a quantity's 18
            return None
    if path in DURATIONS:  # Go's time.ParseDuration
        seconds = {"h": 3600, "m": 60, "s": 1, "ms": Fraction(1, 1000)}
        return sum((Fraction(n) * seconds[u] for n, u in
                    re.findall(r"([0-9.]+)(ms|h|m|s)", str(value))), Fraction(0))
    return Fraction(str(value).rstrip("%")) / 100


@pytest.mark.parametrize("path", [*STRINGS, "spec.model.bytesPerParameter"])
@PROPERTY
@given(data=st.data())
def test_v1beta1_values_come_back_from_v1alpha1_exactly(path: str, data: st.DataObject) -> None:
    written = data.draw(v1beta1_values(path))
    v1alpha1 = down(path, written)
    if path == "spec.model.bytesPerParameter":
        assert isinstance(v1alpha1, int | float) and Fraction(v1alpha1) == \
            Fraction(float(written) if isinstance(written, str) else written)
    else:
        assert isinstance(v1alpha1, str) and re.search(v1alpha1_pattern(path), v1alpha1), (
            written, v1alpha1)
        meaning, read = kubernetes_meaning(path, written), units_read(path, v1alpha1)
        if meaning is not None and read is not None:
            assert math.isclose(read, meaning, rel_tol=1e-12, abs_tol=0.5)
    back = up(path, v1alpha1)
    assert back == written and type(back) is type(written)


@pytest.mark.parametrize("path", TIMES)
@PROPERTY
@given(moment=st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1),
                           timezones=st.just(UTC)))
def test_v1beta1_times_come_back_from_v1alpha1_exactly(path: str, moment: datetime) -> None:
    written = moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    v1alpha1 = down(path, written)
    assert isinstance(v1alpha1, float)
    assert abs(v1alpha1 - moment.timestamp()) < 1e-6
    assert up(path, v1alpha1) == written


def test_the_v1beta1_patterns_refuse_what_would_not_come_back() -> None:
    """Spellings the narrowed patterns leave out, each for its reason."""
    refused = [("spec.model.parameters", "405000000000"),  # an integer, not digits
               ("spec.model.parameters", "1P"), ("spec.model.parameters", "405B"),
               ("spec.model.bytesPerParameter", "14"), ("spec.model.bytesPerParameter", "12.50"),
               ("spec.model.checkpointBytes", "5.67TB"), ("spec.model.checkpointBytes", "1e-3"),
               ("spec.caps.bandwidth", "1E"), ("spec.caps.bandwidth", "1e9"),
               ("spec.caps.bandwidth", "10G/s"), ("spec.interval", "1d"), ("spec.interval", "90"),
               ("spec.interval", "5us"), ("spec.overlap", "0.1")]
    for path, value in refused:
        assert not re.fullmatch(pv.V1BETA1_PATTERNS[path], value), (path, value)
    assert all(re.search(v1alpha1_pattern(p), v) for p, v in [
        ("spec.model.parameters", "405000000000"), ("spec.caps.bandwidth", "10G"),
        ("spec.interval", "1h30m")])


# -- the times inside status.goodput's interruptions ---------------------------------

_UNIX = st.floats(min_value=0, max_value=7e9, allow_nan=False)
_ENTRIES = st.fixed_dictionaries(
    {"pod": st.just("p-0"), "at": _UNIX},
    optional={"restoreStartedAt": _UNIX, "resourcesAt": _UNIX, "trainingAt": _UNIX,
              "lostSeconds": _UNIX, "recoverySeconds": _UNIX,
              "completed": st.dictionaries(st.integers(0, 99).map(str), _UNIX, max_size=3)})


def _times(entry: dict[str, Any]) -> list[tuple[str, Any]]:
    keys = ("at", "restoreStartedAt", "resourcesAt", "trainingAt")
    return [(k, entry[k]) for k in keys if k in entry] + [
        (f"completed.{s}", t) for s, t in (entry.get("completed") or {}).items()]


@PROPERTY
@given(entries=st.lists(_ENTRIES, min_size=1, max_size=3))
def test_interruption_times_survive_a_trip_through_v1beta1(
        entries: list[dict[str, Any]]) -> None:
    v1beta1 = up("status.goodput.recent", entries)
    assert isinstance(v1beta1, list)
    for entry in v1beta1:
        for key, value in _times(entry):
            assert isinstance(value, str) and value.endswith("Z"), (key, value)
        for duration in ("lostSeconds", "recoverySeconds"):
            assert entry.get(duration) == entries[v1beta1.index(entry)].get(duration)
    back = down("status.goodput.recent", v1beta1)
    assert isinstance(back, list) and len(back) == len(entries)
    for written, returned in zip(entries, back, strict=True):
        assert [k for k, _ in _times(returned)] == [k for k, _ in _times(written)]
        for (_, a), (_, b) in zip(_times(written), _times(returned), strict=True):
            assert isinstance(b, float) and abs(b - float(a)) <= 5e-7 + math.ulp(float(a))
    # And v1beta1 -> v1alpha1 -> v1beta1 is exact.
    assert up("status.goodput.recent", back) == v1beta1
    last = up("status.goodput.lastInterruption", entries[0])
    assert last == v1beta1[0]
