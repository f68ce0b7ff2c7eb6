"""One call of Drainer.drain (transfer/drain.py): its journal, its tasks and
its workers. Each worker owns one part buffer: it reads a part into it,
checksums it, draws its bytes from the shared rate limiter and sends it;
the last part of a file assembles the object and checks its size; the
manifest is written only once every data object is complete and still
there. Transient store errors are retried here with bounded backoff;
a cancelled run raises DrainCancelled, its journal keeping what is durable.
"""

from __future__ import annotations

import os
import queue
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ckptdrain import checksum, keys
from ckptdrain.errors import (
    BucketMissing,
    IntegrityError,
    Interrupted,
    ObjectMissing,
    StoreAccessDenied,
    StoreError,
)
from ckptdrain.manifest import FileEntry, WriterManifest
from ckptdrain.store.base import SendStopped, UploadedPart
from ckptdrain.transfer import journal as jr
from ckptdrain.transfer import resume as rs
from ckptdrain.transfer.partcrcs import with_part_crcs
from ckptdrain.transfer.resume import Task

if TYPE_CHECKING:
    from ckptdrain.transfer.drain import Drainer

T = TypeVar("T")


class DrainCancelled(Interrupted):
    """The drain was asked to stop; the journal holds what is already durable."""


def _transient(err: BaseException) -> bool:
    if isinstance(err, StoreAccessDenied | BucketMissing | ObjectMissing):
        return False
    return isinstance(err, StoreError | ConnectionError | TimeoutError)


class _Stop(SendStopped):
    """This run is stopping: raised by its pacer inside a store's send too."""


