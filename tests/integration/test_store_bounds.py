"""Reads whose size the reader bounds, against real stores: a whole-object
read with a limit refuses a larger object before reading it, and a ranged
read takes only the range it asked for, whatever the server answers.

Misbehaving answers come from tests/support/misreader.py: a loopback front
that serves a real SeaweedFS or MinIO object the wrong way (range ignored,
shifted, or a body longer than announced).
"""

from __future__ import annotations

import os
import random
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.misreader import Misreader
from tests.support.s3servers import S3Server

from ckptdrain import keys
from ckptdrain import manifest as manifest_mod
from ckptdrain.errors import CommitConflict, ObjectTooLarge, StoreError
from ckptdrain.store.base import Store
from ckptdrain.store.local import LocalStore
from ckptdrain.store.s3 import S3Store
from ckptdrain.transfer import catalog, commit, prune
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration
MiB = 1 << 20


def _peak(call: Callable[[], object]) -> int:
    """Peak bytes Python allocated while `call` ran (whatever it raised)."""
    tracemalloc.start()
    try:
        call()
    except Exception:  # the caller asserts on the error separately
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def _front_store(server: S3Server, area: tuple[str, str], url: str) -> S3Store:
    bucket, prefix = area
    return S3Store(bucket, prefix, endpoint_url=url, region=server.region,
                   access_key=server.access_key, secret_key=server.secret_key, max_attempts=1)


# Whole objects with a limit ---------------------------------------------------------
def test_a_limited_read_refuses_a_larger_object_unread(store: Store) -> None:
    data = random.Random(1).randbytes(4 * MiB)
    store.put_bytes("big/obj", data)
    with pytest.raises(ObjectTooLarge, match="big/obj"):
        store.get_bytes("big/obj", limit=1024)
    assert _peak(lambda: store.get_bytes("big/obj", limit=1024)) < MiB
    assert store.get_bytes("big/obj", limit=len(data)) == data  # the limit itself is fine
    assert store.get_bytes("big/obj") == data  # no limit: as before


def test_a_limited_read_of_a_sparse_huge_file_costs_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put_bytes("huge", b"")
    os.truncate(store.root / "huge", 8 << 30)  # 8 GiB, no disk used
    assert _peak(lambda: store.get_bytes("huge", limit=MiB)) < MiB
    with pytest.raises(ObjectTooLarge):
        store.get_bytes("huge", limit=MiB)


def test_a_limited_read_stops_at_the_limit_when_no_size_is_announced(
        s3server: S3Server, s3area: tuple[str, str]) -> None:
    """A chunked body announces no size: the read stops after limit + 1 bytes."""
    data = random.Random(2).randbytes(8 * MiB)
    s3server.open_store(*s3area).put_bytes("big/obj", data)
    with Misreader(s3server, "chunked") as front:
        store = _front_store(s3server, s3area, front.endpoint_url)
        with pytest.raises(ObjectTooLarge):
            store.get_bytes("big/obj", limit=1024)
        assert _peak(lambda: store.get_bytes("big/obj", limit=1024)) < 2 * MiB
        assert store.get_bytes("big/obj", limit=len(data)) == data


# Ranged reads against a server that answers wrongly ------------------------------------
@pytest.fixture
def s3object(s3server: S3Server, s3area: tuple[str, str]) -> Iterator[bytes]:
    data = random.Random(3).randbytes(8 * MiB)
    s3server.open_store(*s3area).put_bytes("r/obj", data)
    yield data


def _get_range(store: S3Store, start: int, length: int) -> bytes:
    return store.get_range("r/obj", start, length)


def _get_range_into(store: S3Store, start: int, length: int) -> bytes:
    buffer = bytearray(length)
    got = store.get_range_into("r/obj", start, memoryview(buffer))
    return bytes(buffer[:got])


READERS = {"get_range": _get_range, "get_range_into": _get_range_into}


