"""Cold storage for one writer: the data of its complete global checkpoints
older than the newest `hot` moves to a colder storage class (S3's
STANDARD_IA or GLACIER_IR, ...), as SSD and HDD tiers are used for recent
and old checkpoints.

Only what the current manifest of the writer's own step names is moved, in
place (store/s3_storage_class.py), so keys, manifests and what a restore
reads stay the same: restore reads a cold object like any other, which is
why only classes that serve reads directly are allowed (policy validation).
Manifests stay in the bucket's class; they are small and read by every
restore's catalog scan. Nothing is deleted here: retention (prune.py) still
decides what goes, and never the newest complete checkpoint.

An object that cannot be moved (the store refuses the class, or refuses to
copy an object onto itself) stops the pass with that error; the step is
left as it was and the next global checkpoint tries again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ckptdrain import keys, retention
from ckptdrain.errors import InvalidInput
from ckptdrain.store.base import Store
from ckptdrain.transfer import catalog
from ckptdrain.transfer.prune import current_keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cooled:
    """What one pass did: the steps it looked at and the objects it moved."""
    steps: tuple[int, ...] = ()
    objects: int = 0
    bytes: int = 0


def cool_writer(store: Store, writer: int, hot: int, storage_class: str) -> Cooled:
    """Move `writer`'s data of every complete step but the newest `hot` to
    `storage_class`; objects already there are left alone."""
    change = getattr(store, "change_storage_class", None)
    if change is None:
        raise InvalidInput("storage.coldStorage", "an s3:// store (storage classes are S3's)",
                           store.uri)
    complete = [c.step for c in catalog.complete_steps(store)]
    keep_hot = set(retention.newest_complete(complete, hot))
    steps = sorted(s for s in set(complete) if s not in keep_hot)
    objects = moved = 0
    for step in steps:
        current = current_keys(store, step, writer)
        if not current:
            continue  # unreadable manifest: touch nothing of the step
        for prefix in keys.writer_data_prefixes(step, writer):
            for info in list(store.list(prefix)):
                if info.key in current and info.storage_class != storage_class:
                    change(info.key, info.size, storage_class)
                    objects += 1
                    moved += info.size
    if objects:
        log.info("cold storage: moved %d object(s), %d bytes, of writer %d's steps %s to %s",
                 objects, moved, writer, steps, storage_class)
    return Cooled(tuple(steps), objects, moved)
