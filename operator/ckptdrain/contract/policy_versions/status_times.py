"""The status times v1alpha1 keeps as Unix seconds (a JSON number) and
v1beta1 as RFC3339 strings, UTC, to the microsecond
("2026-11-30T01:02:03.123456Z"). Pure.

A double tells apart every microsecond of Unix time until 2^33 s (the year
2242), so until then a v1beta1 time written the way this module writes it
comes back from v1alpha1 unchanged. The times inside status.goodput's
interruptions (preserved, not in the schema) convert the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
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


#: The Unix-seconds times of one interruption in status.goodput.recent and
#: status.goodput.lastInterruption (ckptdrain.goodput: interruption, attach,
#: summary): the interruption, its restore's start, the replacement on a
#: node, training again; and `completed`, the completion time of each
#: restorable step.
INTERRUPTION_TIMES = ("at", "restoreStartedAt", "resourcesAt", "trainingAt")


def _interruption(entry: object, convert: Callable[[object], object]) -> object:
    if not isinstance(entry, dict):
        return entry
    out = dict(entry)
    for key in INTERRUPTION_TIMES:
        if key in out:
            out[key] = convert(out[key])
    if isinstance(out.get("completed"), dict):
        out["completed"] = {step: convert(t) for step, t in out["completed"].items()}
    return out


def interruption_to_rfc3339(entry: object) -> object:
    """One interruption with its times as RFC3339; anything else unchanged."""
    return _interruption(entry, to_rfc3339)


def interruption_to_unix_seconds(entry: object) -> object:
    """One interruption with its times as Unix seconds; anything else unchanged."""
    return _interruption(entry, to_unix_seconds)


def interruptions_to_rfc3339(entries: object) -> object:
    """Each interruption of a list with its times as RFC3339."""
    return [interruption_to_rfc3339(e) for e in entries] if isinstance(entries, list) \
        else entries


def interruptions_to_unix_seconds(entries: object) -> object:
    """Each interruption of a list with its times as Unix seconds."""
    return [interruption_to_unix_seconds(e) for e in entries] if isinstance(entries, list) \
        else entries
