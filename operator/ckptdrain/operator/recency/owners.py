"""Which object owns a policy's training pods, for the recency annotation.
Pure: objects are read through the `read` callable it is given.

From a pod's controller reference, up the controllers' own references:

    pod -> Job -> JobSet [-> TrainJob]
    pod -> StatefulSet -> LeaderWorkerSet   (a group's leader)
    pod -> StatefulSet -> leader pod -> StatefulSet -> LeaderWorkerSet
                                             (its workers: the leader owns their set)
    pod -> PyTorchJob
    pod -> Job                               (a plain Indexed Job)

The owner is the top-most object of a PUBLISHED kind on that chain (a
CronJob above a Job is not one: the Job is the workload). Kinds that only
lead there (a StatefulSet, a leader pod) are read but never written. A chain that reaches
any other kind (a ReplicaSet) stops; with no published kind below it, the
pods have no owner to publish on.

Every object read must carry the uid its reference names: a reference to a
name that was deleted and made again leads nowhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: (group, kind) -> (plural, published): the kinds the walk reads.
KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("batch", "Job"): ("jobs", True),
    ("jobset.x-k8s.io", "JobSet"): ("jobsets", True),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): ("leaderworkersets", True),
    ("kubeflow.org", "PyTorchJob"): ("pytorchjobs", True),
    ("trainer.kubeflow.org", "TrainJob"): ("trainjobs", True),
    ("apps", "StatefulSet"): ("statefulsets", False),
    ("", "Pod"): ("pods", False),
}
#: Longest chain followed (the deepest above is four).
MAX_DEPTH = 6

#: (apiVersion, plural, namespace, name) -> the object, or None when absent.
Read = Callable[[str, str, str, str], "Mapping[str, Any] | None"]


@dataclass(frozen=True)
class Ref:
    """A controller reference."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class Owner:
    """An object to publish on, as read."""

    api_version: str
    kind: str
    plural: str
    name: str
    uid: str
    #: Its recency annotation as read (None: it has none).
    annotation: str | None = None
    #: The uids of every object walked to reach it, itself included: a
    #: Kueue Workload may be owned by any of them (the JobSet under a TrainJob).
    chain: tuple[str, ...] = ()


def controller_of(meta: Mapping[str, Any]) -> Ref | None:
    """The controller reference in an object's metadata, if any."""
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            fields = [ref.get(k) for k in ("apiVersion", "kind", "name", "uid")]
            if all(isinstance(f, str) and f for f in fields):
                return Ref(*fields)
    return None


def _group(api_version: str) -> str:
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def top_owner(namespace: str, first: Ref, read: Read, annotation: str) -> Owner | None:
    """The top-most owner of a published kind above `first` (a pod's
    controller), or None. `read` raises on what is neither found nor absent
    (a refusal, a timeout): the walk is then not answered, not cut short."""
    best: Owner | None = None
    ref: Ref | None = first
    chain: list[str] = []
    for _ in range(MAX_DEPTH):
        if ref is None:
            break
        known = KINDS.get((_group(ref.api_version), ref.kind))
        if known is None:
            break
        plural, published = known
        obj = read(ref.api_version, plural, namespace, ref.name)
        meta = (obj or {}).get("metadata") or {}
        if obj is None or meta.get("uid") != ref.uid:
            break
        chain.append(ref.uid)
        if published:
            value = (meta.get("annotations") or {}).get(annotation)
            best = Owner(ref.api_version, ref.kind, plural, ref.name, ref.uid,
                         value if isinstance(value, str) else None, tuple(chain))
        ref = controller_of(meta)
    return best


def names_owner(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `obj` (a Kueue Workload) lists the object `uid` among its owners."""
    return any(isinstance(r, Mapping) and r.get("uid") == uid
               for r in (obj.get("metadata") or {}).get("ownerReferences") or [])