@pytest.mark.parametrize("reader", list(READERS))
def test_an_honest_front_serves_the_range(s3server: S3Server, s3area: tuple[str, str],
                                          s3object: bytes, reader: str) -> None:
    """The front itself is no fault: answered properly, ranges read right."""
    with Misreader(s3server, "honest") as front:
        store = _front_store(s3server, s3area, front.endpoint_url)
        assert READERS[reader](store, 4096, 1000) == s3object[4096:5096]
        assert READERS[reader](store, len(s3object) - 10, 1000) == s3object[-10:]


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("mode", ["ignore-range", "shift", "short", "chunked"])
@pytest.mark.parametrize("start", [0, 4096])
def test_a_wrong_answer_to_a_range_is_refused_unread(
        s3server: S3Server, s3area: tuple[str, str], s3object: bytes,
        reader: str, mode: str, start: int) -> None:
    with Misreader(s3server, mode) as front:
        store = _front_store(s3server, s3area, front.endpoint_url)
        with pytest.raises(StoreError, match="r/obj"):
            READERS[reader](store, start, 1000)
        assert _peak(lambda: READERS[reader](store, start, 1000)) < 2 * MiB


def test_a_whole_object_that_fits_the_range_is_its_answer(
        s3server: S3Server, s3area: tuple[str, str]) -> None:
    """A server without range support answers 200 with the whole object: right
    for a range from 0 that covers it, refused for any other."""
    s3server.open_store(*s3area).put_bytes("r/small", b"0123456789")
    with Misreader(s3server, "ignore-range") as front:
        store = _front_store(s3server, s3area, front.endpoint_url)
        assert store.get_range("r/small", 0, 100) == b"0123456789"
        with pytest.raises(StoreError):
            store.get_range("r/small", 2, 100)
        with pytest.raises(StoreError):
            store.get_range("r/small", 0, 5)


# Manifests larger than any manifest may be ---------------------------------------------
def _good_step(store: Store, tmp: Path, step: int) -> bytes:
    src = tmp / f"src-{step}"
    src.mkdir()
    data = os.urandom(64 * 1024)
    (src / "a.bin").write_bytes(data)
    manifest = build_manifest(src, step, 0, 1, created=time.time())
    Drainer(store, part_size=5 * MiB).drain(src, manifest, journal_path=tmp / f"j{step}")
    return data


def test_an_oversized_manifest_is_an_integrity_problem_of_its_step(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit lowered to 64 KiB so a 1 MiB object exceeds it on every store."""
    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", 64 * 1024)
    good = _good_step(store, tmp_path, 8)
    store.put_bytes(keys.manifest_key(9, 0), b"{" + b" " * MiB + b"}")
    found = catalog.scan(store)
    assert [c.step for c in found.complete] == [8]
    assert [r.step for r in found.rejected] == [9] and "65536" in found.rejected[0].reason
    got = fetch(store, tmp_path / "dest")
    assert got.step == 8 and (tmp_path / "dest" / "a.bin").read_bytes() == good
    # A push to step 9 refuses to treat it as its own; retention leaves it be.
    src = tmp_path / "src-8"
    with pytest.raises(CommitConflict, match="unreadable"):
        commit.committed(store, build_manifest(src, 9, 0, 1, created=1.0), replace=False)
    assert prune.current_keys(store, 9, 0) is None


def test_a_multi_gb_manifest_costs_no_memory(tmp_path: Path) -> None:
    """At the real limit: an 8 GiB (sparse) object at a manifest key."""
    store = LocalStore(tmp_path / "s")
    _good_step(store, tmp_path, 8)
    store.put_bytes(keys.manifest_key(9, 0), b"")
    os.truncate(store.root.joinpath(*keys.manifest_key(9, 0).split("/")), 8 << 30)
    peak = _peak(lambda: catalog.scan(store))
    found = catalog.scan(store)
    assert [c.step for c in found.complete] == [8] and [r.step for r in found.rejected] == [9]
    assert peak < 16 * MiB
