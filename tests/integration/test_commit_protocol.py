"""The commit protocol against real stores (file://, SeaweedFS, MinIO): a
committed checkpoint is never changed behind its manifest's back, re-pushes
are refused, skipped or replaced whole, concurrent writers end consistent,
and a resume never re-sends what is already in the store."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ckptdrain import keys
from ckptdrain.errors import CommitConflict
from ckptdrain.store.base import Store
from ckptdrain.store.gcs import GcsStore
from ckptdrain.store.s3 import S3Store
from ckptdrain.transfer import journal as jr
from ckptdrain.transfer.catalog import complete_steps, load_checkpoint, scan
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch, verify_store
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration
MiB = 1 << 20
PART = 5 * MiB


class Sent:
    """Wraps a real store; records the key of every byte-carrying call."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.uri = inner, inner.uri
        self.keys: list[str] = []
        self.bytes = 0
        self._lock = threading.Lock()

    @property
    def min_part_size(self) -> int:
        return self.inner.min_part_size

    def _log(self, key: str, n: int) -> None:
        with self._lock:
            self.keys.append(key)
            self.bytes += n

    def put_bytes(self, key: str, data: bytes, crc32c: int | None = None) -> None:
        self._log(key, len(data))
        self.inner.put_bytes(key, data, crc32c)

    def upload_part(self, key: str, upload_id: str, number: int, data: Any,
                    crc32c: int | None = None) -> Any:
        self._log(key, len(data))
        return self.inner.upload_part(key, upload_id, number, data, crc32c)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def checkpoint(root: Path, seed: int, big: int = 12 * MiB + 5, shards: int = 3) -> Path:
    rng = random.Random(seed)
    (root / "shards").mkdir(parents=True)
    (root / "model.bin").write_bytes(rng.randbytes(big))
    for i in range(shards):
        (root / "shards" / f"rank{i}.pt").write_bytes(rng.randbytes(rng.randrange(1, 200_000)))
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def drain(store: Any, src: Path, step: int, journal: Path, **kw: Any) -> Any:
    manifest = build_manifest(src, step, 0, 1, created=time.time())
    replace = kw.pop("replace", False)
    kw.setdefault("concurrency", 3)
    return Drainer(store, part_size=PART, **kw).drain(
        src, manifest, journal_path=journal, replace=replace)