class DrainRun:
    """One call of Drainer.drain: its journal, its tasks, its workers."""

    def __init__(self, d: Drainer, src: Path, manifest: WriterManifest, journal_path: Path,
                 cancel: threading.Event, progress: Callable[[int], None] | None) -> None:
        self.d, self.store, self.src = d, d.store, src
        self.journal_path, self.cancel, self.progress = journal_path, cancel, progress
        self.lock = threading.Lock()  # journal, counters, progress
        self.file_locks = {f.path: threading.Lock() for f in manifest.files}
        self.pending: dict[str, int] = {}
        self.error: BaseException | None = None
        self.sent_bytes = self.resumed_bytes = self.parts_sent = 0
        self.tasks: list[Task] = []
        self.store_paces = False
        self.turn = threading.Lock()  # whose part draws tokens next
        self.journal, self.manifest, self.resuming = rs.open_journal(
            self.store, journal_path, manifest, d.part_size_for, d.part_size)

    def prepare(self) -> None:
        """Clear stale leftovers, reconcile the journal with the store, and
        list what is left to send (transfer/resume.py)."""
        plan = rs.reconcile(self.store, self.journal, self.manifest, self.d.part_size_for,
                            self.d.stale_after, self.resuming)
        self.tasks, self.pending, self.resumed_bytes = plan.tasks, plan.pending, plan.resumed_bytes
        jr.save(self.journal_path, self.journal)
        if self.progress and self.resumed_bytes:
            self.progress(self.resumed_bytes)  # cumulative: resumed bytes count as done

    def upload_all(self) -> None:
        # A store that can pace its sends (S3) throttles bytes as they reach
        # the socket; others get each piece's tokens before it is sent.
        setter = getattr(self.store, "set_pacer", None)
        self.store_paces = callable(setter)
        if self.store_paces:
            setter(self._send)  # type: ignore[misc]
        try:
            self._run_workers()
        finally:
            if self.store_paces:
                setter(None)  # type: ignore[misc]

    def _run_workers(self) -> None:
        work: queue.SimpleQueue[Task] = queue.SimpleQueue()
        for task in self.tasks:
            work.put(task)
        # Single puts are never larger than the part size; a grown part that is
        # goes through the buffer in pieces (_do_streamed).
        buffer_size = min(max((t.length for t in self.tasks), default=0), self.d.part_size)
        workers = [
            threading.Thread(target=self._worker, args=(work, buffer_size), daemon=True,
                             name=f"ckptdrain-drain-{i}")
            for i in range(min(self.d.concurrency, len(self.tasks)))
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if self.error is not None:
            raise self.error
        if self.cancel.is_set():
            raise DrainCancelled("drain cancelled; the journal keeps what is already durable")

    def _stopping(self) -> bool:
        return self.cancel.is_set() or self.error is not None

    def _worker(self, work: queue.SimpleQueue[Task], buffer_size: int) -> None:
        buf = bytearray(buffer_size)  # this worker's one buffer, reused for every part
        view = memoryview(buf)
        while not self._stopping():
            try:
                task = work.get_nowait()
            except queue.Empty:
                return
            try:
                self._do(task, view)
            except _Stop:
                return
            except BaseException as err:  # handed to the caller of drain()
                with self.lock:
                    self.error = self.error or err
                return

    def _read(self, task: Task, view: memoryview) -> tuple[memoryview, int]:
        """The task's bytes, read into the worker's buffer, and their CRC32C.
        A task longer than the buffer is read through it a buffer at a time:
        only the CRC32C is kept (the part is then sent streamed)."""
        fd = os.open(self.src / task.entry.path, os.O_RDONLY)
        try:
            crc, done = 0, 0
            while done < task.length:
                data = view[: min(len(view), task.length - done)]
                got = 0
                while got < len(data):
                    n = os.preadv(fd, [data[got:]], task.offset + done + got)
                    if n == 0:
                        raise IntegrityError(
                            f"{task.entry.path}: file shrank since it was scanned")
                    got += n
                crc = checksum.crc32c(data, crc)
                done += len(data)
        finally:
            os.close(fd)
        return view[: task.length], crc

    def _send(self, n: int) -> None:
        """Draw `n` bytes from the shared limiter; _Stop if the drain is stopping."""
        if not self.d.limiter.acquire(n, should_stop=self._stopping):
            raise _Stop

    def _before_send(self, n: int) -> None:
        if not self.store_paces:
            # One part's tokens at a time: interleaved waits would let every
            # worker finish waiting together, burst, and leave the bucket idle.
            with self.turn:
                self._send(n)

    def _do(self, task: Task, view: memoryview) -> None:
        entry, path = task.entry, task.entry.path
        state = self.journal.files[path]
        if task.number == -1:
            self._finish(entry)
            return
        data, crc = self._read(task, view)
        if task.number == 0:
            if len(data) != task.length:  # never: a single put is at most a part size
                raise RuntimeError(f"{path}: a {task.length}-byte single put exceeds the buffer")
            if checksum.to_hex(crc) != entry.crc32c:
                raise IntegrityError(f"{path}: changed since it was scanned (CRC32C differs)")
            self._before_send(task.length)
            self._retry(lambda: self.store.put_bytes(state.key, data, crc))
            self._verify_size(entry, state.key)
            with self.lock:
                self.journal.file_complete(path, [crc])
                self._durable(task.length)
            return
        with self.file_locks[path]:
            if state.upload_id is None:
                upload_id = self._retry(lambda: self.store.create_multipart(state.key))
                with self.lock:
                    self.journal.upload_started(path, upload_id)
                    jr.save(self.journal_path, self.journal)
            upload_id = state.upload_id
        assert upload_id is not None
        self._before_send(task.length)
        # The part's CRC32C goes with it: the store verifies it (no MD5 to
        # compute), and completion needs it back from the journal.
        if task.length <= len(view):
            part = self._retry(lambda: self.store.upload_part(
                state.key, upload_id, task.number, data, crc32c=crc))
        else:
            part = self._retry(lambda: self._upload_streamed(task, state.key, upload_id, crc))
        with self.lock:
            self.journal.part_done(path, jr.PartRecord(task.number, part.etag, crc, task.length))
            self._durable(task.length)
            self.pending[path] -= 1
            last = self.pending[path] == 0
        if last:
            self._finish(entry)

    def _upload_streamed(self, task: Task, key: str, upload_id: str, crc: int) -> UploadedPart:
        """Send a part larger than the buffer from the file itself (each try
        from a fresh descriptor at the part's offset)."""
        with open(self.src / task.entry.path, "rb") as f:
            f.seek(task.offset)
            return self.store.upload_part_from(key, upload_id, task.number, f, task.length, crc)

    def _durable(self, n: int) -> None:
        """Journal a durable piece (caller holds the lock), then report it."""
        jr.save(self.journal_path, self.journal)
        self.sent_bytes += n
        self.parts_sent += 1
        if self.progress:
            self.progress(self.resumed_bytes + self.sent_bytes)

    def _finish(self, entry: FileEntry) -> None:
        """Check the parts against the manifest, assemble the object, check its size."""
        state = self.journal.files[entry.path]
        parts = [state.parts[n] for n in sorted(state.parts)]
        crc = 0
        for p in parts:
            crc = checksum.combine(crc, p.crc32c, p.size)
        if checksum.to_hex(crc) != entry.crc32c or sum(p.size for p in parts) != entry.size:
            raise IntegrityError(f"{entry.path}: changed since it was scanned (CRC32C differs)")
        upload_id = state.upload_id
        assert upload_id is not None
        self._retry(lambda: self.store.complete_multipart(
            state.key, upload_id, [UploadedPart(p.number, p.etag, p.crc32c) for p in parts]))
        self._verify_size(entry, state.key)
        with self.lock:
            self.journal.file_complete(entry.path)
            jr.save(self.journal_path, self.journal)

    def _verify_size(self, entry: FileEntry, key: str) -> None:
        info = self._retry(lambda: self.store.head(key))
        if info is None or info.size != entry.size:
            seen = "missing" if info is None else f"{info.size} bytes"
            raise IntegrityError(f"{key}: store holds {seen}, manifest says {entry.size} bytes")

    def commit(self, mkey: str) -> None:
        """Write the manifest: the data objects are all complete and verified."""
        if self.cancel.is_set():
            raise DrainCancelled("drain cancelled before its manifest was written")
        try:  # in the caller's thread: a retry's wait cut short by the cancel ends here
            self._check_still_there()
            self.manifest = with_part_crcs(self.manifest, self.journal)
            body = self.manifest.to_json()
            self._retry(lambda: self._put_unless_cancelled(mkey, body))
        except _Stop:
            raise DrainCancelled("drain cancelled before its manifest was written") from None
        with self.lock:
            self.journal.manifest_done()
            jr.save(self.journal_path, self.journal)

    def _put_unless_cancelled(self, mkey: str, body: bytes) -> None:
        """The commit's PUT, each try of it only while the drain is wanted: a
        cancel that came during the checks before it (a restore round
        abandoning the step) stops it here, at the commit point, and never
        leaves the abandoned step's manifest in the store."""
        if self.cancel.is_set():
            raise _Stop
        self.store.put_bytes(mkey, body)

    def _check_still_there(self) -> None:
        """Right before the commit, every data object of this attempt must
        still be in the store at its size (one listing). Retention may have
        removed a resumed attempt's old objects as orphans after the resume
        checked them; a manifest written now would name missing data. The
        missing files are journaled incomplete, so a retry re-sends them."""
        m = self.manifest
        listed = {i.key: i.size for i in self._retry(lambda: list(self.store.list(
            keys.data_prefix(m.step, m.writer, m.attempt))))}
        missing = [f.path for f in m.files
                   if listed.get(keys.data_key(m.step, m.writer, f.path, m.attempt)) != f.size]
        if not missing:
            return
        with self.lock:
            for path in missing:
                self.journal.file_incomplete(path)
            jr.save(self.journal_path, self.journal)
        raise StoreError(
            f"step {m.step} writer {m.writer}: {len(missing)} data object(s) of attempt "
            f"{m.attempt} vanished before the commit (first: {missing[0]!r}); "
            "nothing committed, a retry re-sends them")

    def _retry(self, call: Callable[[], T]) -> T:
        """Run `call`, retrying transient store errors with bounded exponential backoff."""
        for attempt in range(self.d.attempts):
            try:
                return call()
            except Exception as err:
                if not _transient(err) or attempt == self.d.attempts - 1:
                    raise
                delay = min(self.d.max_backoff, self.d.backoff * 2**attempt)
                if self.cancel.wait(delay * random.uniform(0.5, 1.0)):
                    raise _Stop from None
        raise AssertionError("unreachable")
