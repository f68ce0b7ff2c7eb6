"""Orphaned multipart uploads of one writer: aborted when its agent starts and after failures.

An unfinished upload holds its parts in the bucket, billed, listed by no
`ls`, until someone aborts it. Drains leave them when killed (a journal on
a node that is gone), when CreateMultipartUpload succeeded but its answer
was lost (a timeout: the retry creates another), or when a superseded
step's journal is deleted. Retention (transfer/prune.py) aborts them after
hours; this sweep does it at once, when the writer's agent can know which
uploads are live:

- only uploads under the writer's own data keys (keys.parse_data_key names
  this writer), never another writer's;
- never one a journal of this node still owns (`owned`: the uploads a
  resumed drain will continue), of any step;
- none at all while a predecessor pod of the same writer may still be
  flushing (its termination grace period, counted from this process's
  start): its SIGTERM flush finishes the drain it had in flight, whose
  uploads may be of any age, and its journal is on its own node. Once
  this process has outlived that window, the writer lease (one live pod
  per writer) makes every other upload of the writer an orphan.

`choose` is the pure decision; `abort_orphans` lists, decides and aborts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Iterable

from ckptdrain import keys
from ckptdrain.store.base import MultipartUpload, Store
from ckptdrain.transfer import commit

log = logging.getLogger(__name__)


def choose(uploads: Iterable[MultipartUpload], writer: int, owned: Collection[tuple[str, str]],
           now: float, grace: float) -> list[MultipartUpload]:
    """The uploads of `uploads` that are `writer`'s orphans (see the module)."""
    chosen = []
    for upload in uploads:
        parsed = keys.parse_data_key(upload.key)
        if parsed is None or parsed[1] != writer:
            continue
        if (upload.key, upload.upload_id) in owned:
            continue
        if grace > 0 and (upload.initiated is None or now - upload.initiated < grace):
            continue  # maybe a predecessor still flushing
        chosen.append(upload)
    return chosen


def sweep_grace(uptime: float, predecessor_grace: float) -> float:
    """How young an unowned upload must be to be spared: any age (infinity)
    while a predecessor may still run, then none. Not its grace in seconds:
    a flushing predecessor resumes uploads it started long before."""
    return math.inf if uptime < predecessor_grace else 0.0


def abort_orphans(store: Store, writer: int, owned: Collection[tuple[str, str]], *,
                  grace: float, now: float | None = None) -> int:
    """Abort `writer`'s orphaned uploads; return how many went."""
    now = time.time() if now is None else now
    orphans = choose(commit.list_uploads(store, keys.DATA), writer, owned, now, grace)
    for upload in orphans:
        store.abort_multipart(upload.key, upload.upload_id)
    if orphans:
        log.info("writer %d: aborted %d orphaned multipart upload(s) (first: %s)",
                 writer, len(orphans), orphans[0].key)
    return len(orphans)
