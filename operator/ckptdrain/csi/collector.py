"""The driver's scan of its root: usage measured, deleted policies' data
collected (collection.py decides), unknown owners reported. A thin edge:
it reads the disk and the apiserver, calls the pure decision, and writes.

    <root>/<namespace>/<policy uid>/
      owner.json              the owner (volumes.py)
      reclaim.json            what the policy's class said of reclaim when last
                              read (class_reclaim.py): written atomically
                              while the policy is there, used once it is gone
      deleted-since.json      {"since": <Unix seconds>, "last": <Unix seconds>}:
                              the first and latest sightings of the owner
                              deleted (collection.DeletedClock); written
                              atomically, removed when the owner is seen
                              again, kept over restarts
    <root>/.trash/            where a directory is renamed before it is removed

Deleting is done so that nothing outside the directory can be hit: the
policy directory (never a link: checked with lstat) is renamed into
`.trash` (a real directory, never a link) on the same filesystem, under the
volume lock, after the publish records and the mount table show nothing of
it in use; then it is removed by removal.py, which follows no link (the
tenant may have made links in its data) and enters no other filesystem. A
crash between the two leaves it in `.trash`, which every scan empties.

A directory without a valid owner marker (none, unreadable, or naming
another place) is an unknown owner: logged once, counted, never deleted,
and never handed out (publish refuses it).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptdrain.csi import class_reclaim, collection
from ckptdrain.csi.class_reclaim import RECLAIM_FILE, ClassLister
from ckptdrain.csi.collection import (
    DeletedClock,
    Reclaim,
    Recorded,
    Sighting,
    Unreadable,
    Verdict,
)
from ckptdrain.csi.dir_records import DELETED_SINCE_FILE, read_clock, read_recorded
from ckptdrain.csi.removal import remove_from
from ckptdrain.csi.requests import Refused
from ckptdrain.csi.usage import Capacity, Usage, capacity, measure
from ckptdrain.csi.volumes import (
    DATA_DIR,
    PolicyFound,
    PolicyResolver,
    VolumeStore,
    read_owner,
    uid_of,
    write_file,
)
from ckptdrain.errors import InvalidInput

log = logging.getLogger(__name__)

TRASH_DIR = ".trash"


@dataclass(frozen=True)
class PolicyData:
    namespace: str
    policy_name: str
    policy_uid: str
    verdict: Verdict
    usage: Usage | None  # None when it could not be measured
    # Pending or retained: when its owner was first seen deleted (the clock's
    # `since`, kept on disk over restarts); None for live data.
    deleted_since: float | None = None
    # The grace that applies to it (its class's or the driver's): its
    # deletion is due that long after deleted_since.
    grace_s: float | None = None


@dataclass
class ScanReport:
    """What one scan found (the metrics show the latest)."""

    at: float  # when the scan ended (Unix seconds)
    policies: list[PolicyData] = field(default_factory=list)
    unknown_owners: int = 0
    # Directories held this scan because their reclaim record could not be
    # read or names a class whose reclaim was never read.
    held_records: int = 0
    # Whether this scan's CheckpointClass LIST failed.
    class_list_failed: bool = False
    capacity: Capacity | None = None

    def _pending(self) -> list[PolicyData]:
        return [p for p in self.policies
                if p.verdict is Verdict.PENDING and p.deleted_since is not None]

    def oldest_pending_since(self) -> float | None:
        """When the owner of the longest-pending directory was first seen
        deleted; None when nothing is pending."""
        return min((p.deleted_since for p in self._pending() if p.deleted_since is not None),
                   default=None)

    def earliest_pending_due(self) -> float | None:
        """The earliest time a pending directory's deletion is due (first
        seen deleted, plus its own grace); None when nothing is pending."""
        return min((p.deleted_since + p.grace_s for p in self._pending()
                    if p.deleted_since is not None and p.grace_s is not None), default=None)


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


class Collector:
    """Scans `volumes.root` every `interval_s` in a thread of its own."""

    def __init__(self, volumes: VolumeStore, resolve_policy: PolicyResolver, reclaim: Reclaim,
                 interval_s: float, mounted_under: Callable[[Path], bool],
                 clock: Callable[[], float] = time.time,
                 list_classes: ClassLister | None = None,
                 after_scan: Callable[[ScanReport], None] | None = None) -> None:
        self.volumes = volumes
        # Called with each scan's report (capacity_publisher.py); never stops the scans.
        self.after_scan = after_scan
        self._hook_error: str | None = None
        # None: classes are never read, nothing is recorded (the driver's
        # setting applies to every directory without a record).
        self.list_classes = list_classes
        # This scan's class specs by name, or why they could not be read:
        # one LIST per scan, made by the first directory that needs it.
        self._classes: Mapping[str, Mapping[str, Any]] | Refused | None = None
        self.root = volumes.root
        self.resolve_policy = resolve_policy
        self.reclaim = reclaim
        self.interval_s = interval_s
        self.mounted_under = mounted_under
        self.clock = clock
        self.deletions = 0
        # When the driver started: until a first scan ends (a big root or a
        # slow apiserver), stalls are counted from here.
        self.started_at = clock()
        self.report: ScanReport | None = None  # None until a first scan has ended
        self._usage: dict[Path, Usage] = {}  # policy dir -> usage at the last scan
        self._reported_unknown: set[Path] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="csi-collector", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        """Whether the scan thread still runs (it ends only on a bug)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                report = self.scan()
            except OSError as err:
                # The next scan tries again; the report's time shows a stall.
                log.error("scan of %s failed: %s", self.root, err)
            else:
                self._after(report)
            self._stop.wait(self.interval_s)

    def _after(self, report: ScanReport) -> None:
        """The hook; an error it did not foresee is said once, and scans go on."""
        try:
            if self.after_scan is not None:
                self.after_scan(report)
            self._hook_error = None
        except Exception as err:
            said = f"{type(err).__name__}: {err}"
            if said != self._hook_error:
                log.error("after the scan of %s: %s (scans go on)", self.root, said)
                self._hook_error = said

    def usage_of(self, policy_dir: Path) -> Usage:
        """The directory's usage from the last scan, else measured now (once)."""
        found = self._usage.get(policy_dir)
        if found is None:
            found = self._usage[policy_dir] = measure(policy_dir / DATA_DIR)
        return found

    def scan(self) -> ScanReport:
        """One pass over the root; returns (and keeps) its report."""
        report = ScanReport(at=self.clock())
        usage: dict[Path, Usage] = {}
        self._classes = None
        if self.root.is_dir():
            self._empty_trash()
            for namespace in sorted(self.root.iterdir()):
                if namespace.name.startswith(".") or not _real_dir(namespace):
                    continue  # .published, .trash; a file or link is nobody's namespace
                try:
                    directories = sorted(namespace.iterdir())
                except OSError as err:
                    # One namespace's trouble holds up none of the others.
                    log.error("%s: not scanned: %s", namespace, err)
                    continue
                for directory in directories:
                    if directory.name.startswith("."):
                        continue  # a staging dir (.new-*) being made
                    try:
                        found = self._scan_one(namespace.name, directory, report)
                    except OSError as err:
                        # One directory's trouble holds up none of the others.
                        log.error("%s: not scanned: %s", directory, err)
                        continue
                    if found is not None and found.usage is not None:
                        usage[directory] = found.usage
            report.capacity = capacity(self.root)
        report.at = self.clock()  # when it ended: what the metric shows
        self._usage = usage
        self.report = report
        return report

    def _scan_one(self, namespace: str, directory: Path, report: ScanReport
                  ) -> PolicyData | None:
        owner = read_owner(directory) if _real_dir(directory) else None
        if owner is None or (owner.namespace, owner.policy_uid) != (namespace, directory.name):
            report.unknown_owners += 1
            if directory not in self._reported_unknown:
                self._reported_unknown.add(directory)
                log.warning("%s: no valid owner marker (%s): an unknown owner, kept and never "
                            "handed out", directory, "none or unreadable" if owner is None
                            else "it names another place")
            return None
        found: PolicyFound | None = None
        try:
            found = self.resolve_policy(owner.namespace, owner.policy_name)
            seen = collection.sighting(owner.policy_uid, uid_of(found))
        except Refused as err:
            log.info("policy %s/%s: %s; nothing decided this scan", owner.namespace,
                     owner.policy_name, err.message)
            seen = Sighting.UNKNOWN
        if seen is Sighting.PRESENT and isinstance(found, PolicyFound):
            self._record(directory, found.class_name, report)
        verdict, clock, reclaim = self._settle(directory, seen, report)
        usage = None
        if verdict is not Verdict.DELETE:
            try:
                usage = measure(directory / DATA_DIR)
            except OSError as err:
                log.warning("%s: usage not measured: %s", directory, err)
        data = PolicyData(owner.namespace, owner.policy_name, owner.policy_uid, verdict, usage,
                          None if clock is None or verdict is Verdict.LIVE else clock.since,
                          reclaim.grace_s)
        if verdict is not Verdict.DELETE:
            report.policies.append(data)
        return data

    def _class_specs(self, report: ScanReport) -> Mapping[str, Mapping[str, Any]] | Refused:
        """Every class's spec, read once per scan (or why it could not be:
        warned once per scan)."""
        if self._classes is None:
            assert self.list_classes is not None
            try:
                self._classes = self.list_classes()
            except Refused as err:
                log.warning("%s; no recorded reclaim changes this scan, and a directory "
                            "whose class was never read is held", err.message)
                report.class_list_failed = True
                self._classes = err
        return self._classes

    def _record(self, directory: Path, class_name: str | None, report: ScanReport) -> None:
        """Record what the policy's class says of reclaim, while the policy
        is there to name it. A class that cannot be read (the LIST failed,
        the class is gone, or it does not read) changes nothing recorded,
        but a directory with no record yet gets one naming the class with
        its reclaim unknown (held once its policy is gone, never the
        driver's setting)."""
        if self.list_classes is None or class_name is None:
            # No class (a policy's class is fixed at its creation): nothing
            # to record, the driver's setting applies.
            return
        classes = self._class_specs(report)
        spec = None if isinstance(classes, Refused) else classes.get(class_name)
        recorded: Recorded | None = None
        if spec is None and not isinstance(classes, Refused):
            log.warning("%s: CheckpointClass %s not found; the recorded reclaim holds",
                        directory, class_name)
        elif spec is not None:
            try:
                recorded = class_reclaim.from_class(class_name, spec)
            except InvalidInput as err:
                log.warning("%s: %s; the recorded reclaim holds", directory, err)
        before = read_recorded(directory)
        if recorded is None:
            if isinstance(before, Recorded) and before.class_name == class_name:
                return  # the recorded reclaim holds
            recorded = Recorded(class_name, known=False)
        if before == recorded:
            return
        try:
            write_file(directory / RECLAIM_FILE, class_reclaim.dumps(recorded))
        except OSError as err:
            log.warning("%s: reclaim not recorded (%s); the old record holds", directory, err)
            return
        reclaim, source = collection.effective(recorded, self.reclaim)
        log.info("%s: reclaim %s after %g s recorded (from %s)", directory,
                 reclaim.policy, reclaim.grace_s, source)

    def _settle(self, directory: Path, seen: Sighting, report: ScanReport
                ) -> tuple[Verdict, DeletedClock | None, Reclaim]:
        """Decide on the directory and carry the decision out; the verdict,
        the clock as it now is on disk, and the reclaim that applied."""
        clock = read_clock(directory)
        if seen is Sighting.PRESENT and clock is None:
            # The common case: nothing to lock or write.
            return Verdict.LIVE, None, self.reclaim
        recorded = read_recorded(directory)
        reclaim, source = collection.effective(recorded, self.reclaim)
        if isinstance(recorded, Unreadable) or (recorded is not None and not recorded.known):
            report.held_records += 1
            log.warning("%s: reclaim from %s: kept this scan", directory, source)
        with self.volumes.lock:
            published = (directory / DATA_DIR in self.volumes.published_sources()
                         or self.mounted_under(directory))
            decision = collection.decide(seen, clock, published, self.clock(), reclaim,
                                         self.interval_s)
            moved = self._move_to_trash(directory, reclaim, source) \
                if decision.verdict is Verdict.DELETE else None
        if decision.verdict is Verdict.DELETE:
            if moved is None:
                # Not moved (logged): kept, reported, tried again.
                return Verdict.PENDING, decision.clock, reclaim
            self._remove(moved)  # outside the lock: a big tree takes a while
            return Verdict.DELETE, None, reclaim
        if decision.clock != clock:
            if decision.clock is None:
                (directory / DELETED_SINCE_FILE).unlink(missing_ok=True)
                log.info("%s: its policy is there again; collection called off", directory)
            else:
                write_file(directory / DELETED_SINCE_FILE, json.dumps(
                    {"since": decision.clock.since, "last": decision.clock.last}))
                if clock is None or decision.clock.since != clock.since:
                    log.info("%s: its policy is deleted; %s (reclaim from %s)", directory,
                             "kept (reclaim Retain)" if reclaim.policy == collection.RETAIN
                             else f"deleted after {reclaim.grace_s:g} s of sightings "
                                  "unless it comes back", source)
        return decision.verdict, decision.clock, reclaim

    def _move_to_trash(self, directory: Path, reclaim: Reclaim, source: str) -> Path | None:
        """Rename the directory into the trash; called under the volume lock,
        so no publish comes between the check and the rename."""
        if not _real_dir(directory) or not _real_dir(directory.parent):
            return None
        trash = self.root / TRASH_DIR
        if not _real_dir(trash):
            try:
                trash.mkdir(mode=0o700)
            except FileExistsError:
                # A link or a file there: renaming into it could land anywhere.
                log.error("%s is not a directory (a link or a file): %s kept until a "
                          "person removes it", trash, directory)
                return None
        moved = trash / f"{directory.parent.name}-{directory.name}-{uuid.uuid4().hex[:8]}"
        os.rename(directory, moved)
        self.deletions += 1
        log.info("deleted %s: its policy was deleted more than %g s ago (reclaim Delete "
                 "from %s)", directory, reclaim.grace_s, source)
        return moved

    def _empty_trash(self) -> None:
        trash = self.root / TRASH_DIR
        if _real_dir(trash):
            for left in trash.iterdir():
                self._remove(left)

    @staticmethod
    def _remove(path: Path) -> None:
        """Remove a directory in the trash (removal.py: no link followed, no
        other filesystem entered)."""
        try:
            remove_from(path.parent, path.name)
        except FileNotFoundError:
            pass  # gone already
        except OSError as err:
            log.error("%s: not removed yet (%s); the next scan tries again", path, err)
