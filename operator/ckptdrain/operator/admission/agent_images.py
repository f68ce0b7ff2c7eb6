"""The record of the agent images this installation has injected, and the
image admission gives a writer pod (admission/agent_pin.py decides which).

The record is one ConfigMap in the operator's namespace
(CKPTDRAIN_AGENT_IMAGES, "namespace/name"; the chart renders it empty),
holding the last KEEP images, the most recently started last, each with the
injection layout (LAYOUTS) and the node tier mode (CKPTDRAIN_NODE_TIER) it
was recorded under: a pod of one mode mounts its node tier otherwise than a
pod of the other, so an image that ran only in one is never given to a pod
of the other. An entry of an earlier release names no mode and layout 1
(0.1.0 and 0.2.0 injected both modes so): it is given to hostPath pods,
whose layout is still 1, so the upgrade from one of them pins its running
hostPath workloads. A csi pod is layout 2 now (the trainer's work dir in the
driver's volume, made by restore), so its replacements get this release's
image, whose restore makes that dir. Every replica of the operator
records its own image when it starts (moved to the end when it is there: a
rollback makes the older image the newest again), by an update at the
version read, so two replicas starting together never drop each other's;
it tries until it succeeds. Nothing else writes it, and tenants cannot. A
record it cannot parse is never overwritten (a person edited it: the log
says so, and only the operator's own image is given until it is fixed).

Admission reads it every REFRESH_S. A read that fails keeps the list it
had, so an apiserver hiccup never turns pinning off; until the first read
succeeds only the operator's own image is given.

An image recorded more than KEEP upgrades ago is dropped, and so is every
image when the record is emptied (`helm upgrade --force` replaces the
ConfigMap the chart renders): the workloads still running them get the
operator's image for their replacements, as before pinning existed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from ckptdrain.contract.api import (
    ANNOTATION_POLICY,
    LABEL_WRITER,
    LABEL_WRITER_POLICY,
    policy_labelled,
    timestamp,
)
from ckptdrain.operator.admission import agent_pin
from ckptdrain.operator.config import NODE_TIER_CSI, NODE_TIER_HOSTPATH, OperatorConfig

log = logging.getLogger(__name__)

#: The ConfigMap's key.
KEY = "images.json"
#: What the pods this release injects ask of the agent image, per node tier
#: mode: its commands, the mounts and environment it needs. Raise a mode's
#: layout when an agent of an earlier release could not run in the pod this
#: release injects in that mode (or the reverse): images recorded under
#: another layout are then never given. csi is 2: its trainer's work dir is
#: a subPath of the driver's volume that restore must make (restore/pod_work.py);
#: an earlier restore does not, kubelet would make it root's, and a non-root
#: trainer could not write its checkpoints.
LAYOUTS = {NODE_TIER_HOSTPATH: 1, NODE_TIER_CSI: 2}


def layout_of(node_tier: str) -> int:
    """The injection layout of pods of the node tier mode `node_tier`."""
    return LAYOUTS[node_tier]
#: Images kept: one per upgrade.
KEEP = 10
#: How often admission reads the record again.
REFRESH_S = 30.0
#: Pauses between tries to record the operator's image, the last repeated.
RECORD_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
READ_TIMEOUT_S = 3.0
#: The longest a writer's admission waits for the live writers from the
#: apiserver when no view can say (its webhook has 5 s in all).
WRITERS_READ_TIMEOUT_S = 2.0

#: (namespace, policy, generation, pod name) → image → live writers of that
#: generation running it, the pod itself not counted (None: the view cannot
#: say; the apiserver's watch cache is asked).
RunningView = Callable[[str, str, str, str], "dict[str, int] | None"]


class UnreadableRecord(ValueError):
    """The record holds something this module did not write."""


def entries(data: Mapping[str, str] | None) -> list[dict[str, Any]]:
    """The record's entries ({"image", "since", "layout", "nodeTier"}),
    oldest first; []
    for no record. UnreadableRecord for one this module did not write."""
    text = (data or {}).get(KEY)
    if text is None:
        return []
    try:
        found = json.loads(text)["images"]
        kept = [{"image": e["image"], "since": str(e.get("since", "")),
                 "layout": e.get("layout"), "nodeTier": e.get("nodeTier")}
                for e in found]
        if not all(isinstance(e["image"], str) and e["image"] for e in kept):
            raise TypeError("an image is not a name")
    except (ValueError, KeyError, TypeError) as error:
        raise UnreadableRecord(f"key {KEY} is not a list of recorded images ({error})") \
            from None
    return kept


def recorded(data: Mapping[str, str] | None, *, node_tier: str,
             layout: int | None = None) -> tuple[str, ...]:
    """The images recorded for `layout` and the node tier mode `node_tier`
    (or for no mode: an earlier release's, which served both), oldest first
    (UnreadableRecord). `layout`: the mode's own unless given."""
    layout = layout_of(node_tier) if layout is None else layout
    return tuple(dict.fromkeys(e["image"] for e in entries(data)
                               if e["layout"] == layout and e["nodeTier"] in (node_tier, None)))


def with_image(data: Mapping[str, str] | None, image: str, at: datetime, *,
               node_tier: str, keep: int = KEEP, layout: int | None = None
               ) -> dict[str, str] | None:
    """The record's data with `image` under `node_tier` the newest (added, or
    moved to the end; the oldest dropped past `keep`; the same image under
    the other mode kept: it ran there too); None when it is the newest
    already. UnreadableRecord: never overwrite what a person wrote."""
    kept = entries(data)
    layout = layout_of(node_tier) if layout is None else layout
    newest = {"image": image, "layout": layout, "nodeTier": node_tier}
    if kept and {k: kept[-1][k] for k in newest} == newest:
        return None
    kept = [e for e in kept if (e["image"], e["nodeTier"]) != (image, node_tier)]
    kept = [*kept, {"image": image, "since": timestamp(at), "layout": layout,
                    "nodeTier": node_tier}][-keep:]
    return {KEY: json.dumps({"images": kept}, indent=1)}


def _ref(cfg: OperatorConfig) -> tuple[str, str]:
    namespace, name = cfg.agent_images.split("/")
    return namespace, name


# -- recording: every replica of the operator, at start ----------------------------


def record_once(cfg: OperatorConfig) -> bool:
    """Add the operator's image to the record; True when it is there now,
    False on a conflict (another replica wrote first: read again)."""
    from ckptdrain.operator.apiserver.kube import ApiException, _clients

    namespace, name = _ref(cfg)
    core, _ = _clients()
    try:
        found = core.read_namespaced_config_map(name, namespace)
    except ApiException as error:
        if error.status != 404:
            raise
        found = None
    now = datetime.now(UTC)
    data = with_image(None if found is None else found.data, cfg.image, now,
                      node_tier=cfg.node_tier)
    if data is None:
        return True
    try:
        if found is None:
            core.create_namespaced_config_map(namespace, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "labels": {
                    "app.kubernetes.io/managed-by": "ckptdrain-operator"}},
                "data": data})
        else:
            found.data = data  # at the version read: a concurrent write conflicts
            core.replace_namespaced_config_map(name, namespace, found)
    except ApiException as error:
        if error.status == 409:
            return False
        raise
    log.info("agent image %s recorded in ConfigMap %s/%s", cfg.image, namespace, name)
    return True


