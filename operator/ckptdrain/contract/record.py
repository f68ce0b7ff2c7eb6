"""The `Checkpoint` record: one object per policy and step, so that
`kubectl get checkpoints` shows each checkpoint, its tiers, size and state.
Pure: builders of the objects and patches both sides send.

Who writes what: the operator alone. Each writer reports its progress on
its own pod (contract/progress.py); the operator makes the record when a
writer first names the step and folds the reports into rank ranges and the
aggregate (`state`, `size`, `tiers`, `writersReady`, `completionTime`),
then applies retention (operator/records/aggregate.py).

`writer_patch` is the per-writer claim older agents patched into
`status.writers.<id>`; the operator still folds such claims in, and the
tests build legacy records with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from ckptdrain.contract.api import (
    API_VERSION,
    KIND_CHECKPOINT,
    KIND_POLICY,
    LABEL_POLICY,
    POLICY_API_VERSION,
    timestamp,
)


class State(StrEnum):
    """A checkpoint's state, per writer and in aggregate:

        Capturing -> Local -> Draining -> Global -> Expired (retention; operator only)
                                ^   |
                                |   v
                              Retrying (the store failed transiently; the agent retries)

    and Failed from any of the first four (with the reason): given up, or
    something only a person can fix (a corrupt copy, a conflicting commit,
    denied credentials, a capture the local tier cannot hold).
    """

    CAPTURING = "Capturing"
    LOCAL = "Local"
    DRAINING = "Draining"
    RETRYING = "Retrying"
    GLOBAL = "Global"
    FAILED = "Failed"
    EXPIRED = "Expired"


STATES = tuple(s.value for s in State)
#: Tier names a writer's claim lists in `tiers`: the node-local tier, a partner
#: agent's copy on another node (docs/peer-tier.md), the store.
TIERS = ("local", "peer", "global")
#: A writer claim's `requests`: what its drain cost the store.
REQUEST_FIELDS = frozenset({"put", "get", "list", "delete", "bytesUp", "bytesDown"})


def record_name(policy: str, step: int) -> str:
    """Deterministic, so every writer of a step finds the same record."""
    base = re.sub(r"[^a-z0-9-]", "-", policy.lower())[:230].strip("-")
    return f"{base}-s{step}"


def owner_reference(policy: str, policy_uid: str) -> dict[str, Any]:
    """The record belongs to its policy: deleting the policy deletes its records.
    The policy is named at its storage version; the garbage collector finds
    an owner by group, kind and uid, so a reference written at v1alpha1
    (before 0.3.0) names the same owner, and readers match owners by uid."""
    return {"apiVersion": POLICY_API_VERSION, "kind": KIND_POLICY, "name": policy,
            "uid": policy_uid}


def build_record(namespace: str, policy: str, step: int, writers: int,
                 policy_uid: str | None = None) -> dict[str, Any]:
    """A new Checkpoint object (owned by its policy when the uid is known)."""
    meta: dict[str, Any] = {"name": record_name(policy, step), "namespace": namespace,
                            "labels": {LABEL_POLICY: policy}}
    if policy_uid:
        meta["ownerReferences"] = [owner_reference(policy, policy_uid)]
    return {"apiVersion": API_VERSION, "kind": KIND_CHECKPOINT, "metadata": meta,
            "spec": {"policy": policy, "step": step, "writers": writers}}


def writer_patch(writer_id: str, state: str, size_bytes: int, tiers: Iterable[str],
                 now: datetime, node: str | None = None,
                 message: str | None = None, peer_holder: int | None = None,
                 requests: Mapping[str, int] | None = None,
                 peer_node: str | None = None) -> dict[str, Any]:
    """Merge patch for the status subresource: this writer's claim only.
    `requests`: what draining the checkpoint cost in store requests and bytes
    (put, get, list, delete, bytesUp, bytesDown; request_counts.py)."""
    if state not in STATES:
        raise ValueError(f"state: expected one of {', '.join(STATES)}, got {state!r}")
    tiers = set(tiers)
    unknown = tiers - set(TIERS)
    if unknown:
        raise ValueError(f"tiers: expected names from {', '.join(TIERS)}, got {sorted(unknown)}")
    claim: dict[str, Any] = {"state": state, "bytes": int(size_bytes),
                             "tiers": sorted(tiers), "updateTime": timestamp(now)}
    if node:
        claim["node"] = node
    if message:
        claim["message"] = message
    if peer_holder is not None:
        claim["peerHolder"] = int(peer_holder)  # the rank whose node holds the peer copy
    if peer_node:
        claim["peerNode"] = peer_node  # that node: a holder rescheduled elsewhere lost it
    if requests:
        unknown = set(requests) - REQUEST_FIELDS
        if unknown:
            raise ValueError(f"requests: expected keys among {sorted(REQUEST_FIELDS)}, "
                             f"got {sorted(unknown)}")
        claim["requests"] = {k: int(v) for k, v in requests.items()}
    return {"status": {"writers": {writer_id: claim}}}
