"""Where a drain starts: its journal, reconciled with the store, and the parts left to send.

- `open_journal`: the journal of this checkpoint (same store, step, writer
  and files) is resumed; one of a different checkpoint is superseded (its
  uploads aborted) and a fresh one, with a fresh attempt, takes its place.
- `reconcile`: after `commit.housekeeping`, every file the journal counts as
  complete is checked by `head`; one it did not see finish but the store
  lists at its size is checked by CRC32C (`commit.finished_unjournaled`);
  uploads the store has lost start over. What is left becomes tasks: a whole
  file, a part, or only a lost completion.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ckptdrain import checksum, keys
from ckptdrain.manifest import FileEntry, WriterManifest
from ckptdrain.store.base import Store
from ckptdrain.transfer import commit as cm
from ckptdrain.transfer import journal as jr
from ckptdrain.transfer.commit import abort_superseded


@dataclass(frozen=True)
class Task:
    entry: FileEntry
    number: int  # 0: a single put of the whole file; -1: only the completion; else the part
    offset: int
    length: int


@dataclass
class Plan:
    """What reconcile found: the work left, and the bytes already durable."""

    tasks: list[Task] = field(default_factory=list)
    pending: dict[str, int] = field(default_factory=dict)  # file -> tasks before it completes
    resumed_bytes: int = 0


def open_journal(store: Store, journal_path: Path, manifest: WriterManifest,
                 part_size_for: Callable[[int], int], part_size: int,
                 ) -> tuple[jr.UploadJournal, WriterManifest, bool]:
    """The journal to drain `manifest` with, the manifest as it will be
    committed (part sizes and attempt set), and whether the journal resumes
    an earlier run."""
    # Every file records the part size it is sent with (the manifest's
    # readers need no rule to reproduce it).
    files = tuple(dataclasses.replace(f, part_size=part_size_for(f.size))
                  for f in manifest.files)
    manifest = dataclasses.replace(manifest, files=files, part_size=part_size, attempt=None)
    # Identity of what is being sent: the files (and part sizes), not the
    # creation time, so a re-run of the same checkpoint resumes.
    same_files = dataclasses.replace(manifest, created=0.0, extra={})
    manifest_id = checksum.to_hex(checksum.crc32c(same_files.to_json()))
    old = jr.load(journal_path)
    args = (store.uri, manifest.step, manifest.writer, manifest_id)
    if old is not None and not old.matches(*args):
        # A different checkpoint was draining from here: it is superseded.
        if old.store_uri == store.uri:
            abort_superseded(store, old)
        old = None
    journal = old or jr.UploadJournal(*args)
    return journal, dataclasses.replace(manifest, attempt=journal.attempt), old is not None


def reconcile(store: Store, journal: jr.UploadJournal, manifest: WriterManifest,
              part_size_for: Callable[[int], int], stale_after: float, resuming: bool) -> Plan:
    """Clear stale leftovers, reconcile `journal` with the store (updating
    it; the caller saves it), and list what is left to send."""
    m, plan = manifest, Plan()
    cm.housekeeping(store, m.step, m.writer, journal.attempt, set(journal.open_uploads()),
                    stale_after)
    # On resume, objects of this attempt already in the store (one listing):
    # any of them the journal did not see finish is checked, not re-sent.
    listed = ({i.key: i.size for i in store.list(keys.data_prefix(
        m.step, m.writer, m.attempt))} if resuming else {})
    for entry in m.files:
        psize = part_size_for(entry.size)
        key = keys.data_key(m.step, m.writer, entry.path, m.attempt)
        state = journal.file(entry.path, key, entry.size, psize)
        if state.complete:
            info = store.head(state.key)
            if info is not None and info.size == entry.size:
                plan.resumed_bytes += entry.size
                continue
            journal.file_incomplete(entry.path)
        elif listed.get(state.key) == entry.size and cm.finished_unjournaled(
                store, journal, entry):
            plan.resumed_bytes += entry.size
            continue
        if entry.size <= psize:
            plan.tasks.append(Task(entry, 0, 0, entry.size))
            plan.pending[entry.path] = 1
            continue
        if state.upload_id is not None:
            held = store.list_parts(state.key, state.upload_id)
            if held is None:
                journal.upload_lost(entry.path)  # expired or aborted: start over
            else:
                journal.keep_parts(entry.path, {p.number: p.etag for p in held})
        todo = 0
        for number, offset in enumerate(range(0, entry.size, psize), start=1):
            if number in state.parts:
                plan.resumed_bytes += state.parts[number].size
            else:
                length = min(psize, entry.size - offset)
                plan.tasks.append(Task(entry, number, offset, length))
                todo += 1
        plan.pending[entry.path] = todo
        if todo == 0:  # every part durable, only the completion was lost
            plan.tasks.append(Task(entry, -1, 0, 0))
            plan.pending[entry.path] = 1
    return plan
