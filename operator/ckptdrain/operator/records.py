"""Checkpoint records: one `Checkpoint` object per policy and step, so that
`kubectl get checkpoints` shows each checkpoint, its tiers, size and state.

Who writes what (so that nobody overwrites anybody):
- each agent creates the record if absent (deterministic name, so racing
  agents make one record) and merge-patches only `status.writers.<its id>`;
- the operator derives the aggregate (`state`, `size`, `tiers`, `writers`
  summary, `completionTime`) from the writers' claims and applies retention.

Completion trusts the agents' claims: an agent reports `Global` for its shard
only after its manifest is written and verified in the store; the operator
marks the checkpoint Global (complete) when every expected writer has done so.
The operator holds no store credentials, by design.

Builders and the aggregation are pure; `RecordWriter` is the tiny client the
agent calls (it imports `kubernetes` only when constructed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ckptdrain import units

GROUP, VERSION, PLURAL = "ckptdrain.io", "v1alpha1", "checkpoints"
LABEL_POLICY = "ckptdrain.io/policy"
STATES = ("Capturing", "Local", "Draining", "Global", "Failed", "Expired")
_RANK = {"Capturing": 0, "Local": 1, "Draining": 2, "Global": 3}


def record_name(policy: str, step: int) -> str:
    """Deterministic, so every writer of a step finds the same record."""
    base = re.sub(r"[^a-z0-9-]", "-", policy.lower())[:230].strip("-")
    return f"{base}-s{step}"


def owner_reference(policy: str, policy_uid: str) -> dict[str, Any]:
    """The record belongs to its policy: deleting the policy deletes its records."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CheckpointPolicy", "name": policy,
            "uid": policy_uid}


def owner_patch(record: Mapping[str, Any], policy_uid: str | None) -> dict[str, Any] | None:
    """Metadata patch adding the policy as owner (agents don't know its uid); None if set."""
    meta = record.get("metadata", {})
    if not policy_uid or any(r.get("uid") == policy_uid for r in meta.get("ownerReferences")
                             or []):
        return None
    ref = owner_reference(record.get("spec", {}).get("policy", ""), policy_uid)
    return {"metadata": {"ownerReferences": [*(meta.get("ownerReferences") or []), ref]}}


def build_record(namespace: str, policy: str, step: int, writers: int,
                 policy_uid: str | None = None) -> dict[str, Any]:
    """A new Checkpoint object (owned by its policy when the uid is known)."""
    meta: dict[str, Any] = {"name": record_name(policy, step), "namespace": namespace,
                            "labels": {LABEL_POLICY: policy}}
    if policy_uid:
        meta["ownerReferences"] = [owner_reference(policy, policy_uid)]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Checkpoint", "metadata": meta,
            "spec": {"policy": policy, "step": step, "writers": writers}}


def writer_patch(writer_id: str, state: str, size_bytes: int, tiers: Iterable[str],
                 now: datetime, node: str | None = None,
                 message: str | None = None) -> dict[str, Any]:
    """Merge patch for the status subresource: this writer's claim only."""
    if state not in STATES:
        raise ValueError(f"state: expected one of {', '.join(STATES)}, got {state!r}")
    claim: dict[str, Any] = {"state": state, "bytes": int(size_bytes),
                             "tiers": sorted(set(tiers)),
                             "updateTime": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if node:
        claim["node"] = node
    if message:
        claim["message"] = message
    return {"status": {"writers": {writer_id: claim}}}


@dataclass(frozen=True)
class Summary:
    state: str
    size_bytes: int
    tiers: str
    writers: str
    complete: bool


def summarize(record: Mapping[str, Any]) -> Summary:
    """The aggregate of every writer's claim."""
    spec = record.get("spec", {})
    status = record.get("status") or {}
    expected = int(spec.get("writers", 1))
    claims = list((status.get("writers") or {}).values())
    size = sum(int(c.get("bytes", 0)) for c in claims)
    done = sum(1 for c in claims if c.get("state") == "Global")
    if status.get("state") == "Expired":
        state = "Expired"
    elif any(c.get("state") == "Failed" for c in claims):
        state = "Failed"
    elif done >= expected:
        state = "Global"
    elif not claims:
        state = "Capturing"
    elif len(claims) >= expected and all(_RANK.get(c.get("state", ""), 0) >= 1 for c in claims):
        state = "Draining" if any(_RANK.get(c.get("state", ""), 0) >= 2 for c in claims) \
            else "Local"
    else:
        state = "Draining" if any(_RANK.get(c.get("state", ""), 0) >= 2 for c in claims) \
            else "Capturing"
    tiers = sorted({t for c in claims for t in c.get("tiers", [])} - (
        set() if done >= expected else {"global"}))
    return Summary(state=state, size_bytes=size, tiers=",".join(tiers) or "-",
                   writers=f"{len(claims)}/{expected}", complete=done >= expected)


def aggregate_patch(record: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """Status fields the operator writes; {} when nothing changes."""
    s = summarize(record)
    status = record.get("status") or {}
    wanted: dict[str, Any] = {"state": s.state, "sizeBytes": s.size_bytes,
                              "size": units.format_bytes(s.size_bytes), "tiers": s.tiers,
                              "writersReady": s.writers}
    if s.complete and not status.get("completionTime"):
        wanted["completionTime"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    changed = {k: v for k, v in wanted.items() if status.get(k) != v}
    return changed


def to_expire(records: Iterable[Mapping[str, Any]], keep: int) -> list[str]:
    """Names of complete records beyond the newest `keep`; never the newest complete."""
    complete = [r for r in records if summarize(r).state == "Global"]
    complete.sort(key=lambda r: int(r["spec"]["step"]), reverse=True)
    return [r["metadata"]["name"] for r in complete[max(1, keep):]]


def latest_steps(records: Iterable[Mapping[str, Any]]
                 ) -> tuple[int | None, int | None, str | None]:
    """(newest step on a local tier, newest complete global step, its completion time)."""
    local = glob = None
    when = None
    for r in records:
        s = summarize(r)
        step = int(r["spec"]["step"])
        if s.state in ("Local", "Draining", "Global") and (local is None or step > local):
            local = step
        if s.state == "Global" and (glob is None or step > glob):
            glob, when = step, (r.get("status") or {}).get("completionTime")
    return local, glob, when


class RecordWriter:
    """What an agent calls: make sure the record exists, then report its shard."""

    def __init__(self, namespace: str, policy: str, writers: int, writer_id: str,
                 api: Any = None) -> None:
        if api is None:
            from kubernetes import client, config  # the agent's edge, not the core
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.CustomObjectsApi()
        self.api, self.namespace, self.policy = api, namespace, policy
        self.writers, self.writer_id = writers, writer_id
        self._ensured: set[int] = set()

    def ensure(self, step: int) -> str:
        """Create the step's record unless another writer already did; returns its name."""
        from kubernetes.client.exceptions import ApiException
        body = build_record(self.namespace, self.policy, step, self.writers)
        if step in self._ensured:
            return str(body["metadata"]["name"])
        try:
            self.api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        except ApiException as error:
            if error.status != 409:
                raise
        self._ensured.add(step)
        return str(body["metadata"]["name"])

    def report(self, step: int, state: str, size_bytes: int, tiers: Iterable[str],
               now: datetime, node: str | None = None, message: str | None = None) -> None:
        name = self.ensure(step)
        patch = writer_patch(self.writer_id, state, size_bytes, tiers, now, node, message)
        self.api.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, name, patch,
            _content_type="application/merge-patch+json")
