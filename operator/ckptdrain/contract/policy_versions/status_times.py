"""The status times v1alpha1 keeps as Unix seconds (a JSON number) and
v1beta1 as RFC3339 strings, UTC, to the microsecond
("2026-11-30T01:02:03.123456Z"). Pure.

A double tells apart every microsecond of Unix time until 2^33 s (the year
2242), so until then a v1beta1 time written the way this module writes it
comes back from v1alpha1 unchanged.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from fractions import Fraction

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RFC3339 = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt](?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2})"
    r"(?:\.(?P<fraction>[0-9]{1,18}))?(?P<zone>[Zz]|[+-][0-9]{2}:[0-9]{2})")


def to_rfc3339(value: object) -> object:
    """Unix seconds as an RFC3339 UTC time with microseconds; anything else
    (null, a string, a time no calendar holds) unchanged."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    try:
        micros = round(Fraction(value) * 10**6)
        moment = _EPOCH + timedelta(microseconds=micros)
    except (ValueError, OverflowError):  # NaN, infinity, past year 9999
        return value
    return moment.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def to_unix_seconds(value: object) -> object:
    """An RFC3339 time as Unix seconds (a float); anything else unchanged."""
    if not isinstance(value, str):
        return value
    match = _RFC3339.fullmatch(value)
    if not match:
        return value
    zone = match["zone"].upper()
    try:
        moment = datetime.fromisoformat(
            f"{match['date']}T{match['time']}{'+00:00' if zone == 'Z' else zone}")
    except ValueError:  # month 13, hour 25, a leap second
        return value
    whole = (moment - _EPOCH) // timedelta(seconds=1)
    fraction = Fraction(int(match["fraction"]), 10 ** len(match["fraction"])) \
        if match["fraction"] else Fraction(0)
    return float(whole + fraction)
