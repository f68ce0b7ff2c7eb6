"""Reading a CheckpointPolicy spec field by field, collecting every problem instead of
stopping at the first (spec.py reads the whole spec with these). Pure.

Each parser takes the field's path (for the error) and the value as the apiserver
stored it, and returns the typed value or raises an `InvalidInput` that names the
field, what was expected and what was seen.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ckptdrain import units
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.policy import selectors
from ckptdrain.operator.policy.identity import Rule

NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

T = TypeVar("T")


class Reader:
    """Reads fields, collecting errors instead of stopping at the first."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec
        self.errors: list[InvalidInput] = []

    def raw(self, path: str) -> Any:
        node: Any = self.spec
        for part in path.split("."):
            if not isinstance(node, Mapping):
                return None
            node = node.get(part)
        return node

    def get(self, path: str, parse: Callable[[str, object], T], default: T) -> T:
        value = self.raw(path)
        if value is None:
            return default
        try:
            return parse(f"spec.{path}", value)
        except InvalidInput as error:
            self.errors.append(error)
            return default

    def fail(self, path: str, expected: str, seen: object) -> None:
        self.errors.append(InvalidInput(f"spec.{path}", expected, seen))


def number(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInput(field, "a positive number such as 14", value)
    try:
        number = float(value)
    except ValueError:
        raise InvalidInput(field, "a positive number such as 14", value) from None
    if not 0 < number < float("inf"):
        raise InvalidInput(field, "a positive number such as 14", value)
    return number


def text(field: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput(field, "a non-empty string", value)
    return value


def flag(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(field, "true or false", value)
    return value


def choice(options: tuple[str, ...]) -> Callable[[str, object], str]:
    def parse(field: str, value: object) -> str:
        if value not in options:
            raise InvalidInput(field, "one of " + ", ".join(options), value)
        return str(value)
    return parse


#: The most node requirements or tolerations a policy may add to a pod: the
#: CRD's maxItems, which bounds the cost of its rules on each item.
MAX_PLACEMENT_ITEMS = 1000
#: A Gt/Lt value: the scheduler reads it as an int64, which 18 digits always fit.
WHOLE_NUMBER = re.compile(r"[0-9]{1,18}")


def read_identity(r: Reader) -> Rule | None:
    """spec.identity: exactly one of rankLabel / rankAnnotation, a valid key."""
    raw = r.raw("identity")
    if raw is None:
        return None
    expected = "one of rankLabel or rankAnnotation, e.g. {rankLabel: example.com/rank}"
    if not isinstance(raw, Mapping):
        r.fail("identity", expected, raw)
        return None
    given = {k: raw.get(k) for k in ("rankLabel", "rankAnnotation") if raw.get(k) is not None}
    if len(given) != 1:
        r.fail("identity", expected, dict(raw))
        return None
    (field, key), = given.items()
    if not selectors.valid_key(key):
        r.fail(f"identity.{field}", "a label or annotation key such as example.com/rank: "
               + selectors.KEY_EXPECTED, key)
        return None
    return Rule(label=key) if field == "rankLabel" else Rule(annotation=key)


def seconds_or_zero(field: str, value: object) -> float:
    if value in (0, "0", "0s"):
        return 0.0
    return units.parse_duration(field, value)


def read_placement(r: Reader) -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    """spec.placement: node requirements (as in a nodeSelectorTerm) and tolerations,
    each as the apiserver's pod validation accepts it, so no injected pod is
    refused for them."""
    exprs = r.raw("placement.nodeAffinity.matchExpressions") or []
    tols = r.raw("placement.tolerations") or []
    if not isinstance(exprs, list) or not isinstance(tols, list):
        r.fail("placement", "{nodeAffinity: {matchExpressions: [...]}, tolerations: [...]}",
               r.raw("placement"))
        return (), ()
    for path, items in (("placement.nodeAffinity.matchExpressions", exprs),
                        ("placement.tolerations", tols)):
        if len(items) > MAX_PLACEMENT_ITEMS:
            r.fail(path, f"at most {MAX_PLACEMENT_ITEMS} items", f"{len(items)} items")
    for i, e in enumerate(exprs):
        _check_node_requirement(r, f"placement.nodeAffinity.matchExpressions[{i}]", e)
    for i, t in enumerate(tols):
        check_toleration(r, f"placement.tolerations[{i}]", t)
    return (tuple(dict(e) for e in exprs if isinstance(e, Mapping)),
            tuple(dict(t) for t in tols if isinstance(t, Mapping)))


def _check_node_requirement(r: Reader, where: str, e: object) -> None:
    if not isinstance(e, Mapping):
        r.fail(where, "{key: a node label key, operator, values}", e)
        return
    if not selectors.valid_key(e.get("key")):
        r.fail(f"{where}.key", "a node " + selectors.KEY_EXPECTED, e.get("key"))
    op, values = e.get("operator"), e.get("values") or []
    if not isinstance(values, list):
        r.fail(f"{where}.values", "a list of label values", values)
        return
    if op not in NODE_OPERATORS:
        r.fail(f"{where}.operator", "one of " + ", ".join(NODE_OPERATORS), op)
    elif op in ("In", "NotIn") and not values:
        r.fail(f"{where}.values", f"at least one value with operator {op}", values)
    elif op in ("Exists", "DoesNotExist") and values:
        r.fail(f"{where}.values", f"no values with operator {op}", values)
    elif op in ("Gt", "Lt") and (len(values) != 1 or not isinstance(values[0], str)
                                 or not WHOLE_NUMBER.fullmatch(values[0])):
        r.fail(f"{where}.values",
               f"exactly one whole number of at most 18 digits with operator {op}", values)
    for j, value in enumerate(values if op in ("In", "NotIn") else ()):
        if not selectors.valid_value(value):
            r.fail(f"{where}.values[{j}]", selectors.VALUE_EXPECTED, value)


#: Why a class's toleration names its taint (policy/class_placement.py).
KEY_REQUIRED = ("a key is required: a toleration without one tolerates every taint, "
                "cordons and not-ready or unreachable nodes included, so the pods would "
                "never be evicted; name each taint of the node pool")


def check_toleration(r: Reader, where: str, t: object, key_required: bool = False) -> None:
    """One toleration as the apiserver's pod validation reads it (operator
    omitted: Equal; effect omitted or empty: every effect); `key_required`
    also refuses one without a key."""
    if not isinstance(t, Mapping):
        r.fail(where, "a toleration {key, operator, value, effect}", t)
        return
    key, op, value = t.get("key") or "", t.get("operator") or "Equal", t.get("value") or ""
    if key and not selectors.valid_key(key):
        r.fail(f"{where}.key", "a taint " + selectors.KEY_EXPECTED, key)
    if not key and key_required:
        r.fail(f"{where}.key", KEY_REQUIRED, t.get("key"))
    elif not key and op != "Exists":
        r.fail(f"{where}.operator", "Exists without a key (it tolerates every taint)", op)
    if op == "Exists" and value:
        r.fail(f"{where}.value", "no value with operator Exists", value)
    elif not selectors.valid_value(value):
        r.fail(f"{where}.value", selectors.VALUE_EXPECTED, value)
    if t.get("effect") not in (None, "", *TAINT_EFFECTS):
        r.fail(f"{where}.effect", "one of " + ", ".join(TAINT_EFFECTS), t.get("effect"))
    if t.get("tolerationSeconds") is not None and t.get("effect") != "NoExecute":
        r.fail(f"{where}.tolerationSeconds", "only with effect NoExecute",
               t.get("tolerationSeconds"))
