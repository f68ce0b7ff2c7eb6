"""CheckpointPolicy in ckptdrain.io/v1alpha1 and ckptdrain.io/v1beta1: the
same object with other types for a few fields, converted both ways. Pure.

v1beta1 writes Kubernetes types where v1alpha1 has its own units: Quantity
strings or integers for counts, sizes and rates, Go durations, overlap as a
percentage, RFC3339 times in status (the table is docs/api-versions.md; the
spellings are in `spellings` and `status_times`). Everything else is the
same in both, and is carried as it is, unknown fields included.

- `to_v1beta1` rewrites each of those fields in the v1beta1 spelling of the
  same value; `to_v1alpha1` back. v1beta1 -> v1alpha1 -> v1beta1 is exact;
  v1alpha1 -> v1beta1 -> v1alpha1 keeps every value (1d comes back 24h),
  status times to the microsecond (what the operator writes is rounded so).
- A value that does not read is carried unchanged, never an error: a
  conversion that fails breaks every list of the resource, for everyone.
- metadata is never touched (the apiserver refuses a conversion that changes
  it); apiVersion is set; the input is never mutated.
- `convert` refuses, with InvalidInput naming the field, only what is not a
  CheckpointPolicy of a known version.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from ckptdrain.contract import api
from ckptdrain.contract.policy_versions import spellings, status_times
from ckptdrain.contract.policy_versions.spellings import (
    BYTES_PER_PARAMETER_MAX_LENGTH,
    V1BETA1_PATTERNS,
)
from ckptdrain.errors import InvalidInput

__all__ = ["BYTES_PER_PARAMETER_MAX_LENGTH", "V1ALPHA1", "V1BETA1", "V1BETA1_PATTERNS",
           "VERSIONS", "convert", "to_v1alpha1", "to_v1beta1"]

V1ALPHA1 = f"{api.GROUP}/v1alpha1"
V1BETA1 = f"{api.GROUP}/v1beta1"
VERSIONS = (V1ALPHA1, V1BETA1)

Convert = Callable[[object], object]
_BYTES_UP = partial(spellings.amount_to_v1beta1, spellings.BYTES)
_RATE_UP = partial(spellings.amount_to_v1beta1, spellings.RATE)
_AMOUNT_DOWN = spellings.amount_to_v1alpha1


def _kept(value: object) -> object:
    return value


#: Each field whose type differs, with its conversion up (to v1beta1) and
#: down (to v1alpha1). Durations and overlap: every v1beta1 spelling is one
#: in v1alpha1 already, so down keeps them.
FIELDS: Mapping[str, tuple[Convert, Convert]] = {
    "spec.model.parameters": (partial(spellings.amount_to_v1beta1, spellings.COUNT),
                              _AMOUNT_DOWN),
    "spec.model.bytesPerParameter": (spellings.per_parameter_to_v1beta1,
                                     spellings.per_parameter_to_v1alpha1),
    "spec.model.checkpointBytes": (_BYTES_UP, _AMOUNT_DOWN),
    "spec.localTier.capacity": (_BYTES_UP, _AMOUNT_DOWN),
    "spec.localTier.memory.sizeLimit": (_BYTES_UP, _AMOUNT_DOWN),
    "spec.peerTier.capacity": (_BYTES_UP, _AMOUNT_DOWN),
    "spec.caps.bandwidth": (_RATE_UP, _AMOUNT_DOWN),
    "spec.caps.perDrainer": (_RATE_UP, _AMOUNT_DOWN),
    **{f"spec.{name}": (spellings.duration_to_v1beta1, _kept)
       for name in ("interval", "mtti", "localWriteTime", "restore.retryDeadline",
                    "restore.agreementTimeout", "drain.stallTimeout")},
    "spec.overlap": (spellings.overlap_to_v1beta1, _kept),
    **{f"status.{name}": (status_times.to_rfc3339, status_times.to_unix_seconds)
       for name in ("lastRestoreAgreement.startedAt", "lastRestoreFailure.startedAt",
                    "goodput.heldSince", "goodput.endedAt")},
    # Interruptions: free-form in the schema (preserve-unknown), their times
    # converted all the same, so v1beta1 never shows a Unix second.
    "status.goodput.lastInterruption": (status_times.interruption_to_rfc3339,
                                        status_times.interruption_to_unix_seconds),
    "status.goodput.recent": (status_times.interruptions_to_rfc3339,
                              status_times.interruptions_to_unix_seconds),
}


def _rewritten(obj: Mapping[str, Any], api_version: str, direction: int) -> dict[str, Any]:
    out = copy.deepcopy(dict(obj))
    for path, conversions in FIELDS.items():
        *parents, name = path.split(".")
        holder: object = out
        for key in parents:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and name in holder:
            holder[name] = conversions[direction](holder[name])
    out["apiVersion"] = api_version
    return out


def to_v1beta1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The v1beta1 form of a v1alpha1 CheckpointPolicy (a new dict)."""
    return _rewritten(obj, V1BETA1, 0)


def to_v1alpha1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The v1alpha1 form of a v1beta1 CheckpointPolicy (a new dict)."""
    return _rewritten(obj, V1ALPHA1, 1)


def convert(obj: object, desired_api_version: object) -> dict[str, Any]:
    """`obj`, a CheckpointPolicy of either version, in `desired_api_version`
    (a new dict). InvalidInput when either is not what that promises."""
    versions = " or ".join(VERSIONS)
    if not isinstance(obj, Mapping):
        raise InvalidInput("object", "a CheckpointPolicy object", type(obj).__name__)
    if obj.get("kind") != api.KIND_POLICY:
        raise InvalidInput("kind", api.KIND_POLICY, obj.get("kind"))
    if obj.get("apiVersion") not in VERSIONS:
        raise InvalidInput("apiVersion", versions, obj.get("apiVersion"))
    if desired_api_version not in VERSIONS:
        raise InvalidInput("desiredAPIVersion", versions, desired_api_version)
    if obj["apiVersion"] == desired_api_version:
        return copy.deepcopy(dict(obj))
    return to_v1beta1(obj) if desired_api_version == V1BETA1 else to_v1alpha1(obj)
