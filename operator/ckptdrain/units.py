"""Human units: parse what people type, format what people read.

Pure functions. Every parser takes the field name it is parsing so that a bad
value becomes an InvalidInput naming the field, what was expected and what
was seen. Parameter counts use B for billion ("405B"); byte sizes use SI
(kB, MB, GB, TB) or IEC (KiB, MiB, GiB, TiB) suffixes; rates are sizes per
second ("63GB/s"); durations combine h, m, s, ms ("1h30m", "900s").
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from ckptdrain.errors import InvalidInput

_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)"

_COUNT_SUFFIX = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}

_BYTE_SUFFIX = {
    "": 1, "b": 1, "B": 1,
    "k": 1e3, "K": 1e3, "KB": 1e3, "kB": 1e3,
    "M": 1e6, "MB": 1e6,
    "G": 1e9, "GB": 1e9,
    "T": 1e12, "TB": 1e12,
    "P": 1e15, "PB": 1e15,
    "E": 1e18, "EB": 1e18,
    "Ki": 2**10, "KiB": 2**10,
    "Mi": 2**20, "MiB": 2**20,
    "Gi": 2**30, "GiB": 2**30,
    "Ti": 2**40, "TiB": 2**40,
    "Pi": 2**50, "PiB": 2**50,
    "Ei": 2**60, "EiB": 2**60,
}

_DURATION_UNIT = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

# What each parser expects, named so that a caller can say it another way
# (a policy written at v1beta1: operator/policy/version_messages.py).
COUNT_EXPECTED = "a positive count such as 405B, 70M or 4.05e11"
SIZE_EXPECTED = "a size such as 5.67TB, 500MiB or 1048576"
RATE_EXPECTED = "a positive rate such as 63GB/s, 500MiB/s or 1e9 (bytes per second)"
DURATION_EXPECTED = "a duration such as 15m, 900s, 1h30m or 90"


def fraction_expected(allow_zero: bool = False) -> str:
    """What parse_fraction expects."""
    return f"a fraction in {'[' if allow_zero else '('}0, 1] such as 10% or 0.1"


def _finite_number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _split_number(field: str, value: object, expected: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise InvalidInput(field, expected, value)
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise InvalidInput(field, expected, value)
        return float(value), ""
    if not isinstance(value, str):
        raise InvalidInput(field, expected, value)
    match = re.fullmatch(_NUMBER + r"\s*(?P<unit>[A-Za-z/%]*)", value.strip())
    if not match:
        raise InvalidInput(field, expected, value)
    number = _finite_number(match["num"])
    if number is None:
        raise InvalidInput(field, expected, value)
    return number, match["unit"]


def parse_count(field: str, value: object) -> float:
    """A positive count such as parameters: 405B, 4.05e11, 70M, 1.5T."""
    expected = COUNT_EXPECTED
    number, unit = _split_number(field, value, expected)
    if unit not in _COUNT_SUFFIX or number <= 0 or not math.isfinite(number * _COUNT_SUFFIX[unit]):
        raise InvalidInput(field, expected, value)
    return number * _COUNT_SUFFIX[unit]


def _size(field: str, value: object, expected: str) -> float:
    number, unit = _split_number(field, value, expected)
    if unit not in _BYTE_SUFFIX or number < 0 or not math.isfinite(number * _BYTE_SUFFIX[unit]):
        raise InvalidInput(field, expected, value)
    return number * _BYTE_SUFFIX[unit]


def parse_bytes(field: str, value: object) -> int:
    """A size in bytes: 5.67TB, 500MiB, 1048576. Zero is allowed."""
    return round(_size(field, value, SIZE_EXPECTED))


def parse_rate(field: str, value: object) -> float:
    """A positive rate in bytes per second: 63GB/s, 500MiB/s, 1e9."""
    expected = RATE_EXPECTED
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and text.endswith("/s"):
        text = text[:-2]
    try:
        rate = _size(field, text, expected) if text != "" else 0.0
    except InvalidInput:
        raise InvalidInput(field, expected, value) from None  # show what was typed, "/s" too
    if rate <= 0:
        raise InvalidInput(field, expected, value)
    return rate


def _plain_float(text: str) -> bool:
    return _finite_number(text) is not None


def parse_duration(field: str, value: object) -> float:
    """A positive duration in seconds: 15m, 900s, 1h30m, 1.5h, 90 (seconds)."""
    expected = DURATION_EXPECTED
    if isinstance(value, str) and _plain_float(value.strip()):
        value = float(value.strip())
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value <= 0:
            raise InvalidInput(field, expected, value)
        return float(value)
    if not isinstance(value, str):
        raise InvalidInput(field, expected, value)
    text = value.strip().replace(" ", "")
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise InvalidInput(field, expected, value)
    seconds = sum(float(n) * _DURATION_UNIT[u] for n, u in parts)
    if seconds <= 0:
        raise InvalidInput(field, expected, value)
    return seconds


def parse_fraction(field: str, value: object, *, allow_zero: bool = False) -> float:
    """A fraction in (0, 1] ([0, 1] with `allow_zero`): 10% or 0.1. Values
    above 1 are refused."""
    expected = fraction_expected(allow_zero)
    number, unit = _split_number(field, value, expected)
    if unit == "%":
        number /= 100.0
    elif unit:
        raise InvalidInput(field, expected, value)
    low_ok = number >= 0 if allow_zero else number > 0
    if not low_ok or number > 1:
        raise InvalidInput(field, expected, value)
    return number


def parse_positive_int(field: str, value: object) -> int:
    """A whole number >= 1."""
    expected = "a whole number >= 1"
    if isinstance(value, bool):
        raise InvalidInput(field, expected, value)
    # Stripped first: str.strip and int() agree on what whitespace is (\s
    # and int() do not, for the ASCII separators \x1c-\x1f).
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        value = int(value.strip())
    if not isinstance(value, int) or value < 1:
        raise InvalidInput(field, expected, value)
    return value


# -- formatting --------------------------------------------------------------


#: How an amount is rounded to three significant digits: to the nearest, or,
#: for a bound a user may paste back into the field, up ("at least") or down
#: ("at most"), so that the amount pasted meets the bound it was told.
NEAREST, UP, DOWN = "nearest", "up", "down"
_DECIMAL_ROUNDING = {UP: ROUND_CEILING, DOWN: ROUND_FLOOR}


def _scaled(value: float, steps: list[tuple[float, str]], rounding: str = NEAREST) -> str:
    for factor, suffix in steps:
        if abs(value) >= factor:
            scaled = value / factor
            digits = 0 if abs(scaled) >= 100 else 1 if abs(scaled) >= 10 else 2
            if factor == 1 and rounding != NEAREST:
                digits = 0  # a bound of whole bytes: parse_bytes rounds 1.25 B to 1
            return f"{_rounded(value, factor, digits, rounding)} {suffix}"
    return f"{_rounded(value, 1.0, 0, rounding)} {steps[-1][1]}"


def _rounded(value: float, factor: float, digits: int, rounding: str) -> str:
    if rounding == NEAREST:
        return f"{value / factor:.{digits}f}"
    # Exactly (a float and a power of ten are exact Decimals): a bound of
    # 1.31e12 is "1.31", never a float quotient's 1.3100000000000001 -> 1.32.
    exact = Decimal(value) / Decimal(factor)
    return str(exact.quantize(Decimal(1).scaleb(-digits), _DECIMAL_ROUNDING[rounding]))


_SI_BYTES = [(1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B")]


def format_bytes(value: float, rounding: str = NEAREST) -> str:
    """SI bytes, three significant digits: 5.67 TB (rounded as `rounding`
    says: NEAREST, UP or DOWN)."""
    return _scaled(value, _SI_BYTES, rounding)


def format_rate(value: float, rounding: str = NEAREST) -> str:
    """SI bytes per second: 63.0 GB/s (rounded as format_bytes)."""
    return format_bytes(value, rounding) + "/s"


def format_count(value: float) -> str:
    """A parameter count: 405 B (billions)."""
    return _scaled(value, [(1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"), (1, "")]).strip()


def format_duration(seconds: float) -> str:
    """Compact duration: 1h30m, 15m, 90s, 1.5s."""
    if seconds < 60:
        return f"{seconds:.3g}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return text + (f"{secs}s" if secs else "")


def format_quantity(size: int) -> str:
    """A byte count as a Kubernetes resource quantity the apiserver accepts:
    the shortest exact form with a binary (64Gi) or decimal (64G) suffix, else
    plain bytes. Our own units (64GB, 5.67TB) are not quantities: the
    apiserver refuses "GB"."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"a quantity needs a whole number of bytes >= 0, got {size!r}")
    forms = [str(size)]
    for suffix, factor in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30),
                           ("Mi", 2**20), ("Ki", 2**10), ("E", 10**18), ("P", 10**15),
                           ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if size and size % factor == 0:
            forms.append(f"{size // factor}{suffix}")
    return min(forms, key=len)  # the first of the shortest: binary before decimal


def format_percent(fraction: float) -> str:
    return f"{fraction * 100:.3g}%"
