"""Global retention against real stores: each writer prunes only its own
objects, and a half-pruned step is never seen as complete."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ckptdrain import keys
from ckptdrain.store.base import Store
from ckptdrain.transfer.catalog import complete_steps
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.prune import prune_writer
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration


def _push(store: Store, tmp: Path, step: int, writer: int, writers: int) -> None:
    src = tmp / f"src-{step}-{writer}"
    (src / "opt").mkdir(parents=True)
    (src / "model.bin").write_bytes(bytes([step % 251, writer]) * 3000)
    (src / "opt" / "state.bin").write_bytes(bytes([writer]) * 1000)
    manifest = build_manifest(src, step, writer, writers, created=float(step))
    Drainer(store, part_size=5 << 20, concurrency=2).drain(
        src, manifest, journal_path=tmp / f"journal-{step}-{writer}.json")


def test_each_writer_prunes_its_own_and_the_newest_stay_complete(
        store: Store, tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        for writer in (0, 1):
            _push(store, tmp_path, step, writer, writers=2)
    _push(store, tmp_path, 50, 0, writers=2)  # newest, still draining on writer 1

    assert prune_writer(store, writer=0, keep=2) == [10, 20]
    # Writer 0's manifests went first: steps 10 and 20 are no longer complete,
    # although writer 1's objects are still there.
    assert [c.step for c in complete_steps(store)] == [40, 30]
    assert store.head(keys.manifest_key(10, 1)) is not None
    assert not any(list(store.list(p)) for p in keys.writer_data_prefixes(10, 0))
    assert any(list(store.list(p)) for p in keys.writer_data_prefixes(10, 1))

    assert prune_writer(store, writer=1, keep=2) == [10, 20]
    assert not any(list(store.list(p)) for w in (0, 1) for p in keys.writer_data_prefixes(20, w))
    assert not list(store.list(keys.step_manifests_prefix(10)))
    # The incomplete newer step is untouched.
    assert store.head(keys.manifest_key(50, 0)) is not None
    assert [c.step for c in complete_steps(store)] == [40, 30]


def test_nothing_is_pruned_before_keep_steps_are_complete(store: Store, tmp_path: Path) -> None:
    _push(store, tmp_path, 1, 0, writers=1)
    _push(store, tmp_path, 2, 0, writers=1)
    assert prune_writer(store, writer=0, keep=3) == []
    assert [c.step for c in complete_steps(store)] == [2, 1]


def test_data_that_no_manifest_names_is_pruned_too(store: Store, tmp_path: Path) -> None:
    """A drain superseded before its manifest was written leaves orphan data."""
    orphan = keys.data_key(5, 0, "model.bin", keys.new_attempt())
    store.put_bytes(orphan, b"orphan of a superseded drain")
    theirs = keys.data_key(5, 1, "model.bin", keys.new_attempt())
    store.put_bytes(theirs, b"another writer's: not ours to delete")
    for step in (10, 20):
        _push(store, tmp_path, step, 0, writers=1)
    assert prune_writer(store, writer=0, keep=2) == [5]
    assert store.head(orphan) is None
    assert store.head(theirs) is not None


def test_orphaned_attempts_go_after_the_grace_period_and_the_current_one_stays(
        store: Store, tmp_path: Path) -> None:
    """A replaced attempt and a killed one are orphans: kept while young (a
    restore may be reading the replaced one), removed once old; the attempt
    the manifest names is never touched."""
    from ckptdrain.transfer.catalog import load_checkpoint
    from ckptdrain.transfer.fetch import verify_store

    src = tmp_path / "a"
    src.mkdir()
    (src / "model.bin").write_bytes(b"first" * 1000)
    first = build_manifest(src, 7, 0, 1, created=1.0)
    Drainer(store).drain(src, first, journal_path=tmp_path / "j1")
    replaced = load_checkpoint(store, 7).manifests[0].attempt
    (src / "model.bin").write_bytes(b"second" * 1000)
    second = build_manifest(src, 7, 0, 1, created=2.0)
    Drainer(store).drain(src, second, journal_path=tmp_path / "j2", replace=True)
    current = load_checkpoint(store, 7).manifests[0].attempt
    killed = keys.data_key(7, 0, "model.bin", keys.new_attempt())
    store.put_bytes(killed, b"a killed attempt's")
    theirs = keys.data_key(7, 1, "model.bin", keys.new_attempt())
    store.put_bytes(theirs, b"writer 1's")

    spread_prefix = keys.writer_data_prefixes(7, 0)[0]  # where drains put data now

    def attempt_of(key: str) -> str:
        return key.removeprefix(spread_prefix).split("/")[0]

    def attempts() -> set[str]:
        return {attempt_of(i.key) for i in store.list(spread_prefix)}

    assert prune_writer(store, writer=0, keep=1) == []
    assert attempts() == {replaced, current, attempt_of(killed)}
    later = time.time() + 7 * 3600  # past the grace period
    assert prune_writer(store, writer=0, keep=1, now=later) == []
    assert attempts() == {current}
    assert verify_store(store, 7) == [] and store.head(theirs) is not None


def test_stale_unfinished_uploads_of_the_writer_are_aborted(store: Store) -> None:
    mine = keys.data_key(3, 0, "model.bin", keys.new_attempt())
    theirs = keys.data_key(3, 1, "model.bin", keys.new_attempt())
    ids = {key: store.create_multipart(key) for key in (mine, theirs)}
    prune_writer(store, writer=0, keep=1)
    assert len(store.list_multipart_uploads(keys.DATA)) == 2  # young: maybe live
    prune_writer(store, writer=0, keep=1, now=time.time() + 7 * 3600)
    assert [u.key for u in store.list_multipart_uploads(keys.DATA)] == [theirs]
    store.abort_multipart(theirs, ids[theirs])


def test_orphans_are_judged_per_attempt_not_per_object(tmp_path: Path) -> None:
    """An attempt killed before its manifest and resumed much later has old
    objects beside new ones, or an upload still under way: none of it is an
    orphan yet. An attempt wholly old and idle is."""
    import os

    from ckptdrain.store.local import LocalStore

    store = LocalStore(tmp_path / "store")
    long_ago = time.time() - 7 * 3600

    def put(attempt: str, path: str, old: bool) -> str:
        key = keys.data_key(4, 0, path, attempt)
        store.put_bytes(key, path.encode())
        if old:
            os.utime(store.root.joinpath(*key.split("/")), (long_ago, long_ago))
        return key

    mixed, uploading, idle = keys.new_attempt(), keys.new_attempt(), keys.new_attempt()
    kept = [put(mixed, "a.bin", old=True), put(mixed, "b.bin", old=False),
            put(uploading, "a.bin", old=True)]
    upload_key = keys.data_key(4, 0, "big.bin", uploading)
    upload = store.create_multipart(upload_key)  # young: the attempt is still at work
    gone = [put(idle, "a.bin", old=True), put(idle, "b.bin", old=True)]
    assert prune_writer(store, writer=0, keep=1) == []
    assert all(store.head(k) is not None for k in kept)
    assert all(store.head(k) is None for k in gone)
    assert [u.upload_id for u in store.list_multipart_uploads(upload_key)] == [upload]


def test_an_unfinished_upload_is_judged_by_its_newest_part(store: Store) -> None:
    """A huge file sent slowly: its upload began longer ago than the grace
    period, but a part arrived lately, so it is alive and stays. One whose
    only part is as old as it is goes. (A short grace period stands in for
    hours; the times compared are the store's own.)"""
    alive = keys.data_key(6, 0, "huge.bin", keys.new_attempt())
    idle = keys.data_key(6, 0, "left.bin", keys.new_attempt())
    ids = {key: store.create_multipart(key) for key in (alive, idle)}
    store.upload_part(idle, ids[idle], 1, b"old part")
    time.sleep(6.0)  # both initiations, and the idle part, now older than the grace
    store.upload_part(alive, ids[alive], 1, b"recent part")
    parts = store.list_parts(alive, ids[alive])
    assert parts is not None and parts[0].modified is not None
    assert prune_writer(store, writer=0, keep=1, grace=4.0, now=time.time()) == []
    assert [u.key for u in store.list_multipart_uploads(keys.DATA)] == [alive]
    store.abort_multipart(alive, ids[alive])
