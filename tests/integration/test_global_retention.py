"""Global retention against real stores: each writer prunes only its own
objects, and a half-pruned step is never seen as complete."""

from __future__ import annotations

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
    assert not list(store.list(keys.writer_data_prefix(10, 0)))
    assert list(store.list(keys.writer_data_prefix(10, 1)))

    assert prune_writer(store, writer=1, keep=2) == [10, 20]
    assert not list(store.list(keys.step_data_prefix(20)))
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
