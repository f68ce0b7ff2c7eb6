"""Restores onto a disk write by direct I/O (transfer/direct_io.py), against
the real MinIO and SeaweedFS the tests start: every byte lands right whatever
the file's size and alignment, a longer or shorter object is still seen, a
filesystem that refuses O_DIRECT gets the page cache instead, and the disk's
own failures stay the disk's.

tmp_path is on a disk here (the suite checks it before relying on it)."""

from __future__ import annotations

import errno
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.misreader import Misreader
from tests.support.s3servers import S3Server

from ckptdrain import keys
from ckptdrain.errors import StoreUnreachable
from ckptdrain.store.s3 import S3Store
from ckptdrain.transfer import catalog, direct_io, range_fetch
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import default_concurrency, fetch
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration
MiB = 1 << 20
#: Sizes around every boundary the writes have: the alignment, the piece
#: read through the buffer, the 5 MiB parts (and so ranges) of these pushes.
SIZES = {"empty": 0, "one": 1, "under-block": 4095, "block": 4096, "over-block": 4097,
         "piece-and-tail": range_fetch.PIECE + 7, "parts": 2 * 5 * MiB + 4096 * 3 + 5}


@pytest.fixture(autouse=True)
def _fresh_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts where no filesystem refused direct I/O yet."""
    monkeypatch.setattr(direct_io, "_refused", set())


@pytest.fixture
def on_disk(tmp_path: Path) -> Path:
    if not direct_io.worthwhile(tmp_path):
        pytest.skip(f"{tmp_path} is not on a disk")
    return tmp_path


def _push(store: S3Store, tmp: Path, step: int, files: dict[str, bytes],
          part_size: int = 5 * MiB) -> None:
    src = tmp / f"src-{step}"
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    manifest = build_manifest(src, step, 0, 1, created=time.time())
    Drainer(store, part_size=part_size).drain(src, manifest, journal_path=tmp / f"j{step}")


def _aligned(files: dict[str, bytes]) -> int:
    """The bytes of `files` a restore can write by direct I/O: all but each
    file's unaligned tail."""
    return sum(len(d) - len(d) % direct_io.ALIGN for d in files.values())


def _device(path: Path) -> int:
    return os.stat(path).st_dev


def _direct_opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths opened with O_DIRECT from now on."""
    opened: list[str] = []
    real = os.open

    def spying(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real(path, flags, *args, **kwargs)
        if flags & os.O_DIRECT:
            opened.append(str(path))
        return fd

    monkeypatch.setattr(os, "open", spying)
    return opened


def test_a_restore_onto_a_disk_writes_every_size_by_direct_io(
        s3server: S3Server, s3area: tuple[str, str], on_disk: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = s3server.open_store(*s3area)
    files = {f"{name}.bin": os.urandom(size) for name, size in SIZES.items()}
    _push(store, on_disk, 3, files)
    opened = _direct_opens(monkeypatch)
    got = fetch(store, on_disk / "dest")
    assert (got.step, got.io) == (3, "direct") and not direct_io.refused(_device(on_disk))
    for name, data in files.items():
        assert (on_disk / "dest" / name).read_bytes() == data, name
    # Every byte but the files' tails went by direct I/O; files smaller than
    # a block did not even open for it.
    assert got.direct_bytes == _aligned(files) > 0
    assert {Path(p).name for p in opened} == {n for n, d in files.items()
                                              if len(d) >= direct_io.ALIGN}


def test_parts_of_a_size_no_block_divides_are_still_written_directly(
        s3server: S3Server, s3area: tuple[str, str], on_disk: Path) -> None:
    """Parts of 8MB (8,000,000 bytes) would start every range but the first
    off the alignment: the ranges are sized to it instead."""
    store = s3server.open_store(*s3area)
    files = {"a.bin": os.urandom(20_000_000 + 3)}
    _push(store, on_disk, 3, files, part_size=8_000_000)
    got = fetch(store, on_disk / "dest")
    assert got.io == "direct" and got.direct_bytes == _aligned(files)
    assert (on_disk / "dest" / "a.bin").read_bytes() == files["a.bin"]


@pytest.mark.parametrize("change", ["longer", "shorter"])
@pytest.mark.parametrize("size", [5 * MiB + 10, range_fetch.PIECE])
def test_an_object_unlike_its_manifest_is_seen_on_the_direct_path(
        s3server: S3Server, s3area: tuple[str, str], on_disk: Path, change: str,
        size: int) -> None:
    """The last range asks one byte more; with a file of exactly one piece,
    a longer object's extra byte comes as a piece of its own."""
    store = s3server.open_store(*s3area)
    good = os.urandom(size)
    _push(store, on_disk, 8, {"a.bin": good})
    _push(store, on_disk, 9, {"a.bin": os.urandom(len(good))})
    key = keys.data_key(9, 0, "a.bin", catalog.load_checkpoint(store, 9).manifests[0].attempt)
    data = store.get_bytes(key)
    store.put_bytes(key, data + b"!" if change == "longer" else data[:-1])
    got = fetch(store, on_disk / "dest")
    assert got.io == "direct" and got.step == 8 and change in got.skipped[0]
    assert (on_disk / "dest" / "a.bin").read_bytes() == good


