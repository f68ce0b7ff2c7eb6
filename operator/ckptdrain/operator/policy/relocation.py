"""Which changes of a policy would silently move its checkpoints, or change
how many pods write one, and whether the change says it means to.

While pods of a policy live, changing where its checkpoints are
(`spec.storage.uri`, `spec.localTier.path`) makes their next restore start
from step 0 without a word, and changing `spec.writers` changes the rank
layout under running writers. Admission refuses both while pods live
(admission/policy_rules.py); this module is the pure part:

- `guarded_changes(old, new)`: the guarded fields an UPDATE changes;
- `acknowledged(old, new)`: the UPDATE sets a new `spec.relocation.reason`,
  which lets the location fields change (never `writers`: a running job
  cannot change its writer count; suspend it, change, resume);
- `refused(old, new)`: what is left refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Guarded fields, as a user names them, and the path into the spec.
LOCATION_FIELDS = {"spec.storage.uri": ("storage", "uri"),
                   "spec.localTier.path": ("localTier", "path")}
WRITERS_FIELD = "spec.writers"
#: The schema's default for spec.writers (crds/checkpointpolicies.yaml).
DEFAULT_WRITERS = 1


def _at(spec: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = spec
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _writers(spec: Mapping[str, Any]) -> Any:
    value = spec.get("writers")
    return DEFAULT_WRITERS if value is None else value


def guarded_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The guarded fields (`spec.…`) whose value differs between the two specs,
    in a fixed order."""
    changed = [name for name, path in LOCATION_FIELDS.items()
               if _at(old, path) != _at(new, path)]
    if _writers(old) != _writers(new):
        changed.append(WRITERS_FIELD)
    return changed


def reason(spec: Mapping[str, Any]) -> str:
    """`spec.relocation.reason`, stripped ("" when unset)."""
    value = _at(spec, ("relocation", "reason"))
    return value.strip() if isinstance(value, str) else ""


def acknowledged(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the UPDATE itself says the move is meant: it sets a
    `spec.relocation.reason` that is not empty and not the one before (a
    reason left from an earlier move acknowledges nothing new)."""
    return bool(reason(new)) and reason(new) != reason(old)


def refused(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The guarded fields an UPDATE changes that it may not change while pods
    of the policy live."""
    ok = acknowledged(old, new)
    return [name for name in guarded_changes(old, new)
            if name == WRITERS_FIELD or not ok]
