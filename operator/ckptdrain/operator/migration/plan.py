"""When a CRD's objects stored before its storage version changed are all
rewritten, and when its status.storedVersions may forget the old version.
Pure.

The apiserver encodes an object at the storage version of the moment it
writes it, and never rewrites an object nobody writes: after the CRD's
storage version changes, etcd holds objects of both versions until each is
written again. status.storedVersions lists every version that may still be
in etcd; a version may leave the CRD's spec.versions only once it has left
storedVersions. A pass (the method of kube-storage-version-migrator):

    read the CRD ............................... `before`
    the apiserver serves the new storage version  (discovery's storageVersionHash)
    ... for the settle time at least ............ `served_for_s` >= `settle_s`
    list every object at the storage version, every page
    write each back unchanged, at the resourceVersion listed
    read the CRD again ......................... `after`
    trim storedVersions to [storage], at `after`'s resourceVersion

Each object's write ends one of four ways (Outcome). A conflict means that
someone wrote the object after we listed it, so after the flip: it is held
at the storage version already. An object created during the pass is
written at the storage version too. So the trim is safe when nothing
failed, the list was whole, and the storage version did not change (nor
change and change back: the generation) between the two reads.

One limit: discovery is one apiserver's answer. On a control plane of
several, another may not have seen the CRD's change yet and may still
write at the old version after the list; the settle time (a minute by
default) gives every apiserver that long to see it, counted from the first
pass that saw discovery show the new storage version. An apiserver slower
than that is not detected (kube-storage-version-migrator had the same limit
before the StorageVersion API).
"""

from __future__ import annotations

import base64
import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptdrain.errors import InvalidInput


@dataclass(frozen=True)
class CrdState:
    """What a pass needs of the CRD as read at one moment."""

    storage: str
    stored: tuple[str, ...]
    generation: int
    resource_version: str

    @property
    def migrated(self) -> bool:
        """Whether etcd can hold no version but the storage version."""
        return self.stored == (self.storage,)


def crd_state(crd: Mapping[str, Any]) -> CrdState:
    """The state of a CRD object as the apiserver returns it. InvalidInput,
    naming the field, when it has no single storage version."""
    versions = (crd.get("spec") or {}).get("versions") or []
    storage = [v.get("name") for v in versions if isinstance(v, Mapping) and v.get("storage")]
    if len(storage) != 1 or not isinstance(storage[0], str):
        raise InvalidInput("spec.versions[].storage", "exactly one storage version",
                           storage)
    meta = crd.get("metadata") or {}
    stored = (crd.get("status") or {}).get("storedVersions") or []
    return CrdState(storage=storage[0], stored=tuple(str(v) for v in stored),
                    generation=int(meta.get("generation") or 0),
                    resource_version=str(meta.get("resourceVersion") or ""))


def storage_version_hash(group: str, version: str, kind: str) -> str:
    """The storageVersionHash discovery shows for a resource stored at
    group/version, kind (the apiserver's StorageVersionHash: the first 8
    bytes of SHA-256 over "group/version/kind", base64)."""
    digest = hashlib.sha256(f"{group}/{version}/{kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode()


class Outcome(enum.Enum):
    """How one object's rewrite ended."""

    #: Written back by us: now held at the storage version.
    REWRITTEN = "rewritten"
    #: Changed since we listed it (409): someone wrote it after the flip.
    CONFLICT = "conflict"
    #: Deleted since we listed it (404): nothing left to hold.
    GONE = "gone"
    #: Anything else (a timeout, a refusal): its version is not known.
    FAILED = "failed"


#: Outcomes after which the object is known to be at the storage version (or gone).
SETTLED = frozenset({Outcome.REWRITTEN, Outcome.CONFLICT, Outcome.GONE})


@dataclass(frozen=True)
class Pass:
    """One pass of rewrites, between two reads of the CRD."""

    before: CrdState
    after: CrdState
    #: Whether discovery showed the storage version's hash before the list.
    served: bool
    #: How long discovery had shown it when the list began, seconds.
    served_for_s: float
    #: How long every apiserver is given to see the CRD's change first, seconds.
    settle_s: float
    #: Whether the list read every page.
    complete: bool
    outcomes: Mapping[str, Outcome]


def may_trim(done: Pass) -> tuple[bool, str]:
    """Whether storedVersions may become [storage] after `done`, and why
    (or why not), in words for the log."""
    before, after = done.before, done.after
    if after.migrated:
        return False, f"storedVersions is [{after.storage}] already"
    if (before.storage, before.generation) != (after.storage, after.generation):
        return False, (f"the CRD changed during the pass (storage {before.storage} -> "
                       f"{after.storage}, generation {before.generation} -> "
                       f"{after.generation}); passing again")
    if not done.served:
        return False, (f"the apiserver does not serve {after.storage} as the storage "
                       "version yet (discovery's storageVersionHash)")
    if done.served_for_s < done.settle_s:
        return False, (f"discovery has shown {after.storage} as the storage version for "
                       f"{done.served_for_s:.0f}s of the {done.settle_s:.0f}s every apiserver "
                       "of the control plane is given to see it")
    if not done.complete:
        return False, "the list of objects was cut short"
    failed = sorted(name for name, outcome in done.outcomes.items()
                    if outcome not in SETTLED)
    if failed:
        shown = ", ".join(failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5
                                         else "")
        return False, f"{len(failed)} object(s) not rewritten: {shown}"
    return True, (f"every object ({len(done.outcomes)}) rewritten at {after.storage}; "
                  f"storedVersions {list(after.stored)} -> [{after.storage}]")
