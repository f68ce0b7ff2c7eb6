"""Global retention for one writer: delete its own objects of expired steps.

Each writer deletes only what it wrote, so no process needs rights over
another's keys. The manifest goes first: once it is gone the step is no
longer complete (catalog.load_checkpoint needs every writer's manifest), so
a restore can never pick a step whose data is half deleted.
"""

from __future__ import annotations

import logging

from ckptdrain import keys, retention
from ckptdrain.store.base import Store
from ckptdrain.transfer import catalog

log = logging.getLogger(__name__)


def prune_writer(store: Store, writer: int, keep: int) -> list[int]:
    """Delete `writer`'s manifest and data of every expired step; the steps pruned.

    Steps are found from manifests and also from this writer's data keys: a
    drain superseded before its manifest was written leaves data that no
    manifest names, and it must not stay in the bucket forever."""
    present = set(catalog.candidate_steps(store))
    for info in store.list(keys.DATA):
        parsed = keys.parse_data_key(info.key)
        if parsed is not None and parsed[1] == writer:
            present.add(parsed[0])
    complete = [c.step for c in catalog.complete_steps(store)]
    pruned = []
    for step in retention.global_expired(complete, present, keep):
        store.delete(keys.manifest_key(step, writer))  # first: the step stops being complete
        for info in list(store.list(keys.data_prefix(step, writer))):
            store.delete(info.key)
        pruned.append(step)
    if pruned:
        log.info("global retention (keep %d): deleted writer %d's steps %s", keep, writer, pruned)
    return pruned
