"""Reads whose size the reader bounds, against real stores: a whole-object
read with a limit refuses a larger object before reading it, and a ranged
read takes only the range it asked for, whatever the server answers.

Misbehaving answers come from tests/support/misreader.py: a loopback front
that serves a real SeaweedFS or MinIO object the wrong way (range ignored,
shifted, or a body longer than announced).
"""

from __future__ import annotations

import errno
import os
import random
import resource
import signal
import socket
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.misreader import Misreader
from tests.support.s3servers import S3Server

from ckptdrain import keys
from ckptdrain import manifest as manifest_mod
from ckptdrain.errors import CommitConflict, ObjectTooLarge, StoreError, StoreUnreachable
from ckptdrain.store import splice
from ckptdrain.store.base import Store
from ckptdrain.store.local import LocalStore
from ckptdrain.store.s3 import S3Store
from ckptdrain.transfer import catalog, commit, direct_io, prune, range_fetch
from ckptdrain.transfer import fetch as fetch_mod
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


def _front_store(server: S3Server, area: tuple[str, str], url: str,
                 read_timeout: float = 60.0) -> S3Store:
    bucket, prefix = area
    return S3Store(bucket, prefix, endpoint_url=url, region=server.region,
                   access_key=server.access_key, secret_key=server.secret_key, max_attempts=1,
                   read_timeout=read_timeout)


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


def _get_range_to_file(store: S3Store, start: int, length: int) -> bytes:
    """Through a file, at an offset: what a restore from a plain HTTP
    endpoint does (spliced from the socket)."""
    with tempfile.TemporaryFile() as f:
        got = store.get_range_to_file("r/obj", start, length, f.fileno(), 12345)
        assert os.fstat(f.fileno()).st_size in (0, 12345 + got)
        return os.pread(f.fileno(), got, 12345)


def _get_range_through(store: S3Store, start: int, length: int) -> bytes:
    """Through a 64 KiB buffer, a piece at a time: what a restore that
    writes by direct I/O does. Every piece but the last fills the buffer."""
    pieces: list[bytes] = []
    got = store.get_range_through("r/obj", start, length, memoryview(bytearray(64 << 10)),
                                  lambda piece: pieces.append(bytes(piece)))
    assert all(len(p) == 64 << 10 for p in pieces[:-1]) and all(pieces)
    assert got == sum(map(len, pieces))
    return b"".join(pieces)


READERS = {"get_range": _get_range, "get_range_into": _get_range_into,
           "get_range_through": _get_range_through, "get_range_to_file": _get_range_to_file}
STREAMING = ["get_range_into", "get_range_through", "get_range_to_file"]


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


@pytest.mark.parametrize("reader", STREAMING)
def test_a_body_cut_midway_is_the_stores_failure_not_short_data(
        s3server: S3Server, s3area: tuple[str, str], s3object: bytes, reader: str) -> None:
    with Misreader(s3server, "cut") as front:
        store = _front_store(s3server, s3area, front.endpoint_url)
        with pytest.raises(StoreUnreachable, match="r/obj"):
            READERS[reader](store, 4096, 4 * MiB)
        # The connection it broke is not handed to the next read of this store.
        front.mode = "honest"
        for _ in range(3):
            assert READERS[reader](store, 0, 3 * MiB) == s3object[:3 * MiB]


