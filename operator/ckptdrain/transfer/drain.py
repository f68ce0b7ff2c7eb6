"""The drain (upload) engine: a writer's checkpoint files to the store, then its manifest.

Memory is bounded whatever the checkpoint size: `concurrency` workers each own
one part buffer, read into it with `preadv` (no whole-file reads, no copies),
checksum it, draw its bytes from the one shared rate limiter and upload it.
A buffer is at most the configured part size, whatever the files' sizes:
drain memory is at most concurrency x part_size (plus the store client's
small I/O blocks). A file so big that its parts must grow past the part
size (S3 takes 10,000 parts at most) has each part checksummed through the
buffer in a first pass, then sent streamed from the file
(Store.upload_part_from); the store verifies that CRC32C, so a file that
changed between the two passes is refused, never stored.
Parts of all files share the workers, so small and large files alike keep
`concurrency` requests in flight. Every finished part is journaled before it
counts, so a killed drain resumes without re-sending it (transfer/resume.py
reconciles the journal with the store); an object finished but not yet
journaled when the drain was killed is recognised by its size and CRC32C
(transfer/commit.py) and not sent again.

Commit order: a step/writer already committed with the same content is left
alone (nothing sent); with different content the drain refuses
(CommitConflict) unless asked to replace it. Data goes under a fresh attempt
prefix (keys.py), never over a committed attempt's. The manifest (the commit
record, naming the attempt) is written only after every data object is
complete and verified: its size by `head`, its bytes by the CRC32C of its
parts, combined, against the manifest. A cancel is looked at again right
before each try of that write: a drain cancelled meanwhile (a restore round
abandoning its step) commits nothing. The last manifest written wins whole.

`Drainer` holds the settings and the commit check; each call's workers,
parts and manifest write are a run of transfer/drain_run.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ckptdrain import keys
from ckptdrain.manifest import MAX_PART_BYTES, MAX_PARTS, WriterManifest
from ckptdrain.ratelimit import TokenBucket
from ckptdrain.store.base import Store
from ckptdrain.transfer import commit as cm
from ckptdrain.transfer.commit import abort_superseded as abort_superseded  # re-exported
from ckptdrain.transfer.drain_run import DrainRun

#: Leftovers of killed drains (unowned uploads, temp files) older than this are
#: removed when a drain starts; younger ones may be a live concurrent writer's.
STALE_AFTER = 3600.0
_MiB = 1 << 20


@dataclass(frozen=True)
class DrainResult:
    step: int
    writer: int
    files: int
    bytes: int  # every byte of the writer's checkpoint
    sent_bytes: int  # sent by this call
    resumed_bytes: int  # already durable from an earlier run, not re-sent
    parts_sent: int
    seconds: float
    manifest_key: str
    #: The attempt the committed manifest names (the existing one if already committed).
    attempt: str | None = None
    #: The store already held this content, committed: nothing was sent.
    already_committed: bool = False


def supersede_decision(
    in_flight_done_bytes: int, in_flight_total: int, newer_ready: bool, threshold: float = 0.8
) -> Literal["finish", "supersede"]:
    """Newest first: finish the drain in flight only if it is near done
    (at least `threshold` of its bytes durable) or nothing newer is waiting."""
    if not newer_ready or in_flight_total <= 0:
        return "finish"
    return "finish" if in_flight_done_bytes / in_flight_total >= threshold else "supersede"


class Drainer:
    """Uploads checkpoints to one store through one shared rate limiter."""

    def __init__(
        self,
        store: Store,
        *,
        limiter: TokenBucket | None = None,
        part_size: int = 64 << 20,
        concurrency: int = 8,
        attempts: int = 6,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        stale_after: float = STALE_AFTER,
    ) -> None:
        if concurrency < 1 or part_size < 1 or attempts < 1:
            raise ValueError("concurrency, part_size and attempts must be >= 1")
        self.store = store
        self.limiter = limiter if limiter is not None else TokenBucket(None)
        # Within what every store takes: its smallest part, S3's largest.
        self.part_size = min(max(part_size, store.min_part_size), MAX_PART_BYTES)
        self.stale_after = stale_after
        self.concurrency = concurrency
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff

    def part_size_for(self, size: int) -> int:
        """Part size for a file of `size` bytes: ours, grown to stay within MAX_PARTS."""
        need = -(-size // MAX_PARTS)
        if need <= self.part_size:
            return self.part_size
        return min(-(-need // _MiB) * _MiB, MAX_PART_BYTES)

    def drain(
        self,
        source_dir: Path,
        manifest: WriterManifest,
        *,
        journal_path: Path,
        cancel: threading.Event | None = None,
        progress: Callable[[int], None] | None = None,
        replace: bool = False,
        before_commit: Callable[[], None] | None = None,
    ) -> DrainResult:
        """Upload every file of `manifest` from `source_dir`, verify, then commit
        the manifest. Resumes from `journal_path`. Raises DrainCancelled on
        `cancel`, IntegrityError if a file changed since it was scanned,
        CommitConflict if the step/writer is committed with other content
        (unless `replace`). `progress` is called with the bytes of this
        checkpoint durable so far (cumulative, resumed ones included), from
        worker threads. `before_commit` runs after the data is verified and
        before the manifest is written; what it raises stops the commit (the
        agent's writer fence)."""
        started = time.monotonic()
        cancel = cancel or threading.Event()
        mkey = keys.manifest_key(manifest.step, manifest.writer)
        existing = cm.committed(self.store, manifest, replace)
        if existing is not None:
            return DrainResult(
                step=manifest.step, writer=manifest.writer, files=len(manifest.files),
                bytes=manifest.total_bytes, sent_bytes=0, resumed_bytes=manifest.total_bytes,
                parts_sent=0, seconds=time.monotonic() - started, manifest_key=mkey,
                attempt=existing.attempt, already_committed=True)
        run = DrainRun(self, Path(source_dir), manifest, Path(journal_path), cancel, progress)
        run.prepare()
        run.upload_all()
        if before_commit is not None:
            before_commit()
        run.commit(mkey)
        return DrainResult(
            step=manifest.step, writer=manifest.writer, files=len(manifest.files),
            bytes=manifest.total_bytes, sent_bytes=run.sent_bytes,
            resumed_bytes=run.resumed_bytes, parts_sent=run.parts_sent,
            seconds=time.monotonic() - started, manifest_key=mkey,
            attempt=run.manifest.attempt,
        )
