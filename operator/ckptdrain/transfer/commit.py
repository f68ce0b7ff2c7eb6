"""The commit protocol's checks around a drain: before it starts, and on resume.

- `committed`: what the store already holds for (step, writer). The same
  content is already committed (nothing to send); different content is a
  CommitConflict unless the caller asked to replace it. A new attempt never
  touches the data of the committed one (keys.py), so a replacement killed
  half-way leaves the committed checkpoint intact.
- `housekeeping`: at drain start, remove what earlier runs of this drain's
  own attempt left behind and its journal does not own: multipart uploads
  (older than a grace period) and, on stores that have it, stale temp state
  (`sweep`). Other attempts' leftovers are never touched here, however old:
  one may be a concurrent push's live upload of a big file; retention
  (transfer/prune.py) removes them after its own, longer grace period.
- `object_intact`: on resume, whether an object the journal did not see
  finish (killed after CompleteMultipartUpload or a single PUT, before the
  journal was saved) is there, whole and right, so it is not sent again.
"""

from __future__ import annotations

import logging
import time

from ckptdrain import checksum, keys
from ckptdrain.errors import CommitConflict, IntegrityError, ObjectMissing, StoreAccessDenied
from ckptdrain.manifest import FileEntry, WriterManifest
from ckptdrain.store.base import MultipartUpload, Store
from ckptdrain.transfer import catalog
from ckptdrain.transfer.journal import PartRecord, UploadJournal

log = logging.getLogger(__name__)

_READ_BACK = 8 << 20


def committed(store: Store, manifest: WriterManifest, replace: bool) -> WriterManifest | None:
    """The committed manifest of `manifest`'s step and writer if it holds the
    same content (nothing to send), else None (go ahead and upload).

    Raises CommitConflict when a different (or unreadable) manifest is
    committed and `replace` is false."""
    key = keys.manifest_key(manifest.step, manifest.writer)
    try:
        existing = catalog.read_manifest(store, key)
    except ObjectMissing:
        return None
    except IntegrityError as err:
        if replace:
            return None
        raise CommitConflict(
            f"step {manifest.step} writer {manifest.writer} already has a manifest in "
            f"{store.uri}, and it is unreadable ({str(err)[:120]}); --replace replaces it"
        ) from None
    if existing.same_content(manifest):
        return existing
    if replace:
        return None
    raise CommitConflict(
        f"step {manifest.step} writer {manifest.writer} is already committed in {store.uri} "
        f"with different content ({len(existing.files)} files, {existing.total_bytes} bytes); "
        "--replace replaces it")


def housekeeping(store: Store, step: int, writer: int, attempt: str,
                 owned: set[tuple[str, str]], older_than: float,
                 now: float | None = None) -> int:
    """Abort unowned uploads under `attempt`'s own data prefix older than
    `older_than` seconds, and sweep its temp state; how many went."""
    now = time.time() if now is None else now
    removed = 0
    prefix = keys.data_prefix(step, writer, attempt)
    sweep = getattr(store, "sweep", None)
    if callable(sweep):  # this attempt's temp files, not the whole store's
        removed += int(sweep(older_than, now, (prefix,)))
    for upload in list_uploads(store, prefix):
        if (upload.key, upload.upload_id) in owned:
            continue
        if upload.initiated is not None and now - upload.initiated <= older_than:
            continue  # maybe still being sent by a run of this drain
        store.abort_multipart(upload.key, upload.upload_id)
        removed += 1
    if removed:
        log.info("step %d writer %d attempt %s: removed %d leftover upload(s)/temp file(s)",
                 step, writer, attempt, removed)
    return removed


def abort_superseded(store: Store, journal: UploadJournal) -> int:
    """Abort the open multipart uploads of a superseded drain; return how many.

    Completed objects are left alone: cleaning them up is retention's job,
    never the drain's (they may belong to a step still being restored)."""
    aborted = 0
    for key, upload_id in journal.open_uploads():
        store.abort_multipart(key, upload_id)
        aborted += 1
    for state in journal.files.values():
        if state.upload_id is not None and not state.complete:
            state.upload_id, state.parts = None, {}
    return aborted


def list_uploads(store: Store, prefix: str) -> list[MultipartUpload]:
    """Unfinished uploads under `prefix`; none when the credentials may not
    list them (s3:ListBucketMultipartUploads): housekeeping is then skipped,
    never the drain."""
    try:
        return store.list_multipart_uploads(prefix)
    except StoreAccessDenied as err:
        log.warning("cannot list unfinished uploads under %s (%s): not cleaning them up",
                    prefix, err)
        return []


def composite_crc32c(parts: list[PartRecord]) -> str:
    """S3's checksum of a multipart object: CRC32C of its parts' CRC32Cs, "-N"."""
    joined = b"".join(p.crc32c.to_bytes(4, "big") for p in sorted(parts, key=lambda p: p.number))
    return f"{checksum.to_hex(checksum.crc32c(joined))}-{len(parts)}"


def object_intact(store: Store, key: str, entry: FileEntry, parts: list[PartRecord]) -> bool:
    """True when `key` holds exactly `entry`: its size, then its CRC32C, from
    the store's own checksum when it keeps one (the whole object's, or the
    composite one of `parts`), else by reading it back (a GET, never a re-send)."""
    info = store.head(key)
    if info is None or info.size != entry.size:
        return False
    stored_crc = getattr(store, "object_crc32c", None)
    held = stored_crc(key) if callable(stored_crc) else None
    if held is not None and "-" not in held:
        return held == entry.crc32c
    if held is not None and parts:
        # Our parts' CRC32Cs were checked against the manifest before completion.
        return held == composite_crc32c(parts)
    crc, offset = 0, 0
    while offset < entry.size:
        data = store.get_range(key, offset, min(_READ_BACK, entry.size - offset))
        if not data:
            return False
        crc = checksum.crc32c(data, crc)
        offset += len(data)
    return offset == entry.size and checksum.to_hex(crc) == entry.crc32c


def finished_unjournaled(store: Store, journal: UploadJournal, entry: FileEntry) -> bool:
    """Whether a kill landed after `entry`'s object was made (single PUT or
    CompleteMultipartUpload) but before the journal said so. If so the object
    is journaled complete (not re-sent) and True is returned."""
    state = journal.files[entry.path]
    parts = list(state.parts.values())
    if entry.size > state.part_size and not parts:
        return False  # multipart with no part durable: it cannot have been completed
    if not object_intact(store, state.key, entry, parts):
        return False
    if state.upload_id is not None:
        store.abort_multipart(state.key, state.upload_id)  # gone already, normally
    journal.file_complete(entry.path)
    return True
