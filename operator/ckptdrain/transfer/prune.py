"""Global retention for one writer: delete its own objects of expired steps,
and the data of its attempts that no current manifest names.

Each writer deletes only what it wrote, so no process needs rights over
another's keys. The manifest goes first: once it is gone the step is no
longer complete (catalog.load_checkpoint needs every writer's manifest), so
a restore can never pick a step whose data is half deleted.

Orphaned data (attempts superseded by a later manifest, killed before their
manifest, or that lost a race) is removed only when it is older than a grace
period and, if a manifest replaced it, only when that manifest is too: a
restore that began reading an attempt just before it was replaced is not cut
off, and a drain still uploading is not robbed. A drain never deletes data.

Orphans are judged per attempt, never per object: an attempt's data goes
only when every one of its objects is older than the grace period and it has
no unfinished upload active within it. A drain killed before its manifest and
resumed much later has old objects beside new ones; deleting the old ones
alone would leave it a manifest naming missing data. An unfinished upload is
active as of its newest part where the store says when that was, else as of
when it was initiated.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field

from ckptdrain import keys, retention
from ckptdrain.errors import IntegrityError, ObjectMissing
from ckptdrain.store.base import MultipartUpload, ObjectInfo, Store
from ckptdrain.transfer import catalog, commit

log = logging.getLogger(__name__)

#: How long orphaned attempt data and unfinished uploads are left alone.
ORPHAN_GRACE = 6 * 3600.0


def current_keys(store: Store, step: int, writer: int) -> set[str] | None:
    """Data keys the current manifest of (step, writer) names; empty if there
    is none; None if it is unreadable (then nothing of the step is touched)."""
    try:
        m = catalog.read_manifest(store, keys.manifest_key(step, writer))
    except ObjectMissing:
        return set()
    except IntegrityError:
        return None
    return {keys.data_key(step, writer, f.path, m.attempt) for f in m.files}


_ATTEMPT_PREFIX = re.compile(
    r"data/(?:[0-9a-f]{2}/)?[0-9]{20}/[0-9]{5}/s?[0-9a-f]{16}/")


def _old(modified: float | None, now: float, grace: float) -> bool:
    return modified is not None and now - modified > grace


def _attempt_of(key: str) -> str:
    """The attempt prefix a data key belongs to; a format-1 key (no attempt
    level) is its own group."""
    match = _ATTEMPT_PREFIX.match(key)
    return match[0] if match else key


def _last_active(store: Store, upload: MultipartUpload, now: float,
                 grace: float) -> float | None:
    """When `upload` was last seen active: its newest part's time where the
    store reports one, else when it was initiated."""
    if not _old(upload.initiated, now, grace):
        return upload.initiated  # recent (or unknown) already: no need to ask
    # A huge file sent at a low rate can take longer than the grace period;
    # its upload is alive as long as parts keep arriving.
    parts = store.list_parts(upload.key, upload.upload_id) or []
    newest = max((p.modified for p in parts if p.modified is not None), default=None)
    if newest is not None and (upload.initiated is None or newest > upload.initiated):
        return float(newest)
    return upload.initiated


@dataclass(frozen=True)
class Leftovers:
    """What drains and pushes left that no current manifest names."""

    #: Data of attempts no manifest names, every object older than the grace
    #: period and no upload active within it: safe to delete.
    objects: list[ObjectInfo] = field(default_factory=list)
    #: Unfinished uploads inactive for longer than the grace period.
    uploads: list[MultipartUpload] = field(default_factory=list)
    #: Data no manifest names that is not yet old enough: a push may still be
    #: writing it, or a restore reading an attempt that was lately replaced.
    waiting: list[ObjectInfo] = field(default_factory=list)
    #: Unfinished uploads active within the grace period.
    waiting_uploads: list[MultipartUpload] = field(default_factory=list)


def find_leftovers(store: Store, writer: int | None, *, grace: float = ORPHAN_GRACE,
                   now: float | None = None, skip_steps: frozenset[int] = frozenset(),
                   manifests: list[ObjectInfo] | None = None,
                   data: list[ObjectInfo] | None = None) -> Leftovers:
    """`writer`'s leftovers (None: every writer's), steps in `skip_steps` left
    out. `manifests` and `data` are the listings of keys.MANIFESTS and
    keys.DATA when the caller has them already (each listing costs requests).
    Never a key a current manifest names: a complete step is never touched."""
    now = time.time() if now is None else now

    def ours(parsed: tuple[int, int] | None) -> bool:
        return parsed is not None and (writer is None or parsed[1] == writer) \
            and parsed[0] not in skip_steps

    committed_at: dict[tuple[int, int], float | None] = {}
    for info in store.list(keys.MANIFESTS) if manifests is None else manifests:
        parsed = keys.parse_manifest_key(info.key)
        if parsed is not None and ours(parsed):
            committed_at[parsed] = info.modified
    by_writer: dict[tuple[int, int], list[ObjectInfo]] = {}
    for info in store.list(keys.DATA) if data is None else data:
        parsed = keys.parse_data_key(info.key)
        if parsed is not None and ours(parsed):
            by_writer.setdefault(parsed, []).append(info)
    uploads: list[tuple[MultipartUpload, float | None]] = []
    for upload in commit.list_uploads(store, keys.DATA):
        if ours(keys.parse_data_key(upload.key)):
            uploads.append((upload, _last_active(store, upload, now, grace)))
    busy = {_attempt_of(u.key) for u, active in uploads if not _old(active, now, grace)}
    found = Leftovers(uploads=[u for u, active in uploads if _old(active, now, grace)],
                      waiting_uploads=[u for u, active in uploads if not _old(active, now, grace)])
    for (step, w), infos in by_writer.items():
        current = current_keys(store, step, w)
        if current is None:
            continue  # an unreadable manifest: nothing of the step is touched
        # Replaced only lately: a restore may still read the old attempt.
        lately = (step, w) in committed_at and not _old(committed_at[(step, w)], now, grace)
        attempts: dict[str, list[ObjectInfo]] = {}
        for info in infos:
            attempts.setdefault(_attempt_of(info.key), []).append(info)
        asked = False
        for attempt, objects in attempts.items():
            if any(i.key in current for i in objects):
                continue
            if not (lately or attempt in busy or not all(_old(i.modified, now, grace)
                                                         for i in objects)) and not asked:
                asked = True
                lately = _replaced_since_listed(store, step, w, (step, w) in committed_at,
                                                now, grace)
            if lately or attempt in busy or not all(_old(i.modified, now, grace)
                                                    for i in objects):
                found.waiting.extend(objects)
            else:
                found.objects.extend(objects)
    return found


def _replaced_since_listed(store: Store, step: int, writer: int, listed: bool,
                           now: float, grace: float) -> bool:
    """Whether (step, writer)'s manifest is lately written as it stands now. The
    listing came first and `current` was read after it: a push --replace in
    between made `current` the new attempt's keys while the listing still
    dated the old manifest, and the attempt replaced a moment ago would look
    long abandoned. One listing of that one key (every store's listing dates
    objects; not every HEAD does), asked only when something of the step is
    about to go; a manifest gone or come since the listing counts as lately
    changed."""
    key = keys.manifest_key(step, writer)
    info = next((i for i in store.list(key) if i.key == key), None)
    if info is None:
        return listed
    return not listed or not _old(info.modified, now, grace)


def remove(store: Store, found: Leftovers) -> int:
    """Delete `found`'s objects and abort its stale uploads (never its
    waiting ones); how many things went."""
    for info in found.objects:
        store.delete(info.key)
    for upload in found.uploads:
        store.abort_multipart(upload.key, upload.upload_id)
    return len(found.objects) + len(found.uploads)


def prune_writer(store: Store, writer: int, keep: int, *, grace: float = ORPHAN_GRACE,
                 now: float | None = None) -> list[int]:
    """Delete `writer`'s manifest and data of every expired step, its orphaned
    attempt data and stale unfinished uploads; return the expired steps pruned.

    Steps are found from manifests and also from this writer's data keys: a
    drain superseded before its manifest was written leaves data that no
    manifest names, and it must not stay in the bucket forever."""
    now = time.time() if now is None else now
    present = set(catalog.candidate_steps(store))
    manifests = list(store.list(keys.MANIFESTS))
    data = list(store.list(keys.DATA))
    for info in data:
        parsed = keys.parse_data_key(info.key)
        if parsed is not None and parsed[1] == writer:
            present.add(parsed[0])
    complete = [c.step for c in catalog.complete_steps(store)]
    pruned = []
    for step in retention.global_expired(complete, present, keep):
        store.delete(keys.manifest_key(step, writer))  # first: the step stops being complete
        for prefix in keys.writer_data_prefixes(step, writer):
            for info in list(store.list(prefix)):
                store.delete(info.key)
        pruned.append(step)
    if pruned:
        log.info("global retention (keep %d): deleted writer %d's steps %s", keep, writer, pruned)
    found = find_leftovers(store, writer, grace=grace, now=now, skip_steps=frozenset(pruned),
                           manifests=manifests, data=data)
    orphans = remove(store, found)
    sweep = getattr(store, "sweep", None)
    if callable(sweep):  # the file store's temp files of every step
        orphans += int(sweep(grace, now))
    if orphans:
        log.info("global retention: removed %d orphaned object(s)/upload(s) of writer %d",
                 orphans, writer)
    return pruned
