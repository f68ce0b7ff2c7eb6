"""What the operator keeps of an API object it holds in memory: everything
but its managedFields.

The apiserver sends every object with the field manager's bookkeeping, a
nested map of every field each writer set. Nothing here reads it, and it is
most of a parsed object: a CheckpointPolicy with its status is 11 KiB of
JSON, 2.6 KiB of it managedFields, and 28 KiB as Python objects, 12 KiB
without them. At 1,000 policies that is 16 MiB in each process that keeps
them (docs/scale.md). The policy index keeps, in their place, only the
version each field whose spelling differs was written at, beside the object
(policy/version_messages.py kept_versions), so that a reconcile from it says
problems in the version written."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def without_managed_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` without metadata.managedFields; shares the rest with `obj`."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or "managedFields" not in meta:
        return dict(obj)
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def kept_copy(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `obj` without its managedFields (never copied at all)."""
    return copy.deepcopy(without_managed_fields(obj))
