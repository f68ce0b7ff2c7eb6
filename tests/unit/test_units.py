"""Human units: what people type parses to the right number; bad input names the field."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain import units
from ckptdrain.errors import InvalidInput


@pytest.mark.parametrize(("text", "value"), [
    ("405B", 405e9), ("4.05e11", 4.05e11), ("70M", 70e6), ("1.5T", 1.5e12), (12, 12.0),
])
def test_counts(text: object, value: float) -> None:
    assert units.parse_count("parameters", text) == pytest.approx(value)


@pytest.mark.parametrize(("text", "value"), [
    ("5.67TB", 5_670_000_000_000), ("500MiB", 500 << 20), ("1048576", 1 << 20), ("0", 0),
    ("64 MiB", 64 << 20),
])
def test_sizes(text: str, value: int) -> None:
    assert units.parse_bytes("size", text) == value


@pytest.mark.parametrize(("text", "value"), [
    ("63GB/s", 63e9), ("500MiB/s", 500 * 2**20), ("1e9", 1e9), ("50MB/s", 50e6),
])
def test_rates(text: str, value: float) -> None:
    assert units.parse_rate("rate", text) == pytest.approx(value)


@pytest.mark.parametrize(("text", "value"), [
    ("15m", 900), ("900s", 900), ("1h30m", 5400), ("1.5h", 5400), ("90", 90), ("250ms", 0.25),
])
def test_durations(text: str, value: float) -> None:
    assert units.parse_duration("interval", text) == pytest.approx(value)


@pytest.mark.parametrize(("text", "value"), [("10%", 0.1), ("0.1", 0.1), ("100%", 1.0)])
def test_fractions(text: str, value: float) -> None:
    assert units.parse_fraction("overlap", text) == pytest.approx(value)


@pytest.mark.parametrize(("parse", "text"), [
    (units.parse_count, "405X"), (units.parse_count, "-1B"), (units.parse_count, "0"),
    (units.parse_bytes, "5 parsecs"), (units.parse_bytes, "-1MB"),
    (units.parse_rate, "0MB/s"), (units.parse_rate, "fast"),
    (units.parse_duration, "15 minutes"), (units.parse_duration, "0s"), (units.parse_duration, "m"),
    (units.parse_fraction, "150%"), (units.parse_fraction, "0"), (units.parse_fraction, "ten"),
    (units.parse_positive_int, "0"), (units.parse_positive_int, "1.5"),
    (units.parse_count, "nan"), (units.parse_bytes, "inf"), (units.parse_count, True),
])
def test_bad_values_name_the_field(parse, text: object) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidInput) as err:
        parse("my-field", text)
    assert err.value.field == "my-field"
    assert str(err.value).startswith("my-field: expected ")
    assert str(text) in str(err.value)  # what was seen


# Exact up to 2**53 (9 PB): sizes go through a float on the way.
@given(st.integers(min_value=0, max_value=2**53))
def test_plain_byte_counts_round_trip(n: int) -> None:
    assert units.parse_bytes("size", str(n)) == n


@given(st.floats(min_value=1, max_value=1e15, allow_nan=False))
def test_formatted_sizes_parse_back_within_rounding(n: float) -> None:
    text = units.format_bytes(n).replace(" ", "")
    assert units.parse_bytes("size", text) == pytest.approx(n, rel=0.01, abs=1)


@given(st.floats(min_value=0, max_value=1e18, allow_nan=False))
def test_a_bound_rounded_up_or_down_is_met_by_the_amount_shown(n: float) -> None:
    assert units.parse_bytes("size", units.format_bytes(n, units.UP)) >= n
    assert units.parse_bytes("size", units.format_bytes(n, units.DOWN)) <= n
    rate = max(n, 1.0)  # a rate is positive
    assert units.parse_rate("rate", units.format_rate(rate, units.DOWN)) <= rate


def test_bounds_round_away_from_what_they_refuse_and_exact_ones_stay() -> None:
    # 3 * 437.5 GB: to the nearest, 1.31 TB, which a capacity of at least
    # 1.3125 TB refuses.
    assert units.format_bytes(1.3125e12) == "1.31 TB"
    assert units.format_bytes(1.3125e12, units.UP) == "1.32 TB"
    assert units.format_bytes(1.3125e12, units.DOWN) == "1.31 TB"
    assert units.format_bytes(1.31e12, units.UP) == units.format_bytes(1.31e12, units.DOWN) \
        == "1.31 TB"
    assert units.format_rate(9.996e9, units.DOWN) == "9.99 GB/s"
    assert units.format_bytes(0.4, units.UP) == "1 B"


def test_formatting() -> None:
    assert units.format_rate(63e9) == "63.0 GB/s"
    assert units.format_bytes(5.67e12) == "5.67 TB"
    assert units.format_duration(5400) == "1h30m"
    assert units.format_percent(0.1) == "10%"


def test_whole_numbers_around_ascii_separators_are_read_not_a_crash() -> None:
    # \s matches the separators \x1c-\x1f and int() does not: they are
    # whitespace to both now.
    assert units.parse_positive_int("f", "5\x1f") == 5
    with pytest.raises(InvalidInput) as err:
        units.parse_positive_int("f", "0\x1f")
    assert err.value.field == "f"
