"""Each CheckpointPolicy value whose type differs between v1alpha1 and
v1beta1, spelled both ways, exactly. Pure.

v1alpha1 is read with the grammar of `ckptdrain.units` (the one the operator
uses), without its range checks: a zero, an overlap above 100% or a size past
a float's range is still the same value in the other version, and refusing it
is admission's job in both. Values are `Fraction`s, never floats, so no
value moves by rounding. A string no grammar reads comes back unchanged.

v1beta1 spellings are chosen so that every one is also a valid v1alpha1
spelling of the same value, kept verbatim on the way back; the patterns are
V1BETA1_PATTERNS (the v1beta1 CRD copies them). They narrow the issue's
table twice:
- an int-or-string field takes a number of plain digits as an integer only
  (`405000000000`, not `"405000000000"`): v1alpha1 has one spelling for both,
  so a digit string could not come back as it was written;
- bytesPerParameter, a JSON number in v1alpha1, takes as a string only a
  decimal with a fraction, no trailing zero, at most 15 digits (`"12.5"`):
  exactly the strings a double brings back unchanged (whole numbers are
  integers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

# The number grammar of ckptdrain.units (its _NUMBER). Its magnitude is
# bounded before any arithmetic: 1e999999999 is not worth a billion-digit
# integer.
_NUMBER = r"(?P<num>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
_MAX_EXPONENT = 400
#: Nor is a number of more digits than this (Python refuses to read an
#: integer of over 4300 digits at all).
_MAX_DIGITS = 1000
#: Longest spelling written: the v1alpha1 string fields allow 256 characters.
_MAX_LENGTH = 256
#: Integers beyond int64 do not survive the apiserver's JSON.
_INT64_MAX = 2**63 - 1

_DIGITS = r"[0-9]+(\.[0-9]+)?"
_BYTES_PATTERN = (r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|[kMGTPE]|[KMGTPE]i)$|^[0-9]+\.[0-9]+$")
_RATE_PATTERN = r"^[0-9]+(\.[0-9]+)?([kMGTP]|[KMGTP]i)$|^[0-9]+\.[0-9]+$"
_DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(h|m|s|ms))+$"

#: The pattern of each v1beta1 string spelling, by field. Integers (and
#: bytesPerParameter's JSON integers) are not strings and meet no pattern.
V1BETA1_PATTERNS: Mapping[str, str] = {
    "spec.model.parameters": r"^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+|[kMGT])$|^[0-9]+\.[0-9]+$",
    "spec.model.bytesPerParameter": r"^(0|[1-9][0-9]*)\.[0-9]*[1-9]$",
    "spec.model.checkpointBytes": _BYTES_PATTERN,
    "spec.localTier.capacity": _BYTES_PATTERN,
    "spec.localTier.memory.sizeLimit": _BYTES_PATTERN,
    "spec.peerTier.capacity": _BYTES_PATTERN,
    "spec.caps.bandwidth": _RATE_PATTERN,
    "spec.caps.perDrainer": _RATE_PATTERN,
    "spec.interval": _DURATION_PATTERN,
    "spec.mtti": _DURATION_PATTERN,
    "spec.localWriteTime": _DURATION_PATTERN,
    "spec.restore.retryDeadline": _DURATION_PATTERN,
    "spec.restore.agreementTimeout": _DURATION_PATTERN,
    "spec.drain.stallTimeout": _DURATION_PATTERN,
    "spec.overlap": r"^([0-9]+(\.[0-9]+)?)%$",
}
#: bytesPerParameter as a string: at most 15 digits, which a double keeps.
BYTES_PER_PARAMETER_MAX_LENGTH = 16


# -- exact numbers ---------------------------------------------------------


def exact_number(text: str) -> Fraction | None:
    """The value of a number in units' grammar (405, 1.5, .5, 4.05e11), or
    None when its magnitude is past any sane size (0e9000 is still 0)."""
    if len(text) > _MAX_DIGITS or not re.fullmatch(_NUMBER, text):
        return None
    mantissa, _, exponent = text.lower().partition("e")
    whole, _, fraction = mantissa.partition(".")
    significant = (whole + fraction).lstrip("0")
    if not significant:
        return Fraction(0)
    scale = int(exponent or "0") - len(fraction)
    if abs(scale + len(significant) - 1) > _MAX_EXPONENT:  # the leading digit's power of 10
        return None
    return int(significant) * Fraction(10) ** scale


def plain_decimal(value: Fraction) -> str | None:
    """`value` in plain decimal digits, no exponent, no trailing zero
    (12.5, 0.001, 405), or None when it has no finite decimal form."""
    if value < 0:
        return None
    denominator, twos, fives = value.denominator, 0, 0
    while denominator % 2 == 0:
        denominator, twos = denominator // 2, twos + 1
    while denominator % 5 == 0:
        denominator, fives = denominator // 5, fives + 1
    if denominator != 1:
        return None
    places = max(twos, fives)
    digits = str(value.numerator * 10**places // value.denominator).rjust(places + 1, "0")
    if not places:
        return digits
    whole, fraction = digits[:-places], digits[-places:].rstrip("0")
    return f"{whole}.{fraction}" if fraction else whole


# -- counts, sizes and rates ----------------------------------------------------


_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def _byte_units() -> dict[str, tuple[int, str]]:
    """units' byte suffixes, each with its factor and its v1beta1 suffix."""
    table = {"": (1, ""), "b": (1, ""), "B": (1, ""), "K": (10**3, "k"), "KB": (10**3, "k")}
    for suffix, factor in _SI.items():
        table[suffix] = table[suffix + "B"] = (factor, suffix)
    for suffix, factor in _IEC.items():
        table[suffix] = table[suffix + "B"] = (factor, suffix)
    return table


