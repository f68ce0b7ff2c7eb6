"""The node side's calls to the apiserver: the agent's Checkpoint record
client and the annotation restore leaves on its own pod.

Both import `kubernetes` only when they build a client (kubeclient.py), so
a node without API access pays nothing. Callers treat every failure here as
optional: records and annotations inform, training never waits on them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ckptdrain import kubeclient
from ckptdrain.contract.api import CHECKPOINTS, GROUP, VERSION
from ckptdrain.contract.record import build_record, writer_patch

log = logging.getLogger(__name__)


class RecordWriter:
    """What an agent calls: make sure the step's record exists, then report its shard."""

    def __init__(self, namespace: str, policy: str, writers: int, writer_id: str,
                 api: Any = None) -> None:
        self.api = api if api is not None else kubeclient.custom_objects_api()
        self.namespace, self.policy = namespace, policy
        self.writers, self.writer_id = writers, writer_id
        self._ensured: set[int] = set()

    def ensure(self, step: int) -> str:
        """Create the step's record unless another writer already did; returns its name."""
        from kubernetes.client.exceptions import ApiException

        body = build_record(self.namespace, self.policy, step, self.writers)
        if step in self._ensured:
            return str(body["metadata"]["name"])
        try:
            self.api.create_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                     CHECKPOINTS, body)
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
            GROUP, VERSION, self.namespace, CHECKPOINTS, name, patch,
            _content_type="application/merge-patch+json")


def annotate_own_pod(namespace: str, pod: str, key: str, value: str, api: Any = None) -> bool:
    """One best-effort annotation on this pod (restore's record of what it placed)."""
    try:
        if api is None:
            api = kubeclient.core_api()
        api.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": {key: value}}},
                                 _request_timeout=5)
    except Exception as err:
        log.warning("could not annotate pod %s/%s with %s: %s", namespace, pod, key, err)
        return False
    return True
