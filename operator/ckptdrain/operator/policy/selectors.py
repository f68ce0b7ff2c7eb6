"""Whether label selectors can pick the same pod, and one label set they
would both pick: two policies that do are refused at admission, since a pod
both select could never be injected (admission refuses it).

Decidable key by key: each key's constraints (matchLabels and
matchExpressions with In / NotIn / Exists / DoesNotExist, from every
selector) are intersected on their own, because a label set is one
independent value, or its absence, per key:

    constraint     | the key must be | its value must be
    ---------------+-----------------+--------------------------
    k: v (labels)  | present         | v
    In S           | present         | in S (every In intersected)
    NotIn S        | -               | not in S (every NotIn united)
    Exists         | present         | -
    DoesNotExist   | absent          | -

A key that must be present takes the smallest allowed value not
forbidden (or a made-up value when any is allowed); any other key is left
out (absence satisfies NotIn and DoesNotExist). If some key can take no
value, no label set satisfies all the selectors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
#: The value a witness gives a key that must be present with any value
#: (followed by -1, -2, … while NotIn forbids it).
ANY_VALUE = "any"


@dataclass
class _Key:
    """Everything the selectors ask of one key."""

    present: bool = False
    absent: bool = False
    allowed: set[str] | None = None  # None: any value
    forbidden: set[str] = field(default_factory=set)

    def allow(self, values: Iterable[str]) -> None:
        self.present = True
        values = set(values)
        self.allowed = values if self.allowed is None else self.allowed & values

    def value(self) -> str | None:
        """The value a common label set gives the key; None when it has
        none. Raises _Impossible when no label set satisfies every constraint."""
        if self.absent and self.present:
            raise _Impossible
        if not self.present:
            return None
        if self.allowed is not None:
            left = sorted(self.allowed - self.forbidden)
            if not left:
                raise _Impossible
            return left[0]
        candidate, n = ANY_VALUE, 0
        while candidate in self.forbidden:
            n += 1
            candidate = f"{ANY_VALUE}-{n}"
        return candidate


class _Impossible(Exception):
    pass


def _constraints(selectors: Iterable[Mapping[str, Any]]) -> dict[str, _Key]:
    keys: dict[str, _Key] = {}
    for selector in selectors:
        for key, value in (selector.get("matchLabels") or {}).items():
            keys.setdefault(str(key), _Key()).allow([str(value)])
        for expr in selector.get("matchExpressions") or []:
            key, op = str(expr.get("key")), expr.get("operator")
            values = [str(v) for v in expr.get("values") or []]
            k = keys.setdefault(key, _Key())
            if op == "In":
                k.allow(values)
            elif op == "NotIn":
                k.forbidden.update(values)
            elif op == "Exists":
                k.present = True
            elif op == "DoesNotExist":
                k.absent = True
            else:
                raise ValueError(f"matchExpressions[].operator: expected one of "
                                 f"{', '.join(OPERATORS)}, got {op!r}")
    return keys


def common(*selectors: Mapping[str, Any]) -> dict[str, str] | None:
    """A label set every selector picks (keys sorted), or None when no pod
    can be picked by all of them. An empty selector picks every pod.
    Raises ValueError on an operator a selector cannot have."""
    witness: dict[str, str] = {}
    try:
        for key, wanted in sorted(_constraints(selectors).items()):
            value = wanted.value()
            if value is not None:
                witness[key] = value
    except _Impossible:
        return None
    return witness


def overlap(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, str] | None:
    """A label set both `a` and `b` pick (the witness of their overlap), or
    None when no pod can match both."""
    return common(a, b)
