"""Kubernetes resource quantities (`100m`, `256Mi`, `1.5`, `2e3`), read exactly.

Pure. The apiserver compares quantities as exact decimals, so comparing
floats could call `1Gi` above a limit of `1073741824`; a `Fraction` keeps
every quantity the apiserver accepts exact. Only what a container's
`resources` may hold: no negative amounts.
"""

from __future__ import annotations

import re
from fractions import Fraction

from ckptdrain.errors import InvalidInput

_QUANTITY = re.compile(r"^\+?(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                       r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)"
                       r"|[eE](?P<exp>[+-]?[0-9]+))?$")
_FACTOR = {
    None: Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000), "k": Fraction(10**3), "M": Fraction(10**6),
    "G": Fraction(10**9), "T": Fraction(10**12), "P": Fraction(10**15),
    "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
    "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
EXPECTED = "a Kubernetes quantity such as 100m, 2, 256Mi or 1Gi"


def parse_quantity(field: str, value: object) -> Fraction:
    """The exact amount `value` (a quantity string or a JSON number) stands for."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInput(field, EXPECTED, value)
    if isinstance(value, int | float):
        if not value >= 0 or value == float("inf"):
            raise InvalidInput(field, EXPECTED, value)
        return Fraction(value)
    match = _QUANTITY.match(value.strip())
    if not match:
        raise InvalidInput(field, EXPECTED, value)
    amount = Fraction(match["num"]) * _FACTOR[match["suffix"]]
    if match["exp"] is not None:
        if abs(int(match["exp"])) > 18:  # the apiserver's own bound on scale
            raise InvalidInput(field, EXPECTED, value)
        amount *= Fraction(10) ** int(match["exp"])
    return amount
