"""A CheckpointClass's bandwidth settings, read: spec.bandwidthWeight (its
policies' weight under the cluster cap) and spec.bandwidthCap (the most
its policies together may drain at, operator/policy/class_shares.py). Pure.

spec.bandwidthCap is spelled as a v1beta1 policy's caps.bandwidth is (a
Kubernetes quantity in bytes per second: the integer 10000000000, or "10G",
"1.25Gi"; the pattern is contract/policy_versions/spellings.py's), and
must be above zero, at least 1 byte per second ("0.5" is refused as
the integer 0 is): the CRD refuses the rest, and so does `read_cap`, for
a class written while the CRD did not.
"""

from __future__ import annotations

import re

from ckptdrain import units
from ckptdrain.contract.policy_versions.spellings import V1BETA1_PATTERNS
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.config import MAX_WEIGHT

WEIGHT_FIELD, CAP_FIELD = "spec.bandwidthWeight", "spec.bandwidthCap"
#: The CRD's pattern for a string spelling (tests/unit: the CRD copies it).
CAP_PATTERN = V1BETA1_PATTERNS["spec.caps.bandwidth"]
CAP_EXPECTED = ('a bandwidth above zero, at least 1 byte per second: an integer such as '
                '10000000000, or a quantity string such as "10G" or "1.25Gi"')


def read_weight(value: object, problems: list[InvalidInput]) -> int | None:
    """spec.bandwidthWeight: a whole number from 1 to MAX_WEIGHT, or None."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or not 1 <= value <= MAX_WEIGHT):
        problems.append(InvalidInput(WEIGHT_FIELD, f"a whole number from 1 to {MAX_WEIGHT}",
                                     value))
        return None
    return value


def read_cap(value: object, problems: list[InvalidInput]) -> float | None:
    """spec.bandwidthCap in bytes/s, or None when unset; a problem naming
    the field for anything the CRD refuses (zero, a negative, a string of
    plain digits, a unit that is no quantity's)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value >= 1:
            return float(value)
    elif isinstance(value, str) and re.fullmatch(CAP_PATTERN, value):
        try:
            rate = units.parse_rate(CAP_FIELD, value)
            if rate >= 1:
                return rate
        except InvalidInput:
            pass  # zero ("0G", "0.0")
    problems.append(InvalidInput(CAP_FIELD, CAP_EXPECTED, value))
    return None