def record(cfg: OperatorConfig, stopping: threading.Event) -> bool:
    """record_once until it holds or `stopping` is set, pausing between
    failures (said in the log); a record that cannot be parsed is left as
    it is. True once recorded."""
    attempt = 0
    while not stopping.is_set():
        try:
            if record_once(cfg):
                return True
            continue  # a conflict: read again at once
        except UnreadableRecord as error:
            log.error("the record of agent images %s was edited by hand and is not "
                      "overwritten: %s; until it is fixed or emptied, admission keeps no "
                      "image but the operator's own %s", cfg.agent_images, error, cfg.image)
            return False
        except Exception as error:
            if getattr(error, "status", None) == 403:
                # Not ours to make (the chart renders it and grants only
                # get/update): a person deleted it. Said once, not every minute.
                log.error("may not write the record of agent images %s (%s): pinning keeps "
                          "only the images recorded before; `helm upgrade` renders the "
                          "ConfigMap again", cfg.agent_images, error)
                return False
            log.warning("could not record agent image %s in ConfigMap %s (tried again): %s",
                        cfg.image, cfg.agent_images, error)
        stopping.wait(RECORD_RETRY_S[min(attempt, len(RECORD_RETRY_S) - 1)])
        attempt += 1
    return False


def start_recording(cfg: OperatorConfig) -> None:
    """record() in a daemon thread: the operator starts without waiting."""
    if cfg.agent_images:
        threading.Thread(target=record, args=(cfg, threading.Event()),
                         name="ckptdrain-agent-images-record", daemon=True).start()


# -- reading: admission -------------------------------------------------------------