def _refusing_direct(monkeypatch: pytest.MonkeyPatch, where: str, err: int) -> list[int]:
    """os.open (where="open") or writes to an O_DIRECT descriptor
    (where="write") fail with `err`; the calls refused are counted."""
    refused: list[int] = []
    direct_fds: set[int] = set()
    real_open, real_pwrite, real_close = os.open, os.pwrite, os.close

    def opening(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_DIRECT and where == "open":
            refused.append(flags)
            raise OSError(err, os.strerror(err))
        fd = real_open(path, flags, *args, **kwargs)
        if flags & os.O_DIRECT:
            direct_fds.add(fd)
        return fd

    def writing(fd: int, data: Any, offset: int) -> int:
        if fd in direct_fds and where == "write":
            refused.append(fd)
            raise OSError(err, os.strerror(err))
        return real_pwrite(fd, data, offset)

    def closing(fd: int) -> None:
        direct_fds.discard(fd)  # its number may come back for another file
        real_close(fd)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "pwrite", writing)
    monkeypatch.setattr(os, "close", closing)
    return refused


@pytest.mark.parametrize(("where", "err"), [("open", errno.EINVAL), ("open", errno.EOPNOTSUPP),
                                           ("write", errno.EINVAL)])
def test_a_filesystem_that_refuses_direct_io_gets_the_page_cache(
        s3server: S3Server, s3area: tuple[str, str], on_disk: Path,
        monkeypatch: pytest.MonkeyPatch, where: str, err: int) -> None:
    """EINVAL or EOPNOTSUPP (a filesystem without O_DIRECT, a block size
    above ALIGN): the restore completes through the page cache, right, says
    how little went direct, and the process does not try that filesystem
    again."""
    store = s3server.open_store(*s3area)
    files = {"a.bin": os.urandom(3 * MiB + 5), "b.bin": os.urandom(5 * MiB + 4096)}
    _push(store, on_disk, 4, files)
    refused = _refusing_direct(monkeypatch, where, err)
    got = fetch(store, on_disk / "dest")
    # Once per range already under way at the first refusal, at most.
    tries = len(refused)
    assert 1 <= tries <= default_concurrency() and direct_io.refused(_device(on_disk))
    assert got.io == "direct" and got.direct_bytes == 0
    for name, data in files.items():
        assert (on_disk / "dest" / name).read_bytes() == data
    assert fetch(store, on_disk / "again").io == "spliced"  # not tried again
    assert len(refused) == tries


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_the_disks_own_failure_fails_the_restore_and_leaves_nothing(
        s3server: S3Server, s3area: tuple[str, str], on_disk: Path,
        monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """A full or failing disk is not a refusal of direct I/O: the OSError
    reaches the caller, no page-cache retry hides it, and neither `dest`
    nor a staging directory is left behind."""
    store = s3server.open_store(*s3area)
    _push(store, on_disk, 5, {"a.bin": os.urandom(6 * MiB)})
    _refusing_direct(monkeypatch, "write", err)
    with pytest.raises(OSError) as caught:
        fetch(store, on_disk / "dest")
    assert caught.value.errno == err and not direct_io.refused(_device(on_disk))
    assert sorted(p.name for p in on_disk.iterdir()) == ["j5", "src-5"]


class _CutBodies:
    """The real store, but for its ranged reads: those go through a front
    that sends half of each body, then closes the connection."""

    def __init__(self, honest: S3Store, cut: S3Store) -> None:
        self.honest, self.cut = honest, cut

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int:
        return self.cut.get_range_into(key, start, buffer)

    def get_range_through(self, *args: Any) -> int:
        return self.cut.get_range_through(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.honest, name)


def test_a_body_cut_mid_range_is_the_stores_failure_on_the_direct_path(
        s3server: S3Server, s3area: tuple[str, str], on_disk: Path) -> None:
    store = s3server.open_store(*s3area)
    _push(store, on_disk, 6, {"a.bin": os.urandom(9 * MiB)})
    bucket, prefix = s3area
    with Misreader(s3server, "cut") as front:
        cut = S3Store(bucket, prefix, endpoint_url=front.endpoint_url, region=s3server.region,
                      access_key=s3server.access_key, secret_key=s3server.secret_key,
                      max_attempts=1)
        with pytest.raises(StoreUnreachable, match=r"a\.bin.*(broke mid-body|closed after)"):
            fetch(_CutBodies(store, cut), on_disk / "dest")  # type: ignore[arg-type]
        assert front.sent > 0
    assert sorted(p.name for p in on_disk.iterdir()) == ["j6", "src-6"]


def test_into_memory_or_when_asked_the_ranges_are_not_written_directly(
        s3server: S3Server, s3area: tuple[str, str], on_disk: Path) -> None:
    """tmpfs keeps files in memory (direct I/O there is the same copy):
    spliced from a plain HTTP endpoint; onto a disk with direct_io=False too."""
    store = s3server.open_store(*s3area)
    data = os.urandom(MiB + 1)
    _push(store, on_disk, 7, {"a.bin": data})
    assert fetch(store, on_disk / "dest", direct_io=False).io == "spliced"
    assert (on_disk / "dest" / "a.bin").read_bytes() == data
    shm = Path("/dev/shm")
    if not shm.is_dir() or direct_io.worthwhile(shm):
        pytest.skip("no tmpfs at /dev/shm")
    with tempfile.TemporaryDirectory(dir=shm) as memory:
        assert fetch(store, Path(memory) / "dest").io == "spliced"
        assert (Path(memory) / "dest" / "a.bin").read_bytes() == data
