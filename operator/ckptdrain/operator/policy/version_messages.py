"""A CheckpointPolicy's problems said in the version its writer wrote. Pure.

The checks (policy/spec.py, ckptdrain.units) speak v1alpha1, the version
the operator reads: a count "such as 405B", a duration "such as ... 90", a
bound "at least 2.36 TB". To a writer of ckptdrain.io/v1beta1 that asks for
spellings v1beta1 refuses (docs/api-versions.md, "What differs"), so each
problem is said again for v1beta1:

- what was expected: a text naming v1beta1's spellings (the ones the
  v1beta1 CRD's own messages use) in place of each v1alpha1 one; in a bound
  of a field whose type differs, each amount as a v1beta1 quantity
  (2.36 TB -> 2.36T, 10.0 GB/s -> 10G);
- what was seen: the value as v1beta1 shows it. A value the writer sent at
  v1beta1 is kept as it is; one read at v1alpha1 (the operator's) is
  converted back (contract/policy_versions), so the stored "405000000000"
  is said as the 405000000000 that was written.

Anything else (the field, the rest of the text, fields whose type is the
same in both versions) is said as it is. v1alpha1 problems are unchanged.

Which version the writer used: an admission is told (the request's kind).
The operator, reading v1alpha1, takes for each problem the apiVersion of
the metadata.managedFields entries owning its field. Where none does, or
they disagree, the version is not known, and the problem says what was
expected in v1beta1's spellings (which v1alpha1 takes too, so neither
writer is misled) and the value as stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ckptdrain import units
from ckptdrain.contract.policy_versions import (
    FIELDS,
    V1ALPHA1,
    V1BETA1,
    VERSIONS,
    spellings,
    to_v1beta1,
)
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.policy import peer_tier
from ckptdrain.operator.policy import spec as pol

_DURATION = "a positive Go duration such as 15m, 900s or 1h30m"
#: Durations where zero is allowed (policy/fields.py seconds_or_zero), and so said.
_ZERO_ALLOWED = ("spec.restore.retryDeadline", "spec.restore.agreementTimeout")
_DURATION_OR_ZERO = "a Go duration such as 15m, 900s or 1h30m, or 0s"

#: Each v1alpha1 expectation naming v1alpha1 spellings, said for v1beta1.
V1BETA1_EXPECTED: Mapping[str, str] = {
    units.COUNT_EXPECTED: "a positive count such as 405G, 70M or 405000000000",
    units.SIZE_EXPECTED: "a size such as 5.67T, 500Mi or 1048576",
    units.RATE_EXPECTED: "a positive rate in bytes per second such as 63G, 500Mi "
                         "or 1000000000",
    units.DURATION_EXPECTED: _DURATION,
    units.fraction_expected(): "a percentage in (0%, 100%] such as 10% or 12.5%",
    pol.MODEL_EXPECTED: "model.parameters (e.g. 405G) or model.checkpointBytes (e.g. 5.67T)",
    pol.POSITIVE_SIZE_EXPECTED: "a positive size such as 5.67T or 1.5Ti",
    peer_tier.SHAPE_EXPECTED: "{enabled: true, keep: 2, capacity: 2T}",
}

#: An amount as units.format_bytes and format_rate write it: "2.36 TB", "10.0 GB/s".
_FORMATTED_AMOUNT = re.compile(r"(?<![\w.])([0-9]+(?:\.[0-9]+)?) (PB|TB|GB|MB|kB|B)(/s)?(?!\w)")


def _amount_in_v1beta1(match: re.Match[str]) -> str:
    number, unit, per_second = match.groups()
    if "." in number:  # 3 significant digits as formatted: 10.0 GB -> 10G, 2.50 TB -> 2.5T
        number = number.rstrip("0").rstrip(".")
    kind = spellings.RATE if per_second else spellings.BYTES
    return str(spellings.amount_to_v1beta1(kind, number + unit))


def expected_in_v1beta1(field: str, expected: str) -> str:
    """What a problem of `field` expects, in v1beta1's spellings."""
    said = V1BETA1_EXPECTED.get(expected)
    if said == _DURATION and field in _ZERO_ALLOWED:
        return _DURATION_OR_ZERO
    if said is not None:
        return said
    if field in FIELDS:
        return _FORMATTED_AMOUNT.sub(_amount_in_v1beta1, expected)
    return expected


