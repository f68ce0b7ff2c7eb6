"""Which role a pod plays under its policy: the writer of one shard, or a
reader of one (it restores the shard and never writes). Pure: the pod, its
identity (identity.py) and the policy's `writers` and `readers` come in.

`spec.writers` is one data-parallel replica's shards. A job of 8 pods whose
replicas each hold 4 shards has 4 writers (ranks 0..3) and 4 readers: pod
`r` reads shard `r mod 4`, what the writer of that shard saved.

- `ckptdrain.io/role: reader` on the pod (the workload declares it): a
  reader at any rank, of shard rank mod writers (shard 0 with one writer
  and no rank);
- `ckptdrain.io/role: writer`: a writer, whose rank must be below writers;
- neither: with `spec.readers: Replicas` (the policy declares it) a pod
  ranked at or past writers is a reader; with `Declared`, the default, it
  is refused as a writer out of range, as before readers existed.

The workload's pod count (when it says it) is checked the same way: with
`Replicas` it must be a whole number of replicas, else it must equal
`writers`. Readers of a workload restore beside its writers, and then every
pod must restore a step all of them can get (restore/plan.py): writers
learn it here, from the workload's count (or, with `Replicas` and a ranked
workload of unknown size, assume it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptdrain.contract.api import ANNOTATION_ROLE, ROLE_READER, ROLE_WRITER
from ckptdrain.operator.policy.identity import Identity, mismatch, out_of_range

REPLICAS = "Replicas"


class RoleRefused(ValueError):
    """The pod cannot be admitted in any role; the message says why and what to change."""


@dataclass(frozen=True)
class Role:
    reader: bool
    #: The shard it writes or reads; None: a writer without a rank (one writer).
    shard: int | None
    #: Readers restore beside this workload's writers.
    readers_alongside: bool
    #: The workload's count of writing pods, for the WritersConsistent
    #: condition (None: unknown, or a reader).
    workload_writers: int | None = None
    #: Set when the workload's count disagrees with spec.writers.
    warning: str | None = None


def declared(pod: Mapping[str, Any]) -> str | None:
    """The role the pod's annotation declares, or None."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ANNOTATION_ROLE)
    if value is None:
        return None
    if value not in (ROLE_WRITER, ROLE_READER):
        raise RoleRefused(f"annotation {ANNOTATION_ROLE}: expected {ROLE_WRITER!r} or "
                          f"{ROLE_READER!r}, got {value!r}")
    return str(value)


def _workload_check(found: Identity | None, writers: int, readers: str
                    ) -> tuple[int | None, str | None]:
    """(writing pods to annotate, a warning) from the workload's pod count."""
    pods = found.writers if found is not None else None
    if found is None or pods is None:
        return None, None
    if readers == REPLICAS and pods >= writers and pods % writers == 0:
        return writers, None
    if readers == REPLICAS and pods > writers:
        return pods, (f"the {found.kind} has {pods} pods, not a whole number of data-parallel "
                      f"replicas of spec.writers ({writers}): pods past the last whole "
                      "replica read shards nobody beside them reads")
    return pods, mismatch(found, writers)


def _alongside(found: Identity | None, writers: int, readers: str) -> bool:
    if readers != REPLICAS or found is None:
        return False
    if found.writers is not None:
        return found.writers > writers
    # A ranked workload of unknown size may run replicas: assume it (a
    # writer that restores a step its readers cannot get splits the job).
    return found.rank is not None


def assign(pod: Mapping[str, Any], found: Identity | None, writers: int,
           readers: str) -> Role:
    """The pod's role; RoleRefused when it can have none. `found` is None for
    a pod without a rank under a policy of one writer."""
    role = declared(pod)
    rank = found.rank if found is not None else None
    if role == ROLE_READER:
        return Role(True, 0 if rank is None else rank % writers, True)
    if rank is not None and rank >= writers and role is None and readers == REPLICAS:
        return Role(True, rank % writers, True)
    problem = out_of_range(found, writers) if found is not None else None
    if problem and role == ROLE_WRITER:
        raise RoleRefused(f"{problem}, and the pod declares {ANNOTATION_ROLE}: {ROLE_WRITER}")
    if problem:
        raise RoleRefused(f"{problem}; a pod that only restores is a reader: annotate it "
                          f"{ANNOTATION_ROLE}: {ROLE_READER}, or set spec.readers: {REPLICAS} "
                          "for data-parallel replicas")
    counted, warning = _workload_check(found, writers, readers)
    return Role(False, rank, _alongside(found, writers, readers), counted, warning)