@pytest.mark.parametrize("reader", STREAMING)
def test_a_body_that_stops_coming_fails_within_the_read_timeout(
        s3server: S3Server, s3area: tuple[str, str], s3object: bytes, reader: str) -> None:
    with Misreader(s3server, "stall") as front:
        store = _front_store(s3server, s3area, front.endpoint_url, read_timeout=1.0)
        started = time.monotonic()
        with pytest.raises(StoreUnreachable, match="r/obj"):
            READERS[reader](store, 0, 4 * MiB)
        assert time.monotonic() - started < 15
        assert 0 < front.sent < 4 * MiB
        front.mode = "honest"
        assert READERS[reader](store, 5, 2 * MiB) == s3object[5:5 + 2 * MiB]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_plain_http_read_into_a_file_is_spliced_many_times_over_one_pool(
        s3server: S3Server, s3area: tuple[str, str], s3object: bytes,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The body goes socket → pipe → file; every read leaves the pool fit for
    the next (its connection closed, its slot returned), and the pipes it
    used are reused, not leaked."""
    store = s3server.open_store(*s3area)
    assert store.splices is True
    spliced: list[int] = []
    real = splice.socket_to_file

    def counting(sock: socket.socket, fd: int, offset: int, count: int) -> int:
        spliced.append(count)
        return real(sock, fd, offset, count)

    monkeypatch.setattr(splice, "socket_to_file", counting)
    open_fds = _open_fds()
    with tempfile.TemporaryFile() as f:
        for n in range(40):
            start = n * 97 * 1024
            assert store.get_range_to_file("r/obj", start, MiB, f.fileno(), 0) == MiB
            assert os.pread(f.fileno(), MiB, 0) == s3object[start:start + MiB]
    assert len(spliced) == 40
    assert _open_fds() <= open_fds + 4  # one pipe, a connection


@pytest.mark.parametrize("reader", STREAMING)
def test_ranges_read_to_their_end_reuse_one_connection(
        s3server: S3Server, s3area: tuple[str, str], s3object: bytes, reader: str) -> None:
    """A spliced body read to its end leaves its connection for the next GET,
    as a buffered one does: not a new connection (and a port in TIME_WAIT)
    per range."""
    with Misreader(s3server, "honest") as front:
        store = _front_store(s3server, s3area, front.endpoint_url)
        for n in range(20):
            start = n * 300 * 1024
            assert READERS[reader](store, start, MiB) == s3object[start:start + MiB]
        assert front.connections == 1


@pytest.mark.parametrize("side", ["socket", "file"])
def test_where_splicing_is_refused_the_rest_is_copied_in_order(
        s3server: S3Server, s3area: tuple[str, str], s3object: bytes,
        monkeypatch: pytest.MonkeyPatch, side: str) -> None:
    """A kernel, sandbox or filesystem that refuses splice (EINVAL, ENOSYS,
    EPERM): the range still lands whole and right, copied, and the process
    stops trying to splice."""
    real_splice = os.splice
    refusals: list[str] = []

    def refusing(src: int, dst: int, count: int, offset_src: int | None = None,
                 offset_dst: int | None = None, flags: int = 0) -> int:
        into_file = offset_dst is not None
        if (side == "file") == into_file:
            refusals.append(side)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_splice(src, dst, count, offset_src, offset_dst, flags)

    monkeypatch.setattr(os, "splice", refusing)
    monkeypatch.setattr(splice, "_refused", False)
    store = s3server.open_store(*s3area)
    with tempfile.TemporaryFile() as f:
        assert store.get_range_to_file("r/obj", 4096, 6 * MiB, f.fileno(), 100) == 6 * MiB
        assert os.pread(f.fileno(), 6 * MiB, 100) == s3object[4096:4096 + 6 * MiB]
    assert refusals == [side] and not splice.available()
    with tempfile.TemporaryFile() as f:  # from now on copied without trying
        assert store.get_range_to_file("r/obj", 0, MiB, f.fileno(), 0) == MiB
        assert os.pread(f.fileno(), MiB, 0) == s3object[:MiB]
    assert refusals == [side]


def test_a_file_that_refuses_the_bytes_mid_splice_is_the_callers_error(
        s3server: S3Server, s3area: tuple[str, str], s3object: bytes) -> None:
    """The file fails while the pipe holds bytes (here the file-size limit:
    EFBIG; in life ENOSPC or EIO): an OSError of the restore's own disk, not
    'store unreachable'; the pipe is closed, not reused; the store's next
    read works."""
    store = s3server.open_store(*s3area)
    assert store.get_range("r/obj", 0, 10) == s3object[:10]  # the pool is warm
    open_fds = _open_fds()
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        with tempfile.TemporaryFile() as f:
            resource.setrlimit(resource.RLIMIT_FSIZE, (3 * MiB // 2, hard))
            try:
                with pytest.raises(OSError) as caught:
                    store.get_range_to_file("r/obj", 0, 4 * MiB, f.fileno(), 0)
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    finally:
        signal.signal(signal.SIGXFSZ, old_handler)
    assert caught.value.errno == errno.EFBIG and not isinstance(caught.value, StoreError)
    assert _open_fds() <= open_fds + 1
    with tempfile.TemporaryFile() as f:
        assert store.get_range_to_file("r/obj", 1, 2 * MiB, f.fileno(), 0) == 2 * MiB
        assert os.pread(f.fileno(), 2 * MiB, 0) == s3object[1:1 + 2 * MiB]


@pytest.mark.parametrize("io", ["spliced", "direct"])
def test_an_object_longer_than_its_manifest_is_refused_on_the_file_paths(
        s3server: S3Server, s3area: tuple[str, str], tmp_path: Path, io: str) -> None:
    """The last range asks one byte more: a longer object is seen, its step
    skipped and the one before restored; ranges are whole 64 MiB-capped parts.
    Spliced by the store, or read through a buffer and written by direct I/O."""
    if io == "direct" and not direct_io.worthwhile(tmp_path):
        pytest.skip(f"{tmp_path} is not on a local disk")
    store = s3server.open_store(*s3area)
    assert range_fetch.to_file(store)
    good = _good_step(store, tmp_path, 8)
    _good_step(store, tmp_path, 9)
    written = catalog.load_checkpoint(store, 9).manifests[0]
    key = keys.data_key(9, 0, "a.bin", written.attempt)
    store.put_bytes(key, store.get_bytes(key) + b"!")
    got = fetch(store, tmp_path / "dest", direct_io=io == "direct")
    assert got.io == io
    assert got.step == 8 and "longer" in got.skipped[0]
    assert (tmp_path / "dest" / "a.bin").read_bytes() == good
    assert fetch_mod.range_size(64 << 20, range_fetch.MAX_FILE_RANGE) == 64 << 20
    assert fetch_mod.range_size(128 << 20, range_fetch.MAX_FILE_RANGE) == 64 << 20
    assert fetch_mod.range_size(128 << 20) == 16 << 20


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
