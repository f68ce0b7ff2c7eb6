"""Cold storage on real S3 servers: a writer's data of complete checkpoints
older than the newest K moves to a colder class in place, restore reads it
verified as before, and a store that cannot move an object leaves it whole.

MinIO takes REDUCED_REDUNDANCY (the one class besides STANDARD it serves);
SeaweedFS refuses any copy of an object onto itself, which is how S3 changes
a class, so it is where the failure path is proven. On the GCS API server
(fake-gcs-server) a move is a rewrite onto the same name: it records no
class, so what is proven there is the rewrite itself (a new generation of
the same bytes, asked for in the class), restore after it, and the checks
on what the rewrite reports."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.gcsserver import GcsServer
from tests.support.s3servers import S3Server

from ckptdrain import checksum, keys
from ckptdrain.errors import GenerationChanged, IntegrityError, StoreError
from ckptdrain.store.gcs import GcsStore
from ckptdrain.store.s3 import S3Store
from ckptdrain.transfer.catalog import complete_steps
from ckptdrain.transfer.cooling import cool_writer
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.prune import prune_writer
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration

COLD = "REDUCED_REDUNDANCY"


def _push(store: S3Store | GcsStore, tmp: Path, step: int, writer: int, writers: int) -> None:
    src = tmp / f"src-{step}-{writer}"
    (src / "opt").mkdir(parents=True)
    (src / "model.bin").write_bytes(bytes([step % 251, writer]) * 300_000)
    (src / "opt" / "state.bin").write_bytes(bytes([writer, step % 251]) * 1000)
    manifest = build_manifest(src, step, writer, writers, created=float(step))
    Drainer(store, part_size=5 << 20, concurrency=2).drain(
        src, manifest, journal_path=tmp / f"journal-{step}-{writer}.json")


def _store(server: S3Server | GcsServer, buckets: dict[str, str]
           ) -> Iterator[S3Store | GcsStore]:
    if server.name not in buckets:
        buckets[server.name] = server.create_bucket()
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    try:
        yield server.open_store(buckets[server.name], prefix)
    finally:
        server.delete_prefix(buckets[server.name], prefix + "/")


@pytest.fixture
def minio_store(minio: S3Server, _session_buckets: dict[str, str]) -> Iterator[S3Store]:
    yield from _store(minio, _session_buckets)  # type: ignore[misc]


@pytest.fixture
def gcs_store(gcs: GcsServer, _session_buckets: dict[str, str]) -> Iterator[GcsStore]:
    yield from _store(gcs, _session_buckets)  # type: ignore[misc]


@pytest.fixture
def seaweed_store(seaweedfs: S3Server, _session_buckets: dict[str, str]) -> Iterator[S3Store]:
    yield from _store(seaweedfs, _session_buckets)  # type: ignore[misc]


def _classes(store: S3Store, step: int, writer: int) -> set[str | None]:
    return {i.storage_class for p in keys.writer_data_prefixes(step, writer)
            for i in store.list(p)}


def test_older_steps_move_in_place_and_restore_reads_them(
        minio_store: S3Store, tmp_path: Path) -> None:
    store = minio_store
    for step in (10, 20, 30):
        for writer in (0, 1):
            _push(store, tmp_path, step, writer, writers=2)
    _push(store, tmp_path, 40, 0, writers=2)  # newest, writer 1 still draining

    cooled = cool_writer(store, 0, hot=1, storage_class=COLD)
    assert cooled.steps == (10, 20)
    assert cooled.objects == 4 and cooled.bytes == 2 * (600_000 + 2000)
    # Writer 0's older steps moved; its newest complete one, its incomplete
    # one, the other writer's objects and every manifest did not.
    assert _classes(store, 10, 0) == _classes(store, 20, 0) == {COLD}
    assert _classes(store, 30, 0) == _classes(store, 40, 0) == {"STANDARD"}
    assert _classes(store, 10, 1) == {"STANDARD"}
    assert {i.storage_class for i in store.list(keys.MANIFESTS)} == {"STANDARD"}

    # A second pass has nothing to do.
    assert cool_writer(store, 0, hot=1, storage_class=COLD).objects == 0

    # Restore reads a cold step as any other, every file's CRC32C verified.
    got = fetch(store, tmp_path / "dest", step=10, writer=0)
    assert got.step == 10
    assert (tmp_path / "dest" / "model.bin").read_bytes() == bytes([10, 0]) * 300_000
    # Retention is unchanged and never deletes the newest complete step.
    cool_writer(store, 1, hot=1, storage_class=COLD)
    assert prune_writer(store, writer=0, keep=2) == [10]
    assert prune_writer(store, writer=1, keep=2) == [10]
    assert [c.step for c in complete_steps(store)] == [30, 20]


def test_an_object_past_the_single_copy_limit_moves_by_multipart_copy(
        minio_store: S3Store) -> None:
    data = bytes(range(256)) * (48 * 1024)  # 12 MiB: three 5 MiB ranges
    store = minio_store
    store.put_bytes("big.bin", data)
    store.change_storage_class("big.bin", len(data), COLD,
                               single_copy_limit=5 << 20, part_size=5 << 20)
    [info] = list(store.list("big.bin"))
    assert info.storage_class == COLD and info.size == len(data)
    assert checksum.crc32c(store.get_bytes("big.bin")) == checksum.crc32c(data)
    assert store.list_multipart_uploads("big.bin") == []


def test_a_stop_between_part_copies_leaves_the_object_as_it_was(
        minio_store: S3Store) -> None:
    data = bytes(range(256)) * (48 * 1024)  # 12 MiB: three 5 MiB ranges
    store = minio_store
    store.put_bytes("big.bin", data)
    asked = iter([False, True])  # one part copied, then the agent stops
    moved = store.change_storage_class("big.bin", len(data), COLD, stopping=lambda: next(asked),
                                       single_copy_limit=5 << 20, part_size=5 << 20)
    assert moved is False
    [info] = list(store.list("big.bin"))
    assert info.storage_class != COLD
    assert store.get_bytes("big.bin") == data
    assert store.list_multipart_uploads("") == []  # the copy was aborted


def test_a_class_the_store_refuses_leaves_the_step_whole(
        minio_store: S3Store, tmp_path: Path) -> None:
    store = minio_store
    for step in (1, 2):
        _push(store, tmp_path, step, 0, writers=1)
    with pytest.raises(StoreError):
        cool_writer(store, 0, hot=1, storage_class="GLACIER_IR")  # not one MinIO serves
    assert _classes(store, 1, 0) == {"STANDARD"}
    assert fetch(store, tmp_path / "dest", step=1, writer=0).step == 1


def test_a_store_that_cannot_copy_onto_itself_fails_loudly_and_keeps_the_data(
        seaweed_store: S3Store, tmp_path: Path) -> None:
    store = seaweed_store
    for step in (1, 2):
        _push(store, tmp_path, step, 0, writers=1)
    with pytest.raises(StoreError, match="copy_object"):
        cool_writer(store, 0, hot=1, storage_class=COLD)
    assert [c.step for c in complete_steps(store)] == [2, 1]
    assert fetch(store, tmp_path / "dest", step=1, writer=0).step == 1


def test_a_pass_keeps_to_its_budget_and_ends_when_the_agent_stops(
        minio_store: S3Store, tmp_path: Path) -> None:
    store = minio_store
    for step in (1, 2, 3):
        _push(store, tmp_path, step, 0, writers=1)
    stopped = cool_writer(store, 0, hot=1, storage_class=COLD, stopping=lambda: True)
    assert (stopped.objects, stopped.finished) == (0, False)
    # Asked to yield after its first object: it ends there, that object moved.
    asked = iter([False, False, True])
    one = cool_writer(store, 0, hot=1, storage_class=COLD, stopping=lambda: next(asked, True))
    assert (one.objects, one.finished) == (1, False)
    assert _classes(store, 1, 0) == {COLD, "STANDARD"}
    first = cool_writer(store, 0, hot=1, storage_class=COLD, budget=2)
    assert (first.objects, first.finished) == (2, False)
    # Oldest first: step 1 whole, one object of step 2.
    assert _classes(store, 1, 0) == {COLD} and _classes(store, 2, 0) == {COLD, "STANDARD"}
    rest = cool_writer(store, 0, hot=1, storage_class=COLD, budget=3)
    assert (rest.objects, rest.finished) == (1, True)
    assert _classes(store, 2, 0) == {COLD} and _classes(store, 3, 0) == {"STANDARD"}


def _generations(store: GcsStore, step: int, writer: int) -> dict[str, str]:
    out = {}
    for prefix in keys.writer_data_prefixes(step, writer):
        for info in store.list(prefix):
            meta = store._stat(store._name(info.key), info.key)
            assert meta is not None
            out[info.key] = str(meta["generation"])
    return out


def test_gcs_older_steps_are_rewritten_in_the_class_and_restore_reads_them(
        gcs_store: GcsStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = gcs_store
    for step in (10, 20):
        _push(store, tmp_path, step, 0, writers=1)
    before = {step: _generations(store, step, 0) for step in (10, 20)}
    asked: list[tuple[str, str, bytes]] = []
    request = store._request

    def recorded(op: str, method: str, url: str, key: str | None, **kw: object) -> object:
        if op == "rewrite":
            asked.append((url, str(key), bytes(kw["body"])))  # type: ignore[arg-type]
        return request(op, method, url, key, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_request", recorded)
    cooled = cool_writer(store, 0, hot=1, storage_class="COLDLINE")
    assert cooled.steps == (10,) and cooled.objects == 2 and cooled.finished
    # Each object of step 10 was rewritten onto itself, in the class, pinned
    # to the generation read; step 20 (the newest) was not touched.
    assert sorted(k for _, k, _ in asked) == sorted(before[10])
    for url, key, body in asked:
        # The class, and the editable metadata a rewrite body would reset.
        assert json.loads(body) == {"storageClass": "COLDLINE",
                                    "contentType": "application/octet-stream"}
        generation = before[10][key]
        assert f"sourceGeneration={generation}" in url
        assert f"ifGenerationMatch={generation}" in url
    after = _generations(store, 10, 0)
    assert after.keys() == before[10].keys()
    assert all(after[k] != before[10][k] for k in after)  # new generations
    assert _generations(store, 20, 0) == before[20]
    # The same bytes: restore verifies every one against the manifest.
    result = fetch(store, tmp_path / "restored", step=10, writer=0)
    assert result.step == 10
    assert (tmp_path / "restored" / "model.bin").read_bytes() == bytes([10, 0]) * 300_000


def test_gcs_a_rewrite_that_reports_other_bytes_fails_loudly(
        gcs_store: GcsStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = gcs_store
    for step in (10, 20):
        _push(store, tmp_path, step, 0, writers=1)
    answer = store._json

    def lying(response: object, op: str, key: str | None) -> dict[str, object]:
        value = answer(response, op, key)  # type: ignore[arg-type]
        if op == "rewrite" and isinstance(value.get("resource"), dict):
            value["resource"]["crc32c"] = checksum.to_b64(0)
        return value

    monkeypatch.setattr(store, "_json", lying)
    with pytest.raises(IntegrityError, match="crc32c"):
        cool_writer(store, 0, hot=1, storage_class="NEARLINE")


def test_gcs_a_stop_gives_the_object_up_unchanged(gcs_store: GcsStore, tmp_path: Path) -> None:
    store = gcs_store
    for step in (10, 20):
        _push(store, tmp_path, step, 0, writers=1)
    before = _generations(store, 10, 0)
    key = sorted(before)[0]
    info = store.head(key)
    assert info is not None
    assert store.change_storage_class(key, info.size, "NEARLINE", stopping=lambda: True) is False
    assert _generations(store, 10, 0) == before
    # Within a pass: the first object moves, then the agent stops.
    calls = iter([False, False, False, True])
    cooled = cool_writer(store, 0, hot=1, storage_class="NEARLINE",
                         stopping=lambda: next(calls, True))
    assert not cooled.finished and cooled.objects == 1
    after = _generations(store, 10, 0)
    assert sum(after[k] != before[k] for k in before) == 1


def test_gcs_a_retried_rewrite_that_already_moved_the_object_is_done(
        gcs_store: GcsStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call moved it, its answer was lost, the retry finds the pinned
    generation gone (404): the live object is the same bytes in the class."""
    store = gcs_store
    _push(store, tmp_path, 10, 0, writers=1)
    key = sorted(_generations(store, 10, 0))[0]
    info = store.head(key)
    assert info is not None
    request, stat = store._request, store._stat

    def answer_lost(op: str, *args: object, **kw: object) -> object:
        response = request(op, *args, **kw)  # type: ignore[arg-type]
        return None if op == "rewrite" else response

    looks: list[int] = []

    def stat_in_class(name: str, k: str | None) -> object:
        meta = stat(name, k)
        looks.append(1)
        # The GCS API server records no class; real GCS reports the new one.
        return {**meta, "storageClass": "NEARLINE"} if meta and len(looks) > 1 else meta

    monkeypatch.setattr(store, "_request", answer_lost)
    monkeypatch.setattr(store, "_stat", stat_in_class)
    assert store.change_storage_class(key, info.size, "NEARLINE") is True


def test_gcs_a_name_written_again_meanwhile_is_left_as_it_is(
        gcs_store: GcsStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Someone writes the name between the look and the rewrite: GCS refuses
    the rewrite pinned to the old generation (412; the GCS API server does not
    check ifGenerationMatch, so its answer is injected here) and the newer
    bytes are left as they are."""
    store = gcs_store
    _push(store, tmp_path, 10, 0, writers=1)
    key = sorted(_generations(store, 10, 0))[0]
    info = store.head(key)
    assert info is not None
    request = store._request

    def precondition_failed(op: str, *args: object, **kw: object) -> object:
        if op == "rewrite":
            store.put_bytes(key, b"other bytes")
            raise GenerationChanged(f"rewrite {key}: HTTP 412")
        return request(op, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_request", precondition_failed)
    with pytest.raises(GenerationChanged, match="written again"):
        store.change_storage_class(key, info.size, "NEARLINE")
    assert store.get_bytes(key) == b"other bytes"
