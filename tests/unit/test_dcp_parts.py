"""Which parts a DCP read plan's ranges touch, on a real file:// store (small parts)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from ckptdrain.dcp.verified import VerifiedFiles
from ckptdrain.errors import IntegrityError
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.catalog import load_checkpoint
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest

PART = 10_000


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    source = tmp_path / "src"
    source.mkdir()
    (source / "data.bin").write_bytes(os.urandom(3 * PART + 17))  # 4 parts, the last 17 bytes
    (source / "empty").write_bytes(b"")
    store = LocalStore(tmp_path / "store")
    Drainer(store, part_size=PART).drain(
        source, build_manifest(source, 1, 0, 1, created=time.time()),
        journal_path=tmp_path / "journal", cancel=threading.Event())
    return store


def _files(store: LocalStore, root: Path) -> VerifiedFiles:
    root.mkdir()
    return VerifiedFiles(store, load_checkpoint(store, 1), root)


@pytest.mark.parametrize(("ranges", "parts"), [
    ([(0, PART)], 1),                        # exactly the first part
    ([(PART - 1, 2)], 2),                    # one byte either side of a boundary
    ([(3 * PART, 17)], 1),                   # the short last part
    ([(5, 0)], 0),                           # an empty range needs nothing
    ([(0, 1), (2 * PART + 3, 4)], 2),        # two ranges, two parts
    ([(0, 3 * PART + 17)], 4),               # the whole file
])
def test_a_range_fetches_the_parts_under_it(store: LocalStore, tmp_path: Path,
                                            ranges: list[tuple[int, int]], parts: int) -> None:
    files = _files(store, tmp_path / "r")
    files.ensure_ranges({"data.bin": ranges})
    assert files.stats.parts == parts
    source = (tmp_path / "src" / "data.bin").read_bytes()
    with open(tmp_path / "r" / "data.bin", "rb") as f:
        for offset, length in ranges:
            f.seek(offset)
            assert f.read(length) == source[offset:offset + length]


def test_a_part_is_fetched_once(store: LocalStore, tmp_path: Path) -> None:
    files = _files(store, tmp_path / "r")
    files.ensure_ranges({"data.bin": [(10, 10)]})
    files.ensure_ranges({"data.bin": [(20, 10), (PART + 1, 1)]})
    assert (files.stats.parts, files.stats.global_bytes) == (2, 2 * PART)


def test_a_range_past_the_end_is_refused(store: LocalStore, tmp_path: Path) -> None:
    with pytest.raises(IntegrityError, match=r"asks for bytes .* of 'data.bin', which has"):
        _files(store, tmp_path / "r").ensure_ranges({"data.bin": [(3 * PART, 18)]})


def test_an_empty_file_and_a_whole_file(store: LocalStore, tmp_path: Path) -> None:
    files = _files(store, tmp_path / "r")
    files.ensure(["empty", "data.bin"])
    assert (tmp_path / "r" / "empty").read_bytes() == b""
    source = (tmp_path / "src" / "data.bin").read_bytes()
    assert (tmp_path / "r" / "data.bin").read_bytes() == source