@dataclass(frozen=True)
class Amount:
    """A kind of int-or-string amount: its v1alpha1 units (each with its
    factor and v1beta1 suffix), its v1beta1 pattern, the suffixes and
    exponents a v1beta1 spelling may use."""

    units: Mapping[str, tuple[int, str]]
    pattern: str
    suffixes: Mapping[str, int]
    exponent: str  # "signed", "unsigned" or "" (none)
    per_second: bool = False

    def read(self, value: str) -> tuple[str, str, Fraction] | None:
        """The number, unit and exact value of a v1alpha1 spelling."""
        text = value.strip()
        if self.per_second and text.endswith("/s"):
            text = text[:-2].strip()
        match = re.fullmatch(_NUMBER + r"\s*(?P<unit>[A-Za-z/%]*)", text)
        if not match or match["unit"] not in self.units:
            return None
        number = exact_number(match["num"])
        if number is None:
            return None
        return match["num"], match["unit"], number * self.units[match["unit"]][0]

    def spell(self, value: Fraction) -> int | str | None:
        """The v1beta1 spelling of an exact amount: an integer when it is
        whole (and fits int64), else the shortest string the pattern takes."""
        if value.denominator == 1 and 0 <= value <= _INT64_MAX:
            return int(value)
        candidates = [f"{text}{suffix}" for suffix, factor in self.suffixes.items()
                      if (text := plain_decimal(value / factor)) is not None]
        candidates += [text for text in (plain_decimal(value), self._exponent_form(value))
                       if text is not None]
        fitting = [c for c in candidates if len(c) <= _MAX_LENGTH
                   and re.fullmatch(self.pattern, c)]
        return min(fitting, key=len, default=None)

    def _exponent_form(self, value: Fraction) -> str | None:
        digits = plain_decimal(value)
        if not self.exponent or digits is None or digits == "0":
            return None
        whole, _, fraction = digits.partition(".")
        if fraction:
            mantissa, exponent = (whole + fraction).lstrip("0"), -len(fraction)
        else:
            mantissa = whole.rstrip("0")
            exponent = len(whole) - len(mantissa)
        if exponent < 0 and self.exponent != "signed":
            return None
        return f"{mantissa}e{exponent}"


COUNT = Amount(
    units={"": (1, ""), "k": (10**3, "k"), "K": (10**3, "k"), "M": (10**6, "M"),
           "B": (10**9, "G"), "G": (10**9, "G"), "T": (10**12, "T")},
    pattern=V1BETA1_PATTERNS["spec.model.parameters"],
    suffixes={s: _SI[s] for s in "TGMk"}, exponent="signed")
BYTES = Amount(units=_byte_units(), pattern=_BYTES_PATTERN,
               suffixes={**_SI, **_IEC}, exponent="unsigned")
