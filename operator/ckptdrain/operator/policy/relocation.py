"""Which changes of a policy would silently move its checkpoints, or change
how many pods write one, and whether the change says it means to.

A pod's store prefix, local-tier path and writer count are fixed in it at
injection. While pods of a policy live, changing where its checkpoints are
(`spec.storage.uri`, `spec.localTier.path`) splits the job: running pods
keep writing to the old location, and a pod created afterwards (a
replacement, a restarted rank) restores from and writes to the new one,
from step 0 if nothing is there. Changing `spec.writers` changes the rank
layout under running writers. Admission refuses both while pods live, on
UPDATE and on a CREATE of a policy whose namesake's pods still live
(admission/policy_rules.py); this module is the pure part:

- `guarded_changes(old, new)`: the guarded fields an UPDATE changes;
- `acknowledged(old, new)`: the UPDATE sets a new `spec.relocation.reason`,
  which lets the location fields change (never `writers`: a running job
  cannot change its writer count; suspend it, change, resume);
- `refused(old, new)`: what is left refused;
- `counts_as_live(pod, job)`: whether a pod still writes, or will be
  recreated, where it was injected to;
- `differs(pod, expected)`, `refused_on_create(fields, new)`: the same for
  a CREATE, judged against what the live pods were injected with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptdrain.contract.env import Env

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


# -- The pods a move would leave behind --------------------------------------
#
# Where an injected pod writes is fixed in it at injection: its environment
# names the store prefix and the writer count, its local-tier volume the
# node path. A policy changed (or deleted and created again) afterwards does
# not change a running pod; only pods created afterwards follow the new spec.

#: The injected containers' env (the pod contract) and the local tier's volume
#: (admission/injection.py), read back to say what a pod was injected with.
STORE_ENV, WRITERS_ENV = Env.STORE_URI.value, Env.WRITERS.value
LOCAL_VOLUME = "ckptdrain-local"
#: Job conditions after which the Job controller creates no pod again.
JOB_FINISHED = ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")


def controlling_job(pod: Mapping[str, Any]) -> str | None:
    """The name of the Job that controls `pod` (ownerReference with
    controller: true), or None."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "Job" \
                and str(ref.get("apiVersion") or "").startswith("batch/"):
            return str(ref.get("name") or "") or None
    return None


def job_finished(job: Mapping[str, Any] | None) -> bool:
    """Whether a Job is done creating pods: it has a finished condition, or it
    is gone (None)."""
    if job is None:
        return True
    return any(c.get("type") in JOB_FINISHED and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def counts_as_live(pod: Mapping[str, Any], job: Mapping[str, Any] | None = None) -> bool:
    """Whether `pod` still writes where it was injected to, or will be
    recreated from the same spec soon: running or pending, being deleted
    (it flushes its emergency checkpoint to the old location during its
    grace period), or Failed under a Job that is not finished (`job`: that
    Job as read, None when gone; the Job controller recreates the pod after
    a backoff). A Succeeded pod, a Failed pod of a finished Job and a Failed
    pod no Job controls do not count."""
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Succeeded":
        return False
    if phase == "Failed":
        return controlling_job(pod) is not None and not job_finished(job)
    return True


def why_live(pod: Mapping[str, Any]) -> str:
    """Why `pod`, which counts_as_live, still counts, for a refusal that
    names it: a pod being deleted or a Failed pod under its Job lasts only
    a while, and the user who just ended the job needs to know that a retry
    will pass once it is gone, not that the job still runs."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return ("being deleted: it flushes its emergency checkpoint to the old location "
                "first; retry once it is gone")
    if (pod.get("status") or {}).get("phase") == "Failed":
        return ("Failed, and its Job is not finished, so the Job controller may recreate it; "
                "retry once the Job has finished or is deleted")
    return "running or pending"


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def injected_with(pod: Mapping[str, Any]) -> dict[str, str]:
    """What an injected pod was given, by guarded field (`spec.storage.uri`:
    the store prefix, `spec.localTier.path`: the node path,
    `spec.writers`: the writer count); a field the pod does not show is
    left out."""
    found: dict[str, str] = {}
    for container in _containers(pod):
        for entry in container.get("env") or []:
            if entry.get("name") == STORE_ENV and "value" in entry:
                found.setdefault("spec.storage.uri", str(entry["value"]))
            elif entry.get("name") == WRITERS_ENV and "value" in entry:
                found.setdefault(WRITERS_FIELD, str(entry["value"]))
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if volume.get("name") == LOCAL_VOLUME and isinstance(volume.get("hostPath"), Mapping):
            found.setdefault("spec.localTier.path", str(volume["hostPath"].get("path") or ""))
    return found


def differs(pod: Mapping[str, Any], expected: Mapping[str, str]) -> list[str]:
    """The guarded fields whose `expected` value (as a pod would be injected
    with it now) differs from what `pod` was injected with, in a fixed order."""
    shown = injected_with(pod)
    order = [*LOCATION_FIELDS, WRITERS_FIELD]
    return [f for f in order if f in shown and f in expected and shown[f] != expected[f]]


def refused_on_create(fields: list[str], new: Mapping[str, Any]) -> list[str]:
    """Of the guarded `fields` a new policy gives other values than its
    namesake's live pods have, those it may not: any with no
    `spec.relocation.reason` set, `spec.writers` always."""
    ok = bool(reason(new))
    return [f for f in fields if f == WRITERS_FIELD or not ok]