def seen_in_v1beta1(field: str, seen: object) -> object:
    """`seen`, the value of `field` (spec.…) as either version holds it, as
    v1beta1 shows it; a value of another field as it is."""
    path = field.split(".")
    if path[0] != "spec" or seen is None:
        return seen
    policy: dict[str, Any] = {"apiVersion": V1ALPHA1}
    holder = policy
    for key in path[:-1]:
        holder = holder.setdefault(key, {})
    holder[path[-1]] = seen
    converted: Any = to_v1beta1(policy)
    for key in path:
        converted = converted[key]
    return converted


def in_version(problem: InvalidInput, api_version: str | None) -> InvalidInput:
    """`problem` as a writer of `api_version` is told it. None, a version
    not known: what was expected in v1beta1's spellings, every one of which
    v1alpha1 takes too (contract/policy_versions/spellings.py), so either
    writer can use it; the value as it was read."""
    if api_version is None:
        return InvalidInput(problem.field, expected_in_v1beta1(problem.field, problem.expected),
                            problem.seen)
    if api_version != V1BETA1:
        return problem
    return InvalidInput(problem.field, expected_in_v1beta1(problem.field, problem.expected),
                        seen_in_v1beta1(problem.field, problem.seen))


def message(error: InvalidInput, written_in: Mapping[str, str]) -> str:
    """The text of a policy found invalid (pol.PolicyInvalid: each problem,
    joined as it joins them), each problem said in the version its field
    was written at (`written_in`, field_versions; a field not in it: not
    known). Other errors (a class that does not take the policy) name no
    field whose type differs, and are said as they are."""
    if isinstance(error, pol.PolicyInvalid):
        problems: Sequence[InvalidInput] = error.errors
    elif type(error) is InvalidInput:
        problems = [error]
    else:
        return str(error)
    return "; ".join(str(in_version(p, written_in.get(p.field))) for p in problems)


#: The fields whose problems are said differently at v1beta1: those whose
#: type differs, and the two whose expected shape names an amount.
WORDED_FIELDS: tuple[str, ...] = (*(p for p in FIELDS if p.startswith("spec.")),
                                  "spec.model", "spec.peerTier")


def _entries(meta: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """metadata.managedFields' entries as the apiserver writes them (an
    apiVersion that is a string, a fieldsV1 map): anything else tells no
    version, and must not fail a reconcile."""
    entries = meta.get("managedFields")
    return [e for e in entries if isinstance(e, Mapping)
            and isinstance(e.get("apiVersion"), str) and isinstance(e.get("fieldsV1"), Mapping)] \
        if isinstance(entries, list) else []


def _owns(fields: Mapping[str, Any], path: str) -> bool:
    """Whether a fieldsV1 set holds `path` (spec.localTier.capacity is
    f:spec -> f:localTier -> f:capacity)."""
    node: object = fields
    for key in path.split("."):
        node = node.get(f"f:{key}") if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            return False
    return True


def field_versions(meta: Mapping[str, Any]) -> dict[str, str]:
    """For each of WORDED_FIELDS, the apiVersion it was written at: that of
    the managedFields entries owning it, where they agree on a known one.
    An entry's time is no guide: it is its manager's last write of anything
    (a label), not of this field."""
    entries = _entries(meta)
    found: dict[str, str] = {}
    for path in WORDED_FIELDS:
        versions = {e["apiVersion"] for e in entries if _owns(e["fieldsV1"], path)}
        if len(versions) == 1 and versions <= set(VERSIONS):
            # VERSIONS' own string, not the entry's: every index copy shares it.
            found[path] = VERSIONS[VERSIONS.index(versions.pop())]
    return found


#: Where the operator's in-memory copy of a policy (its index) keeps
#: field_versions in place of metadata.managedFields, which it drops
#: (apiserver/slim.py): a key no object of the apiserver has.
KEPT_KEY = "_ckptdrainFieldVersions"


def kept_versions(kept: dict[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """`kept`, a copy of `body` without managedFields, with body's
    field_versions under KEPT_KEY."""
    kept[KEPT_KEY] = field_versions(body.get("metadata") or {})
    return kept


def versions_of(body: Mapping[str, Any]) -> Mapping[str, str]:
    """field_versions of a policy: from the apiserver's object, or kept
    beside an indexed copy (kept_versions)."""
    kept = body.get(KEPT_KEY)
    if isinstance(kept, Mapping):
        return kept
    return field_versions(body.get("metadata") or {})
