"""Which agent image a writer pod gets: the one the other live writers of its
workload run, so that an operator upgrade never mixes two agent releases in
one running job; the operator's own for a workload's first pods. Pure: the
pods come in as plain dicts, the recorded images as a list.

Why per workload, and which workload. The writers of one job agree on their
restore step and fence each other through one protocol; a rank replaced after
an upgrade would run the new agent beside the old ones. A replacement keeps
the image of its *generation* of the workload: the pods one start of it
created that still run.
- JobSet: its name, uid (`jobset.sigs.k8s.io/jobset-uid`, where the JobSet
  sets it) and restart attempt (`jobset.sigs.k8s.io/restart-attempt`, a label
  and an annotation on every pod): a failure restart, or the JobSet deleted
  and applied again, is a new generation even while old pods terminate.
- LeaderWorkerSet: its name and template revision
  (`leaderworkerset.sigs.k8s.io/template-revision-hash`): a group restarted
  beside running groups keeps their agent; a rolling update moves.
- Anything else with a controller (an Indexed Job, a StatefulSet, a
  PyTorchJob): that controller's uid. A Job deleted and created again, or a
  StatefulSet recreated, is a new generation.
- A bare pod: none (nothing replaces it).
Pods being deleted or finished never count, nor pods the webhook did not
inject. A pod annotated `ckptdrain.io/agent-image-pin: "false"` is never
pinned (a workload that wants to move without being recreated).

A workload created while the operator itself rolls out (replicas of two
releases admitting at once, a minute or so) may start with pods of both
images, each replica giving its own; its replacements then take the image
most of its writers run.

Which images may be given: only those this installation recorded for the
same injection layout (admission/agent_images.py), and the operator's own. A
pod's labels and annotations can be edited by whoever may edit the pod, so
what live pods say they run is a choice among those, never a way to run
another image: within a namespace, whoever may create or edit pods can
sway which recorded image its workloads' replacements get, nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptdrain.contract.api import (
    ANNOTATION_AGENT_IMAGE,
    ANNOTATION_INJECTED,
    LABEL_INJECT,
)
from ckptdrain.operator.policy.identity import JOBSET_NAME, LWS_NAME

JOBSET_RESTART = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
LWS_REVISION = "leaderworkerset.sigs.k8s.io/template-revision-hash"
#: The labels (and annotations) `generation` reads, besides owner references.
GENERATION_LABELS = (JOBSET_NAME, JOBSET_UID, JOBSET_RESTART, LWS_NAME, LWS_REVISION)
#: Set to "false" on a pod (or its template): never pinned.
ANNOTATION_PIN = "ckptdrain.io/agent-image-pin"


@dataclass(frozen=True)
class Sibling:
    """A live writer pod of the same policy, as admission sees it."""

    name: str
    generation: str | None
    image: str | None


@dataclass(frozen=True)
class Choice:
    """The image a pod gets, and what admission says about it (None: nothing)."""

    image: str
    note: str | None = None


def generation(pod: Mapping[str, Any]) -> str | None:
    """The generation of the workload `pod` belongs to (module docstring), or
    None for a pod no controller made."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    notes = meta.get("annotations") or {}

    def said(key: str) -> str:
        value = labels.get(key) or notes.get(key)
        return value if isinstance(value, str) else ""

    if said(JOBSET_NAME):
        return f"JobSet/{said(JOBSET_NAME)}/{said(JOBSET_UID)}/{said(JOBSET_RESTART)}"
    if said(LWS_NAME):
        return f"LeaderWorkerSet/{said(LWS_NAME)}/{said(LWS_REVISION)}"
    for owner in meta.get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("controller") is True \
                and isinstance(owner.get("uid"), str) and owner["uid"]:
            return f"{owner.get('kind', '')}/{owner['uid']}"
    return None


def running_image(pod: Mapping[str, Any]) -> str | None:
    """The agent image an injected pod says it runs (its annotation); None
    for a pod that never went through the webhook (not opted in)."""
    meta = pod.get("metadata") or {}
    notes = meta.get("annotations") or {}
    if (meta.get("labels") or {}).get(LABEL_INJECT) != "true" \
            or notes.get(ANNOTATION_INJECTED) != "true":
        return None
    value = notes.get(ANNOTATION_AGENT_IMAGE)
    return value if isinstance(value, str) and value else None


def sibling(pod: Mapping[str, Any]) -> Sibling:
    return Sibling((pod.get("metadata") or {}).get("name") or "", generation(pod),
                   running_image(pod))


def pinned(pod: Mapping[str, Any]) -> bool:
    """Whether the pod may be pinned (not opted out)."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    return str(notes.get(ANNOTATION_PIN, "")).strip().lower() != "false"


def choose(current: str, allowed: Sequence[str] | None, pod: Mapping[str, Any],
           running: Mapping[str, int]) -> Choice:
    """The agent image for writer `pod`. `running`: image → how many live
    writers of the pod's generation run it (the pod itself not counted).
    `allowed`: the recorded images of this layout, oldest first; None while
    the record could not be read (only `current` is then given).

    The image most of them run, among the allowed ones (ties: the operator's
    own, then the most recently recorded); with none, the operator's own."""
    where = (generation(pod) or "workload").split("/", 1)[0]
    if generation(pod) is None or not pinned(pod):
        return Choice(current)
    order = {image: i for i, image in enumerate(allowed or ())}
    usable = {image: n for image, n in running.items()
              if n > 0 and (image == current or image in order)}
    if not usable:
        refused = sorted(image for image, n in running.items() if n > 0)
        if not refused:
            return Choice(current)
        why = ("the record of agent images could not be read yet" if allowed is None else
               "it is not among the agent images this installation recorded")
        return Choice(current, (f"the other live writers of this {where} run agent image "
                                f"{refused[0]}, but {why}: this pod gets {current}"))
    image, count = max(usable.items(),
                       key=lambda kv: (kv[1], kv[0] == current, order.get(kv[0], -1)))
    if image == current:
        return Choice(current)
    return Choice(image, (
        f"agent image {image} kept: {count} other live writer(s) of this {where} run it; "
        f"the workload moves to {current} when it is recreated (docs/install.md, Upgrades)"))