RATE = Amount(units=_byte_units(), pattern=_RATE_PATTERN,
              suffixes={s: f for s, f in {**_SI, **_IEC}.items() if s[0] != "E"},
              exponent="", per_second=True)


def amount_to_v1beta1(kind: Amount, value: object) -> object:
    """A v1alpha1 count, size or rate string in v1beta1: kept when v1beta1
    takes it, else the same digits with v1beta1's suffix (405B -> 405G,
    10GB/s -> 10G), else the value spelled afresh; unchanged when unread."""
    if not isinstance(value, str):
        return value
    if re.fullmatch(kind.pattern, value):
        return value
    read = kind.read(value)
    if read is None:
        return value
    number, unit, exact = read
    respelled = number + kind.units[unit][1]
    if re.fullmatch(kind.pattern, respelled):
        return respelled
    spelled = kind.spell(exact)
    return value if spelled is None else spelled


def amount_to_v1alpha1(value: object) -> object:
    """A v1beta1 count, size or rate in v1alpha1: a string is one already;
    an integer becomes its digits."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    return value


# -- bytesPerParameter ---------------------------------------------------------


def per_parameter_to_v1beta1(value: object) -> object:
    """A JSON number in v1beta1: a whole one as an integer (14), else the
    shortest decimal that reads back as the same double ("12.5")."""
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    if value != value or value in (float("inf"), float("-inf")):
        return value
    if value.is_integer():  # beyond int64 no integer survives the apiserver
        return int(value) if abs(value) <= _INT64_MAX else value
    if value <= 0:
        return value
    # repr is the shortest decimal that reads back as this double.
    return format(Decimal(repr(value)), "f")


def per_parameter_to_v1alpha1(value: object) -> object:
    """A v1beta1 bytesPerParameter as a JSON number: "12.5" -> 12.5."""
    if not isinstance(value, str) or not re.fullmatch(_DIGITS, value):
        return value
    if "." not in value:
        return int(value)
    number = float(value)
    return number if number != float("inf") else value


# -- durations -------------------------------------------------------------------


_SECONDS = {"ms": Fraction(1, 1000), "s": Fraction(1), "m": Fraction(60),
            "h": Fraction(3600), "d": Fraction(86400)}


def read_duration(value: str) -> Fraction | None:
    """Seconds of a v1alpha1 duration (15m, 1d, 1h30m, 90), exactly."""
    text = value.strip()
    if len(text) > _MAX_DIGITS:
        return None
    if re.fullmatch(_NUMBER, text):
        return exact_number(text)
    text = text.replace(" ", "")
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum((Fraction(Decimal(n)) * _SECONDS[u] for n, u in parts), Fraction(0))


def spell_duration(seconds: Fraction) -> str:
    """Hours, minutes and (decimal) seconds: 24h, 1h30m, 90.5s... 0s."""
    hours, rest = divmod(seconds, 3600)
    minutes, rest = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return text + (f"{plain_decimal(rest)}s" if rest or not text else "")


def duration_to_v1beta1(value: object) -> object:
    """A v1alpha1 duration in v1beta1: kept when v1beta1 takes it; bare
    seconds get their unit (90 -> 90s); else hours, minutes and seconds
    (1d -> 24h)."""
    if not isinstance(value, str) or re.fullmatch(_DURATION_PATTERN, value):
        return value
    seconds = read_duration(value)
    if seconds is None:
        return value
    if re.fullmatch(_DIGITS, value.strip()):
        return value.strip() + "s"
    return spell_duration(seconds)


# -- overlap -----------------------------------------------------------------------


_PERCENT_PATTERN = V1BETA1_PATTERNS["spec.overlap"]


def overlap_to_v1beta1(value: object) -> object:
    """A v1alpha1 overlap in v1beta1: a percentage (0.1 -> 10%)."""
    if not isinstance(value, str) or re.fullmatch(_PERCENT_PATTERN, value):
        return value
    match = re.fullmatch(_NUMBER + r"\s*(?P<unit>%?)", value.strip())
    number = exact_number(match["num"]) if match else None
    if match is None or number is None:
        return value
    if match["unit"] and re.fullmatch(_DIGITS, match["num"]):
        return match["num"] + "%"
    percent = plain_decimal(number if match["unit"] else number * 100)
    return value if percent is None or len(percent) >= _MAX_LENGTH else percent + "%"