def cli(store: Store, request: pytest.FixtureRequest, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if isinstance(store, S3Store):
        server = request.getfixturevalue("store_server")
        env.update(CKPTDRAIN_S3_ENDPOINT=server.endpoint_url, AWS_ACCESS_KEY_ID=server.access_key,
                   AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_DEFAULT_REGION=server.region)
    if isinstance(store, GcsStore):  # an emulator: plain http, asked anonymously
        env["STORAGE_EMULATOR_HOST"] = store.endpoint.split("://", 1)[1]
    return subprocess.Popen([sys.executable, "-m", "ckptdrain", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run(store: Store, request: pytest.FixtureRequest, *args: str) -> tuple[int, str, str]:
    proc = cli(store, request, *args)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out.decode(), err.decode()


def restored(store: Store, dest: Path, step: int) -> dict[str, bytes]:
    fetch(store, dest, step=step)
    return tree(dest)


def test_identical_repush_sends_nothing_and_different_content_is_refused(
        store: Store, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    a = checkpoint(tmp_path / "a" / "step-3", seed=1)
    b = checkpoint(tmp_path / "b" / "step-3", seed=2)
    code, _, err = run(store, request, "push", str(a), store.uri, "--part-size", "5MiB", "-q")
    assert code == 0, err

    sent = Sent(store)
    again = drain(sent, a, 3, tmp_path / "fresh-journal")  # a restarted writer: no journal
    assert again.already_committed and sent.keys == [] and again.sent_bytes == 0
    code, out, err = run(store, request, "push", str(a), store.uri, "--part-size", "5MiB")
    assert code == 0 and "already committed" in out, err

    code, out, err = run(store, request, "push", str(b), store.uri, "--part-size", "5MiB")
    assert code == 6, err
    line = err.strip()
    assert "\n" not in line and "step 3" in line and "writer 0" in line and "--replace" in line
    assert restored(store, tmp_path / "d1", 3) == tree(a) and verify_store(store, 3) == []

    code, _, err = run(store, request, "push", str(b), store.uri, "--part-size", "5MiB",
                       "--replace", "-q")
    assert code == 0, err
    assert restored(store, tmp_path / "d2", 3) == tree(b) and verify_store(store, 3) == []


def test_killed_replace_leaves_the_committed_step_intact(
        store: Store, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    a = checkpoint(tmp_path / "a" / "step-5", seed=3)
    b = checkpoint(tmp_path / "b" / "step-5", seed=4, big=30 * MiB)
    drain(store, a, 5, tmp_path / "ja")
    before = load_checkpoint(store, 5).manifests[0]
    journal = tmp_path / "jb"
    proc = cli(store, request, "push", str(b), store.uri, "--replace", "--rate", "20MB/s",
               "--part-size", "5MiB", "--concurrency", "2", "--journal", str(journal), "-q")
    try:
        while True:  # until some of the new attempt's parts are durable
            state = jr.load(journal)
            if state is not None and sum(len(f.parts) for f in state.files.values()) >= 2:
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.communicate()
    assert [c.step for c in complete_steps(store)] == [5]
    assert load_checkpoint(store, 5).manifests[0] == before
    assert verify_store(store, 5) == []
    assert restored(store, tmp_path / "d1", 5) == tree(a)

    sent = Sent(store)
    result = drain(sent, b, 5, journal, replace=True)  # the resumed replacement
    assert result.resumed_bytes >= 2 * PART
    assert load_checkpoint(store, 5).manifests[0].attempt == result.attempt != before.attempt
    assert verify_store(store, 5) == [] and restored(store, tmp_path / "d2", 5) == tree(b)
    # The replaced attempt's data is left to retention, never deleted by a drain.
    old = keys.data_key(5, 0, "model.bin", before.attempt)
    assert store.head(old) is not None


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_pushes_of_different_content_end_consistent(
        store: Store, tmp_path: Path, request: pytest.FixtureRequest, round_: int) -> None:
    sources = [checkpoint(tmp_path / f"w{i}" / "step-9", seed=10 * round_ + i, big=7 * MiB)
               for i in range(2)]
    procs = [cli(store, request, "push", str(src), store.uri, "--part-size", "5MiB", "-q")
             for src in sources]
    codes = []
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode in (0, 6), err.decode()
        codes.append(proc.returncode)
    assert 0 in codes
    listed = scan(store)
    assert [c.step for c in listed.complete] == [9]
    assert verify_store(store, 9) == []
    assert restored(store, tmp_path / "dest", 9) in [tree(s) for s in sources]


def test_resume_after_kill_between_completion_and_journal_sends_nothing_again(
        store: Store, tmp_path: Path) -> None:
    """The kill lands right after CompleteMultipartUpload or a single PUT made
    an object, before the journal recorded it."""
    src = checkpoint(tmp_path / "step-6", seed=5)

    class Killed(BaseException):
        pass

    class KillAfter(Sent):
        def __init__(self, inner: Store, method: str) -> None:
            super().__init__(inner)
            self.method, self.victim = method, ""

        def complete_multipart(self, key: str, upload_id: str, parts: Any) -> None:
            self.inner.complete_multipart(key, upload_id, parts)
            if self.method == "complete_multipart":
                self.victim = key
                raise Killed

        def put_bytes(self, key: str, data: bytes, crc32c: int | None = None) -> None:
            super().put_bytes(key, data, crc32c)
            if self.method == "put_bytes" and key.startswith(keys.DATA) and not self.victim:
                self.victim = key
                raise Killed

    for method in ("complete_multipart", "put_bytes"):
        step = 6 if method == "complete_multipart" else 7
        journal = tmp_path / f"j-{method}"
        killer = KillAfter(store, method)
        with pytest.raises(Killed):
            drain(killer, src, step, journal, concurrency=1)
        assert killer.victim and store.head(killer.victim) is not None
        state = jr.load(journal)
        assert state is not None
        assert not any(f.complete for f in state.files.values() if f.key == killer.victim)

        sent = Sent(store)
        result = drain(sent, src, step, journal)
        assert killer.victim not in sent.keys  # checked in the store, not sent again
        size = store.head(killer.victim).size  # type: ignore[union-attr]
        assert result.resumed_bytes >= size
        assert verify_store(store, step) == []


class _Stop(Exception):
    pass


def _stop() -> None:
    raise _Stop


def test_drain_aborts_only_its_own_attempts_stale_uploads(
        store: Store, tmp_path: Path) -> None:
    """A drain's housekeeping aborts unowned uploads of its own attempt only:
    another attempt's upload, however old, may be a concurrent push's live
    upload of one big file; retention removes it once past its grace."""
    from ckptdrain.transfer.prune import prune_writer

    src = checkpoint(tmp_path / "step-8", seed=6, big=1 * MiB)
    prefix = keys.writer_data_prefixes(8, 0)[0]  # the spread layout drains write
    other_key = keys.data_key(8, 0, "big.bin", keys.new_attempt())
    other = store.create_multipart(other_key)
    store.upload_part(other_key, other, 1, b"x" * 1000)
    with pytest.raises(_Stop):  # killed before its commit; its journal names its attempt
        Drainer(store, part_size=PART).drain(
            src, build_manifest(src, 8, 0, 1, created=1.0), journal_path=tmp_path / "j1",
            before_commit=_stop)
    attempt = jr.load(tmp_path / "j1").attempt  # type: ignore[union-attr]
    leaked_key = keys.data_key(8, 0, "leaked.bin", attempt)
    leaked = store.create_multipart(leaked_key)  # its own, but the journal never saw it
    Drainer(store, part_size=PART, stale_after=0.0).drain(
        src, build_manifest(src, 8, 0, 1, created=1.0), journal_path=tmp_path / "j1")
    assert [(u.key, u.upload_id) for u in store.list_multipart_uploads(prefix)] == [
        (other_key, other)]
    assert leaked not in {u.upload_id for u in store.list_multipart_uploads(leaked_key)}
    store.upload_part(other_key, other, 2, b"y" * 1000)  # the other push goes on
    assert verify_store(store, 8) == []
    prune_writer(store, writer=0, keep=1, now=time.time() + 7 * 3600)
    assert store.list_multipart_uploads(prefix) == []
    assert verify_store(store, 8) == []


def test_prune_between_resume_and_commit_never_commits_missing_data(
        store: Store, tmp_path: Path) -> None:
    """A drain killed before its manifest and resumed after the orphan grace
    has old objects; a prune between the resume's checks and the manifest PUT
    removes them. The drain must see that and not commit; a retry re-sends."""
    from ckptdrain.errors import StoreError
    from ckptdrain.transfer.prune import prune_writer

    src = checkpoint(tmp_path / "step-5", seed=21, big=6 * MiB)
    manifest = build_manifest(src, 5, 0, 1, created=1.0)
    journal = tmp_path / "j"
    with pytest.raises(_Stop):
        Drainer(store, part_size=PART).drain(src, manifest, journal_path=journal,
                                             before_commit=_stop)
    later = time.time() + 7 * 3600  # the resume comes past the grace period

    def prune() -> None:
        prune_writer(store, writer=0, keep=1, now=later)

    with pytest.raises(StoreError, match="vanished before the commit"):
        Drainer(store, part_size=PART).drain(src, manifest, journal_path=journal,
                                             before_commit=prune)
    assert store.head(keys.manifest_key(5, 0)) is None
    assert [c.step for c in complete_steps(store)] == []
    result = Drainer(store, part_size=PART).drain(src, manifest, journal_path=journal)
    assert result.sent_bytes == manifest.total_bytes  # every file sent again
    assert [c.step for c in complete_steps(store)] == [5]
    assert verify_store(store, 5) == []


def test_conflict_is_an_error_of_its_own(store: Store, tmp_path: Path) -> None:
    drain(store, checkpoint(tmp_path / "a", seed=8, big=1000), 2, tmp_path / "j1")
    with pytest.raises(CommitConflict) as caught:
        drain(store, checkpoint(tmp_path / "b", seed=9, big=1000), 2, tmp_path / "j2")
    assert caught.value.exit_code == 6


def test_push_refuses_a_part_size_below_the_floor(
        store: Store, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    src = checkpoint(tmp_path / "step-4", seed=11, big=3 * MiB)
    floor = "5MiB" if isinstance(store, S3Store | GcsStore) else "1MiB"
    code, _, err = run(store, request, "push", str(src), store.uri, "--part-size", "1")
    assert code == 2 and "--part-size" in err and floor in err and "Traceback" not in err
    assert len(err.splitlines()) == 1
    code, _, err = run(store, request, "push", str(src), store.uri, "--part-size", "2MiB", "-q")
    if isinstance(store, S3Store | GcsStore):  # the store's own floor: no part under 5 MiB
        assert code == 2 and "--part-size" in err and "5MiB" in err
    else:
        assert code == 0, err
        assert {f.part_size for f in load_checkpoint(store, 4).manifests[0].files} == {2 * MiB}
    assert scan(store).rejected == []


@pytest.mark.parametrize("journal_survives", [True, False])
def test_killed_pushes_to_a_file_store_leave_nothing_once_swept(
        tmp_path: Path, journal_survives: bool) -> None:
    from ckptdrain.store.local import LocalStore
    from ckptdrain.transfer.prune import prune_writer

    root = tmp_path / "store"
    store = LocalStore(root)
    src = checkpoint(tmp_path / "step-2", seed=12, big=20 * MiB, shards=6)
    journal = tmp_path / "journal"
    for _ in range(3):  # killed mid-upload, three times over
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckptdrain", "push", str(src), store.uri, "--rate", "40MB/s",
             "--part-size", "1MiB", "--concurrency", "4", "--journal", str(journal), "-q"],
            stderr=subprocess.PIPE)
        while True:
            state = jr.load(journal)
            if state is not None and sum(len(f.parts) for f in state.files.values()) >= 3:
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        if not journal_survives:
            journal.unlink()
    # What killed writers leave in flight looks like this, too: a put cut
    # before its rename, an upload cut before its key was written.
    (root / "manifests" / "x").mkdir(parents=True, exist_ok=True)
    (root / "manifests" / "x" / ".ckptdrain-tmp-cut").write_bytes(b"x" * 4096)
    (root / ".ckptdrain-multipart" / ("a" * 32)).mkdir(parents=True, exist_ok=True)
    an_hour_ago = time.time() - 2 * 3600
    for path in root.rglob("*"):
        os.utime(path, (an_hour_ago, an_hour_ago), follow_symlinks=False)

    drain(store, src, 2, journal)
    prune_writer(store, writer=0, keep=1, now=time.time() + 7 * 3600)
    reserved = [p for p in root.rglob("*") if p.name.startswith((".ckptdrain-tmp-", "trash-"))
                or (p.parent.name == ".ckptdrain-multipart")]
    assert reserved == []
    current = load_checkpoint(store, 2).manifests[0]
    expected = {keys.data_key(2, 0, f.path, current.attempt) for f in current.files}
    assert {i.key for i in store.list(keys.DATA)} == expected
    assert verify_store(store, 2) == [] and restored(store, tmp_path / "dest", 2) == tree(src)
