"""Drain, catalog and fetch against the file:// store (real, serverless)."""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ckptdrain import keys
from ckptdrain.errors import IntegrityError, InvalidInput, NoCheckpoint, UnsafePath
from ckptdrain.node.lease import WriterFenced
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer import journal as jr
from ckptdrain.transfer.catalog import complete_steps, scan
from ckptdrain.transfer.drain import Drainer, abort_superseded, supersede_decision
from ckptdrain.transfer.drain_run import DrainCancelled
from ckptdrain.transfer.fetch import fetch, verify_dir, verify_store
from ckptdrain.transfer.scan import build_manifest

PART = 64 << 10


class Counting:
    """Counts calls and part numbers sent; can stop the drain after N parts."""

    def __init__(self, inner: LocalStore, stop_after_parts: int | None = None,
                 cancel: threading.Event | None = None) -> None:
        self.inner, self.uri = inner, inner.uri
        self.calls: Counter[str] = Counter()
        self.parts_sent: list[tuple[str, int]] = []
        self.stop_after, self.cancel = stop_after_parts, cancel
        self.lock = threading.Lock()

    @property
    def min_part_size(self) -> int:
        return self.inner.min_part_size

    def upload_part(self, key: str, upload_id: str, number: int, data: Any,
                    crc32c: int | None = None) -> Any:
        result = self.inner.upload_part(key, upload_id, number, data, crc32c)
        with self.lock:
            self.parts_sent.append((key, number))
            if self.stop_after is not None and len(self.parts_sent) >= self.stop_after:
                assert self.cancel is not None
                self.cancel.set()
        return result

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)  # AttributeError for what the store lacks

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return method(*args, **kwargs)
        return call


def make_checkpoint(root: Path, seed: int = 1) -> Path:
    rng = __import__("random").Random(seed)
    root.mkdir(parents=True)
    (root / "big.bin").write_bytes(rng.randbytes(PART * 7 + 123))
    (root / "shards").mkdir()
    for i in range(5):
        (root / "shards" / f"{i}.pt").write_bytes(rng.randbytes(rng.randrange(0, PART)))
    (root / "empty").write_bytes(b"")
    return root


def push(store: Any, src: Path, step: int, tmp: Path, **kw: Any) -> Any:
    manifest = build_manifest(src, step, 0, 1, created=1.0)
    drainer = Drainer(store, part_size=PART, concurrency=3)
    return drainer.drain(src, manifest, journal_path=tmp / f"journal-{step}.json", **kw)


def same_tree(a: Path, b: Path) -> bool:
    files = lambda p: {str(f.relative_to(p)): f.read_bytes() for f in p.rglob("*") if f.is_file()}  # noqa: E731
    return files(a) == files(b)


