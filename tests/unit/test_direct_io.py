"""direct_io's pure parts and its file handling on this machine's own
filesystem: which filesystem a path is on, which are worth direct I/O,
aligned memory, and what DirectFile writes which way."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest

from ckptdrain.transfer import direct_io, range_fetch


@pytest.fixture(autouse=True)
def _fresh_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct_io, "_refused", set())


def _device(path: Path) -> int:
    return os.stat(path).st_dev


def _mountinfo(*lines: str) -> str:
    return "\n".join(lines) + "\n"


MOUNTS = _mountinfo(
    "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw",
    "30 22 259:2 / /data rw,relatime shared:9 master:2 - xfs /dev/nvme0n1 rw",
    "31 22 0:25 / /dev/shm rw,nosuid - tmpfs tmpfs rw",
    "32 22 0:26 / /mnt/a\\040b rw - btrfs /dev/sdb rw",
    "33 22 259:3 / /over rw - ext4 /dev/sdc rw",
    "34 33 0:27 / /over rw - tmpfs tmpfs rw",  # mounted over the one before
    "35 22 259:4 / /deep/x rw - ext4 /dev/sdd rw",
    "36 22 0:28 / /deep rw - tmpfs tmpfs rw",  # hides /deep/x, a longer mount point
    "37 22 0:29 / /nfs rw - nfs4 server:/export rw",
    "garbage line without a separator",
)


@pytest.mark.parametrize(("path", "device", "kind"), [
    ("/", None, "ext4"), ("/data/x", None, "xfs"), ("/data", None, "xfs"),
    ("/database", None, "ext4"), ("/dev/shm/a", None, "tmpfs"), ("/mnt/a b/c", None, "btrfs"),
    ("/over/x", None, "tmpfs"), ("/over/x", os.makedev(0, 27), "tmpfs"),
    ("/deep/x/ckpt", os.makedev(0, 28), "tmpfs"),  # the path alone would say ext4
    ("/deep/x/ckpt", os.makedev(9, 9), "ext4"),  # a device no mount names: the path decides
])
def test_the_filesystem_of_a_path_is_its_devices_or_its_longest_latest_mount(
        path: str, device: int | None, kind: str) -> None:
    assert direct_io.filesystem_of(Path(path), MOUNTS, device) == kind


@pytest.mark.parametrize(("kind", "direct"), [("ext4", True), ("xfs", True), ("tmpfs", False),
                                               ("nfs4", False), ("fuse.gcsfuse", False),
                                               ("overlay", False), ("btrfs", False)])
def test_only_a_local_disks_filesystem_is_worth_direct_io(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, direct: bool) -> None:
    device = _device(tmp_path)
    table = tmp_path / "mountinfo"
    table.write_text(_mountinfo(f"1 0 {os.major(device)}:{os.minor(device)} / / rw - {kind} x rw"))
    monkeypatch.setattr(direct_io, "MOUNTINFO", table)
    assert direct_io.worthwhile(tmp_path) is direct
    direct_io._refuse(device, OSError(errno.EINVAL, "Invalid argument"))
    assert not direct_io.worthwhile(tmp_path)


def test_an_aligned_buffer_is_page_aligned_and_of_the_size_asked() -> None:
    for size in (1, 4095, range_fetch.PIECE + 1):
        view = direct_io.aligned_buffer(size)
        assert len(view) == size
        address = ctypes.addressof(ctypes.c_char.from_buffer(view))
        assert address % direct_io.ALIGN == 0


@pytest.fixture
def on_disk(tmp_path: Path) -> Path:
    if not direct_io.worthwhile(tmp_path):
        pytest.skip(f"{tmp_path} is not on a local disk")
    return tmp_path


def _file(tmp: Path, size: int) -> Path:
    path = tmp / "f.bin"
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_aligned_memory_at_an_aligned_offset_goes_direct_and_the_tail_does_not(
        on_disk: Path) -> None:
    data = os.urandom(3 * direct_io.ALIGN + 100)
    buffer = direct_io.aligned_buffer(len(data))
    buffer[:] = data
    path = _file(on_disk, direct_io.ALIGN + len(data))
    with direct_io.DirectFile(path) as out:
        out.write(buffer, direct_io.ALIGN)
        out.write(buffer[:10], 0)  # shorter than a block: the page cache
    assert out.direct == 3 * direct_io.ALIGN
    assert path.read_bytes() == data[:10] + bytes(direct_io.ALIGN - 10) + data


@pytest.mark.parametrize("case", ["unaligned memory", "read-only bytes", "unaligned offset"])
def test_what_cannot_go_direct_goes_through_the_page_cache_without_refusing_the_disk(
        on_disk: Path, case: str) -> None:
    """Memory or an offset off the alignment is the caller's, not the
    filesystem's: written right, through the page cache, and the next
    restore onto this disk still writes directly."""
    data = os.urandom(2 * direct_io.ALIGN)
    buffer = direct_io.aligned_buffer(len(data) + 1)
    buffer[1:] = data
    view, offset = {"unaligned memory": (buffer[1:], 0),
                    "read-only bytes": (memoryview(data), 0),
                    "unaligned offset": (buffer[1:], 512)}[case]
    path = _file(on_disk, offset + len(data))
    with direct_io.DirectFile(path) as out:
        out.write(view, offset)
    assert out.direct == 0 and path.read_bytes()[offset:] == data
    assert direct_io.worthwhile(on_disk)


def test_a_refusal_is_said_once_per_device(caplog: pytest.LogCaptureFixture) -> None:
    err = OSError(errno.EINVAL, "Invalid argument")
    for _ in range(3):
        direct_io._refuse(os.makedev(8, 1), err)
    direct_io._refuse(os.makedev(8, 2), err)
    said = [r.getMessage() for r in caplog.records if "direct I/O refused" in r.getMessage()]
    assert len(said) == 2 and "8:1" in said[0] and "Invalid argument" in said[0]
    assert direct_io.refused(os.makedev(8, 1)) and not direct_io.refused(os.makedev(8, 3))
