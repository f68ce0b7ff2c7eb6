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

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
#: Kubernetes label syntax: a name (and a value, which may also be empty) of
#: at most 63 characters, alphanumerics with -, _ or . inside; a key may
#: have a DNS subdomain prefix of at most 253 characters and a slash.
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
KEY_EXPECTED = ("a label key: a name of at most 63 characters (letters, digits, '-', "
                "'_', '.'; a letter or digit at each end), optionally after a DNS "
                "subdomain prefix and '/'")
VALUE_EXPECTED = ("a label value: empty, or at most 63 characters (letters, digits, "
                  "'-', '_', '.'; a letter or digit at each end)")
#: A selector's field (without `spec.`), what it expects, what it has.
Problem = tuple[str, str, object]


def valid_key(key: object) -> bool:
    if not isinstance(key, str):
        return False
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and _PREFIX.fullmatch(prefix)):
        return False
    return bool(_NAME.fullmatch(name))


def valid_value(value: object) -> bool:
    return isinstance(value, str) and (value == "" or bool(_NAME.fullmatch(value)))


def problems(selector: Mapping[str, Any], at: str = "selector") -> list[Problem]:
    """Every label key, value or operator in `selector` no pod label can
    satisfy as written, each named by its field (e.g.
    `selector.matchExpressions[0].values[1]`); [] when all are valid."""
    found: list[Problem] = []
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        return [(f"{at}.matchLabels", "a map of label keys to values", labels)]
    for key, value in labels.items():
        if not valid_key(key):
            found.append((f"{at}.matchLabels", KEY_EXPECTED, key))
        elif not valid_value(value):
            found.append((f"{at}.matchLabels.{key}", VALUE_EXPECTED, value))
    exprs = selector.get("matchExpressions") or []
    if not isinstance(exprs, list):
        return [*found, (f"{at}.matchExpressions", "a list of expressions", exprs)]
    for i, expr in enumerate(exprs):
        where = f"{at}.matchExpressions[{i}]"
        if not isinstance(expr, Mapping):
            found.append((where, "{key, operator, values}", expr))
            continue
        if not valid_key(expr.get("key")):
            found.append((f"{where}.key", KEY_EXPECTED, expr.get("key")))
        op, values = expr.get("operator"), expr.get("values") or []
        if op not in OPERATORS:
            found.append((f"{where}.operator", f"one of {', '.join(OPERATORS)}", op))
        elif op in ("In", "NotIn") and not values:
            found.append((f"{where}.values", f"at least one value with {op}", values))
        elif op in ("Exists", "DoesNotExist") and values:
            found.append((f"{where}.values", f"no values with {op}", values))
        for j, value in enumerate(values if isinstance(values, list) else []):
            if not valid_value(value):
                found.append((f"{where}.values[{j}]", VALUE_EXPECTED, value))
    return found
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
