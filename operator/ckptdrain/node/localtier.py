"""The local (NVMe) tier: layout, capture, verification and retention.

    <local>/step-<N>/data/<path>          the captured files
    <local>/step-<N>/manifest.json        the writer manifest (manifest.WriterManifest),
                                          written after every data file is durable
    <local>/step-<N>/links.json           the stat identity of each file captured by hard
                                          link (node/linking.py), when there is one
    <local>/step-<N>/drain-journal.json   the drain's journal while it is unfinished
    <local>/step-<N>/GLOBAL               written once the step is complete globally
    <local>/.capture-step-<N>-<pid>/      a capture in progress (never read; removed
                                          at start-up)

A `step-<N>` directory exists only once it is complete and durable: capture
builds it under a hidden temporary name and renames it last, so a crash, a
second SIGTERM or a deadline leaves either the whole copy or none. Capture
takes each file by reflink, hard link or copy, whichever the filesystems
allow (node/linking.py); a hard-linked file shares the trainer's inode, so
`verify` first checks it was not rewritten since (links.json), then re-reads
every checksum.

Which steps retention removes is decided in retention.py (`local_expired`),
and what must go for a capture to fit the capacity in node/space.py
(`plan_room`); everything here does I/O on the tier's root.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ckptdrain import retention
from ckptdrain.errors import IntegrityError
from ckptdrain.localfs import fsync_dir
from ckptdrain.manifest import WriterManifest
from ckptdrain.node import durable, linking, space
from ckptdrain.node.steps import completed_steps, step_dir, step_name

log = logging.getLogger(__name__)

_TEMP_PREFIX = ".capture-"
MANIFEST = "manifest.json"
DATA = "data"
JOURNAL = "drain-journal.json"
LINKS = "links.json"
GLOBAL_MARKER = "GLOBAL"


@dataclass(frozen=True)
class Captured:
    manifest: WriterManifest
    seconds: float
    path: Path
    #: Files taken per method (linking.METHODS); empty when the step was already there.
    methods: dict[str, int] = field(default_factory=dict)


class LocalTier:
    """The local tier under `root`. Not thread-safe for the same step: the agent
    captures from one thread and the drain only reads published steps."""

    def __init__(self, root: Path, *, methods: linking.Methods = linking.BY_KERNEL) -> None:
        self.root = Path(root)
        self.methods = methods

    # -- layout -------------------------------------------------------------
    def step_dir(self, step: int) -> Path:
        return step_dir(self.root, step)

    def data_dir(self, step: int) -> Path:
        return self.step_dir(step) / DATA

    def journal_path(self, step: int) -> Path:
        return self.step_dir(step) / JOURNAL

    def steps(self) -> list[int]:
        """Published steps, newest first."""
        return [s for s in completed_steps(self.root) if (self.step_dir(s) / MANIFEST).is_file()]

    def has(self, step: int) -> bool:
        return (self.step_dir(step) / MANIFEST).is_file()

    # -- state --------------------------------------------------------------
    def manifest(self, step: int) -> WriterManifest:
        """The step's manifest; IntegrityError if missing or malformed."""
        try:
            data = (self.step_dir(step) / MANIFEST).read_bytes()
        except FileNotFoundError:
            raise IntegrityError(f"{self.step_dir(step)}: no {MANIFEST}") from None
        found = WriterManifest.from_json(data)
        if found.step != step:
            raise IntegrityError(f"{self.step_dir(step)}: manifest says step {found.step}")
        return found

    def is_global(self, step: int) -> bool:
        return (self.step_dir(step) / GLOBAL_MARKER).exists()

    def mark_global(self, step: int, uri: str) -> None:
        marker = self.step_dir(step) / GLOBAL_MARKER
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(json.dumps({"uri": uri, "at": time.time()}))
        os.replace(tmp, marker)
        fsync_dir(marker.parent)

    def unfinished_drains(self) -> list[int]:
        """Published, not-yet-global steps that have a drain journal, newest first."""
        return [s for s in self.steps() if not self.is_global(s) and self.journal_path(s).exists()]

    # -- capture --------------------------------------------------------------
    def capture(
        self,
        source: Path,
        step: int,
        *,
        writer: int,
        writers: int,
        should_stop: durable.StopCheck | None = None,
        extra: dict[str, str] | None = None,
    ) -> Captured:
        """Durably take the finished checkpoint at `source` in as `step`, each file
        by reflink, hard link or copy (linking.take_tree).

        Idempotent: an already published step is returned as is. Raises
        durable.CopyAborted when `should_stop` turns true (nothing published).
        """
        if self.has(step):
            return Captured(self.manifest(step), 0.0, self.step_dir(step))
        started = time.monotonic()
        # When the step was saved, as near as the agent knows: the trainer
        # had finished it when the capture began. Taking it in (links, the
        # CRC32C of every byte, fsyncs) takes seconds for a large step, and
        # goodput counts the training lost since this time.
        saved_at = time.time()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{_TEMP_PREFIX}{step_name(step)}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            taken = linking.take_tree(source, tmp / DATA, methods=self.methods,
                                      should_stop=should_stop)
            manifest = WriterManifest(
                step=step, writer=writer, writers=writers,
                files=tuple(t.entry for t in taken), created=saved_at,
                extra=dict(extra or {}),
            )
            links = linking.links_to_json(taken)
            if links is not None:
                durable.write_bytes(tmp / LINKS, links)
            durable.write_bytes(tmp / MANIFEST, manifest.to_json())
            fsync_dir(tmp)
            durable.publish(tmp, self.step_dir(step))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Captured(manifest, time.monotonic() - started, self.step_dir(step),
                        linking.count_methods(taken))

    def check_links(self, step: int) -> None:
        """IntegrityError if a file of `step` captured by hard link was rewritten
        since (a stat per file, no reads): what to call before trusting or
        sending a step when a full `verify` is too slow."""
        where = self.step_dir(step) / LINKS
        try:
            data = where.read_bytes()
        except FileNotFoundError:
            return  # nothing was linked (reflinked and copied files are immune)
        linking.check_links(self.data_dir(step), linking.links_from_json(data, where))

    def verify(self, step: int) -> WriterManifest:
        """Check the linked files' identities, then re-read every file of `step`
        against its manifest; IntegrityError if off."""
        manifest = self.manifest(step)
        self.check_links(step)
        durable.verify_tree(self.data_dir(step), manifest.files)
        return manifest

    # -- housekeeping -----------------------------------------------------------
    def remove_temps(self) -> list[Path]:
        """Remove captures a previous process left half-done."""
        removed = []
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if entry.name.startswith(_TEMP_PREFIX):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry)
        return removed

    def apply_retention(self, keep: int, protected: Iterable[int]) -> list[int]:
        steps = self.steps()
        doomed = retention.local_expired(steps, keep, [s for s in steps if self.is_global(s)],
                                         protected)
        for step in doomed:
            self.remove(step)
        return doomed

    def make_room(self, need: int, reserve: int, *, capacity: int | None,
                  protected: Iterable[int] = (), step: int | None = None) -> list[int]:
        """Remove older steps until `need` bytes plus `reserve` fit within
        `capacity` and the disk (space.plan_room): global steps first, oldest
        first; never a `protected` step (being drained) nor the newest step
        not yet global (the only copy of the recovery point). Raises
        space.WontFit, removing nothing, when even that is not enough.
        Returns the removed steps."""
        steps = self.steps()
        sizes = {s: self.bytes_of(s) for s in steps}
        is_global = {s for s in steps if self.is_global(s)}
        newest_global = max(is_global, default=-1)
        pending = [s for s in steps if s not in is_global and s > newest_global]
        kept = set(protected) | set(pending[:1])  # steps() is newest first
        evictable = sorted((s for s in steps if s not in kept),
                           key=lambda s: (s not in is_global, s))
        room = space.plan_room(need, reserve, sizes, evictable, capacity,
                               space.free_bytes(self.root))
        if room.refused is not None:
            what = f"capture of step {step} refused" if step is not None else "local tier full"
            raise space.WontFit(f"{what}: {room.refused}", self.root)
        for victim in room.evict:
            log.info("removing local step %d to make room (%s)", victim,
                     "global" if victim in is_global else "not global")
            self.remove(victim)
        return list(room.evict)

    def remove(self, step: int) -> None:
        # Rename first so a crash mid-delete never leaves a step-<N> without files.
        tmp = self.root / f"{_TEMP_PREFIX}delete-{step_name(step)}-{os.getpid()}"
        os.rename(self.step_dir(step), tmp)
        shutil.rmtree(tmp, ignore_errors=True)

    def bytes_of(self, step: int) -> int:
        try:
            return self.manifest(step).total_bytes
        except IntegrityError:
            return 0