class AllowedImages:
    """The recorded images of this layout and node tier mode as admission
    last read them; thread-safe."""

    def __init__(self, cfg: OperatorConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self._images: tuple[str, ...] | None = None

    def images(self) -> tuple[str, ...] | None:
        """Oldest first; None until a first read succeeded."""
        with self._lock:
            return self._images

    def read(self) -> None:
        """Read the record now; a failure keeps what was read before and is
        raised. A record that cannot be parsed reads as nothing recorded."""
        from ckptdrain.operator.apiserver import reads

        namespace, name = _ref(self.cfg)
        try:
            found = reads.get_json(f"/api/v1/namespaces/{quote(namespace, safe='')}/"
                                   f"configmaps/{quote(name, safe='')}", [], READ_TIMEOUT_S)
        except reads.ApiError as error:
            if error.status != 404:
                raise
            found = {}
        try:
            images = recorded(found.get("data"), node_tier=self.cfg.node_tier)
        except UnreadableRecord as error:
            log.warning("the record of agent images %s: %s; read as nothing recorded",
                        self.cfg.agent_images, error)
            images = ()
        with self._lock:
            self._images = images


def follow(allowed: AllowedImages, stopping: threading.Event) -> threading.Thread:
    """Read the record every REFRESH_S in a daemon thread."""
    def loop() -> None:
        failing = False
        while True:
            try:
                allowed.read()
                if failing:
                    log.info("the record of agent images is read again")
                failing = False
            except Exception as error:  # kept what it had; said once per outage
                if not failing:
                    log.warning("could not read the record of agent images %s (%s): "
                                "admission keeps the list it read before",
                                allowed.cfg.agent_images, error)
                failing = True
            if stopping.wait(REFRESH_S):
                return
    thread = threading.Thread(target=loop, name="ckptdrain-agent-images", daemon=True)
    thread.start()
    return thread


def running_images(namespace: str, policy: str, generation: str, me: str
                   ) -> dict[str, int]:
    """image → the live writers of `policy` of `generation` running it (`me`
    not counted), from the apiserver's watch cache: one LIST of the
    policy's writers by label, for when no view can say."""
    from ckptdrain.operator.apiserver import reads

    selector = f"{LABEL_WRITER},{LABEL_WRITER_POLICY}={policy}" if policy_labelled(policy) \
        else LABEL_WRITER
    found = reads.get_json(f"/api/v1/namespaces/{quote(namespace, safe='')}/pods",
                           [("labelSelector", selector), ("resourceVersion", "0")],
                           WRITERS_READ_TIMEOUT_S)
    counts: dict[str, int] = {}
    for pod in found.get("items") or []:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if ((meta.get("annotations") or {}).get(ANNOTATION_POLICY) != policy
                or meta.get("deletionTimestamp") or meta.get("name") == me
                or status.get("phase") in ("Succeeded", "Failed")):
            continue
        found_sibling = agent_pin.sibling(pod)
        if found_sibling.generation == generation and found_sibling.image:
            counts[found_sibling.image] = counts.get(found_sibling.image, 0) + 1
    return counts


@dataclass(frozen=True)
class Pinning:
    """What admission pins agent images with: the record as last read, and a
    view of the live writers (None: the apiserver's watch cache is asked)."""

    allowed: AllowedImages
    view: RunningView | None = None


async def image_for(pod: Mapping[str, Any], namespace: str, policy: str, writer: bool,
                    cfg: OperatorConfig, pinning: Pinning | None) -> agent_pin.Choice:
    """The agent image for `pod` of `policy` (agent_pin.py). The operator's
    own with pinning off (CKPTDRAIN_AGENT_IMAGES empty, or no `pinning`),
    for readers and pods without a generation, and, said, when the live
    writers could not be read: it never refuses a pod."""
    generation = agent_pin.generation(pod)
    if not cfg.agent_images or pinning is None or not writer or generation is None \
            or not agent_pin.pinned(pod):
        return agent_pin.Choice(cfg.image)
    me = (pod.get("metadata") or {}).get("name") or ""
    view = pinning.view
    running = view(namespace, policy, generation, me) if view is not None else None
    if running is None:
        try:
            running = await asyncio.to_thread(running_images, namespace, policy, generation,
                                              me)
        except Exception as error:
            return agent_pin.Choice(cfg.image, (
                f"could not read the live writers of policy {policy} ({error}): this pod "
                f"gets agent image {cfg.image}, which may differ from theirs"))
    return agent_pin.choose(cfg.image, pinning.allowed.images(), pod, running)