def test_round_trip_is_byte_exact(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    src = make_checkpoint(tmp_path / "src")
    result = push(store, src, 7, tmp_path)
    assert result.bytes == sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
    assert [c.step for c in complete_steps(store)] == [7]
    got = fetch(store, tmp_path / "dest")
    assert got.step == 7 and got.skipped == []
    assert same_tree(src, tmp_path / "dest")
    assert verify_store(store, 7) == []
    manifest = complete_steps(store)[0].manifests[0]
    assert manifest.part_size == PART
    assert verify_dir(tmp_path / "dest", manifest) == []


def test_a_fenced_writer_commits_nothing_and_commits_once_unfenced(tmp_path: Path) -> None:
    """`before_commit` (the agent's writer lease) runs after the data, before
    the manifest: raising there leaves the step incomplete, never half-committed."""
    store = LocalStore(tmp_path / "store")
    src = make_checkpoint(tmp_path / "src")

    def fenced() -> None:
        raise WriterFenced("held by pod uid other")

    with pytest.raises(WriterFenced):
        push(store, src, 7, tmp_path, before_commit=fenced)
    assert complete_steps(store) == []
    assert store.head(keys.manifest_key(7, 0)) is None
    calls: list[str] = []
    push(store, src, 7, tmp_path, before_commit=lambda: calls.append("checked"))
    assert calls == ["checked"] and [c.step for c in complete_steps(store)] == [7]


def test_resume_sends_no_finished_part_twice(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src")
    cancel = threading.Event()
    first = Counting(LocalStore(tmp_path / "store"), stop_after_parts=3, cancel=cancel)
    with pytest.raises(DrainCancelled):
        push(first, src, 3, tmp_path, cancel=cancel)
    assert complete_steps(first.inner) == []  # nothing visible yet
    journal = jr.load(tmp_path / "journal-3.json")
    assert journal is not None and not journal.manifest_written
    durable = {(s.key, n) for s in journal.files.values() for n in s.parts}
    assert durable  # some parts were journaled before the stop
    second = Counting(LocalStore(tmp_path / "store"))
    result = push(second, src, 3, tmp_path)
    assert not durable & set(second.parts_sent)
    assert result.resumed_bytes > 0
    assert [c.step for c in complete_steps(second.inner)] == [3]
    fetch(second.inner, tmp_path / "dest")
    assert same_tree(src, tmp_path / "dest")


def test_vanished_upload_starts_that_file_over(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src")
    store = LocalStore(tmp_path / "store")
    cancel = threading.Event()
    with pytest.raises(DrainCancelled):
        push(Counting(store, stop_after_parts=2, cancel=cancel), src, 4, tmp_path, cancel=cancel)
    journal = jr.load(tmp_path / "journal-4.json")
    assert journal is not None
    assert abort_superseded(store, journal) >= 1  # the store forgets the upload
    push(store, src, 4, tmp_path)
    fetch(store, tmp_path / "dest")
    assert same_tree(src, tmp_path / "dest")


def test_file_changed_after_scan_is_never_committed(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src")
    store = LocalStore(tmp_path / "store")
    manifest = build_manifest(src, 5, 0, 1, created=1.0)
    data = bytearray((src / "big.bin").read_bytes())
    data[PART * 3] ^= 1
    (src / "big.bin").write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        Drainer(store, part_size=PART).drain(src, manifest, journal_path=tmp_path / "j.json")
    assert store.head(keys.manifest_key(5, 0)) is None


def test_corrupt_newest_falls_back_to_previous(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    old = make_checkpoint(tmp_path / "old", seed=1)
    new = make_checkpoint(tmp_path / "new", seed=2)
    push(store, old, 1, tmp_path)
    pushed = push(store, new, 2, tmp_path)
    obj = store.root / keys.data_key(2, 0, "big.bin", pushed.attempt)
    raw = bytearray(obj.read_bytes())
    raw[100] ^= 0xFF
    obj.write_bytes(bytes(raw))
    got = fetch(store, tmp_path / "dest")
    assert got.step == 1 and "step 2" in got.skipped[0] and "CRC32C" in got.skipped[0]
    assert same_tree(old, tmp_path / "dest")
    assert verify_store(store, 2) and verify_store(store, 1) == []
    with pytest.raises(IntegrityError):
        fetch(store, tmp_path / "dest2", step=2)
    assert not (tmp_path / "dest2").exists()


def test_incomplete_step_is_rejected_with_a_reason(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    src = make_checkpoint(tmp_path / "src")
    manifest = build_manifest(src, 9, 1, 2, created=1.0)  # writer 1 of 2, writer 0 missing
    Drainer(store, part_size=PART).drain(src, manifest, journal_path=tmp_path / "j.json")
    cat = scan(store)
    assert cat.complete == [] and "writer 0" in cat.rejected[0].reason
    with pytest.raises(NoCheckpoint):
        fetch(store, tmp_path / "dest")


@pytest.mark.parametrize("bad", ["../escape", "/abs", "a/../../b", "a//b"])
def test_traversal_manifest_refused_before_any_write(tmp_path: Path, bad: str) -> None:
    store = LocalStore(tmp_path / "store")
    doc = {"format": 1, "step": 1, "writer": 0, "writers": 1, "created": 1.0,
           "files": [{"path": bad, "size": 1, "crc32c": "00000000"}]}
    store.put_bytes(keys.manifest_key(1, 0), json.dumps(doc).encode())
    with pytest.raises((NoCheckpoint, UnsafePath)):
        fetch(store, tmp_path / "dest", step=1)
    assert not (tmp_path / "dest").exists() and not (tmp_path / "escape").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["store"]


def test_scan_refuses_symlinks(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src")
    os.symlink("/etc/passwd", src / "link")
    with pytest.raises(InvalidInput, match="symlink"):
        build_manifest(src, 1, 0, 1, created=0.0)


def test_nonempty_dest_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    push(store, make_checkpoint(tmp_path / "src"), 1, tmp_path)
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "keep").write_text("mine")
    with pytest.raises(InvalidInput, match="dest"):
        fetch(store, tmp_path / "dest")
    assert (tmp_path / "dest" / "keep").read_text() == "mine"


def test_supersede_only_when_far_from_done() -> None:
    assert supersede_decision(10, 100, newer_ready=True) == "supersede"
    assert supersede_decision(80, 100, newer_ready=True) == "finish"
    assert supersede_decision(0, 100, newer_ready=False) == "finish"
    assert supersede_decision(0, 0, newer_ready=True) == "finish"


def test_a_store_that_may_not_list_uploads_still_drains(tmp_path: Path) -> None:
    """Least-privilege credentials without s3:ListBucketMultipartUploads:
    clean-up is skipped (and said so in the log), never the drain."""
    from ckptdrain.errors import StoreAccessDenied

    class NoListing(LocalStore):
        def list_multipart_uploads(self, prefix: str) -> list[Any]:
            raise StoreAccessDenied("list_multipart_uploads: AccessDenied")

    store = NoListing(tmp_path / "store")
    src = make_checkpoint(tmp_path / "src")
    push(store, src, 1, tmp_path)
    fetch(store, tmp_path / "dest")
    assert same_tree(src, tmp_path / "dest")


def test_data_of_a_committed_manifest_is_never_written_again(tmp_path: Path) -> None:
    """A replacement writes a new attempt beside the committed one."""
    store = LocalStore(tmp_path / "store")
    src = make_checkpoint(tmp_path / "src", seed=1)
    first = push(store, src, 4, tmp_path)
    before = {i.key: store.get_bytes(i.key) for i in store.list(keys.DATA)}
    (src / "big.bin").write_bytes(b"new content")
    manifest = build_manifest(src, 4, 0, 1, created=2.0)
    second = Drainer(store, part_size=PART).drain(
        src, manifest, journal_path=tmp_path / "j-new.json", replace=True)
    assert second.attempt != first.attempt
    assert all(store.get_bytes(k) == v for k, v in before.items())
    assert verify_store(store, 4) == []


def test_a_pull_removes_the_staging_a_killed_pull_left(tmp_path: Path) -> None:
    import subprocess
    import sys

    from ckptdrain.transfer.fetch import fetch
    from ckptdrain.transfer.staging import remove_stale_staging

    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 5000)
    Drainer(store).drain(src, build_manifest(src, 1, 0, 1, created=1.0),
                         journal_path=tmp_path / "j")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    killed = tmp_path / f".dest.ckptdrain-{dead}-abc"  # a pull SIGKILLed mid-way
    (killed / "part").mkdir(parents=True)
    running = tmp_path / f".dest.ckptdrain-{os.getppid()}-def"  # a pull still running
    running.mkdir()
    other = tmp_path / f".other.ckptdrain-{dead}-ghi"  # beside another DEST
    other.mkdir()
    fetch(store, tmp_path / "dest")
    assert (tmp_path / "dest" / "a.bin").read_bytes() == b"x" * 5000
    assert not killed.exists() and running.exists() and other.exists()
    assert remove_stale_staging(tmp_path / "dest") == 0


def test_staging_of_this_very_pid_is_stale(tmp_path: Path) -> None:
    # In a container a restarted pull is PID 1 again: its predecessor's
    # staging carries the same PID, and this process has no other pull there.
    from ckptdrain.transfer.fetch import remove_stale_staging

    left = tmp_path / f".dest.ckptdrain-{os.getpid()}-abcd"
    (left / "half").mkdir(parents=True)
    assert remove_stale_staging(tmp_path / "dest") == 1 and not left.exists()
