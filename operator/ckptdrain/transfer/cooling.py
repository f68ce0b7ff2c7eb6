"""Cold storage for one writer: the data of its complete global checkpoints
older than the newest `hot` moves to a colder storage class (S3's
STANDARD_IA or GLACIER_IR, GCS's NEARLINE or COLDLINE, ...), as SSD and HDD
tiers are used for recent and old checkpoints.

Only what the current manifest of the writer's own step names is moved, in
place (store/s3_storage_class.py, gcs_storage_class.py), so keys, manifests
and what a restore reads stay the same: restore reads a cold object like
any other, which is why only classes that serve reads directly are allowed
(policy validation).
Manifests stay in the bucket's class; they are small and read by every
restore's catalog scan. Nothing is deleted here: retention (prune.py) still
decides what goes, and never the newest complete checkpoint.

An object that cannot be moved (the store refuses the class, or refuses to
copy an object onto itself) stops the pass with that error; the step is
left as it was and the next global checkpoint tries again.

A pass runs on the drain's thread after retention, so it is bounded: at
most `budget` objects and `budget_bytes` bytes, and it ends as soon as
`stopping()` says so: the agent stops, or a step waits to be drained (a
SIGTERM flush submits its step first, then stops the worker). The store
asks `stopping()` within an object too, between the server-side calls of a
large one (S3's part copies, GCS's rewrite calls), and gives the object up
unchanged.
What is left is moved by the passes after the next global checkpoints: a
policy that turns cold storage on for a running job catches up over a few
of them, never holding up the drain of a new step for long.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ckptdrain import keys, retention
from ckptdrain.errors import InvalidInput
from ckptdrain.store.base import Store
from ckptdrain.transfer import catalog
from ckptdrain.transfer.prune import current_keys

log = logging.getLogger(__name__)


#: What one pass may move (server-side copies: no byte crosses the client).
BUDGET_OBJECTS = 32
BUDGET_BYTES = 64 << 30


@dataclass(frozen=True)
class Cooled:
    """What one pass did: the steps it looked at and the objects it moved;
    `finished` False when it stopped at its budget or for a stop."""
    steps: tuple[int, ...] = ()
    objects: int = 0
    bytes: int = 0
    finished: bool = True


def cool_writer(store: Store, writer: int, hot: int, storage_class: str, *,
                budget: int = BUDGET_OBJECTS, budget_bytes: int = BUDGET_BYTES,
                stopping: Callable[[], bool] = lambda: False) -> Cooled:
    """Move `writer`'s data of every complete step but the newest `hot` to
    `storage_class`, oldest first, within the budget; objects already there
    are left alone."""
    change = getattr(store, "change_storage_class", None)
    if change is None:
        raise InvalidInput("storage.coldStorage", "an s3:// or gs:// store (a file:// store "
                           "has no storage classes)", store.uri)
    complete = [c.step for c in catalog.complete_steps(store)]
    keep_hot = set(retention.newest_complete(complete, hot))
    steps = sorted(s for s in set(complete) if s not in keep_hot)
    objects = moved = 0
    for step in steps:
        if stopping():
            _said(objects, moved, writer, storage_class, finished=False)
            return Cooled(tuple(steps), objects, moved, finished=False)
        current = current_keys(store, step, writer)
        if not current:
            continue  # unreadable manifest: touch nothing of the step
        for prefix in keys.writer_data_prefixes(step, writer):
            for info in list(store.list(prefix)):
                if info.key not in current or info.storage_class == storage_class:
                    continue
                if stopping() or objects >= budget or moved >= budget_bytes:
                    _said(objects, moved, writer, storage_class, finished=False)
                    return Cooled(tuple(steps), objects, moved, finished=False)
                if not change(info.key, info.size, storage_class, stopping=stopping):
                    _said(objects, moved, writer, storage_class, finished=False)
                    return Cooled(tuple(steps), objects, moved, finished=False)
                objects += 1
                moved += info.size
    _said(objects, moved, writer, storage_class, finished=True)
    return Cooled(tuple(steps), objects, moved)


def _said(objects: int, moved: int, writer: int, storage_class: str, finished: bool) -> None:
    if objects:
        log.info("cold storage: moved %d object(s), %d bytes, of writer %d to %s%s",
                 objects, moved, writer, storage_class,
                 "" if finished else "; the rest after the next global checkpoint")
