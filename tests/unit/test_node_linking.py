"""Capture by reflink, hard link or copy (node/linking.py), on this machine's real
filesystem: what each method leaves on disk, the fallbacks, and a trainer that
rewrites a hard-linked file never changing what was captured unnoticed."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptdrain import checksum, keys
from ckptdrain.errors import IntegrityError, UnsafeSource
from ckptdrain.node import linking
from ckptdrain.node.durable import CopyAborted
from ckptdrain.node.localtier import LINKS, LocalTier
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.drain import Drainer

FILES = {"model.bin": os.urandom(3 << 20), "opt/adam.bin": os.urandom(1000), "empty": b""}
PART = 1 << 20


def _checkpoint(root: Path, files: dict[str, bytes] = FILES) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _refuse(code: int) -> Callable[..., None]:
    def refused(*_: object) -> None:
        raise OSError(code, os.strerror(code))
    return refused


#: No reflink, whatever the filesystem: the hard-link path, deterministically.
NO_REFLINK = linking.Methods(clone=_refuse(errno.EOPNOTSUPP))


def _clone_by_copy(src_fd: int, dst_fd: int) -> None:
    """Stands in for FICLONE where the filesystem lacks it: the clone's bytes are
    the source's at this moment, in a file of its own, as a reflink leaves them."""
    size = os.fstat(src_fd).st_size
    done = 0
    while done < size:
        done += os.copy_file_range(src_fd, dst_fd, size - done, done, done)


def _crcs(files: dict[str, bytes]) -> dict[str, tuple[int, str]]:
    return {rel: (len(data), checksum.to_hex(checksum.crc32c(data))) for rel, data in files.items()}


def _entries(captured_manifest: object) -> dict[str, tuple[int, str]]:
    return {f.path: (f.size, f.crc32c) for f in captured_manifest.files}  # type: ignore[attr-defined]


def test_capture_links_each_file_and_checksums_what_it_took(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work" / "step-4")
    tier = LocalTier(tmp_path / "local", methods=NO_REFLINK)
    captured = tier.capture(src, 4, writer=0, writers=1)
    assert captured.methods == {"reflink": 0, "link": 3, "copy": 0}
    for rel in FILES:
        mine, theirs = os.stat(tier.data_dir(4) / rel), os.stat(src / rel)
        assert (mine.st_ino, mine.st_nlink) == (theirs.st_ino, 2)
    assert _entries(captured.manifest) == _crcs(FILES)
    links = json.loads((tier.step_dir(4) / LINKS).read_bytes())
    assert set(links["files"]) == set(FILES)
    assert tier.verify(4) == captured.manifest


def test_the_kernels_reflink_is_used_where_the_filesystem_has_it_else_a_link(
        tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x")
    with open(a, "rb") as fa, open(b, "wb") as fb:
        try:
            linking.ficlone(fa.fileno(), fb.fileno())
            expected = "reflink"
        except OSError as err:  # ext4, tmpfs: not here
            assert err.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOTTY, errno.EXDEV)
            expected = "link"
    src = _checkpoint(tmp_path / "work")
    captured = LocalTier(tmp_path / "local").capture(src, 1, writer=0, writers=1)
    assert captured.methods[expected] == len(FILES)
    assert _entries(captured.manifest) == _crcs(FILES)


def test_a_reflinked_file_is_its_own_and_later_writes_never_reach_it(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work")
    tier = LocalTier(tmp_path / "local", methods=linking.Methods(clone=_clone_by_copy))
    captured = tier.capture(src, 2, writer=0, writers=1)
    assert captured.methods == {"reflink": 3, "link": 0, "copy": 0}
    assert os.stat(tier.data_dir(2) / "model.bin").st_nlink == 1
    assert not (tier.step_dir(2) / LINKS).exists()  # nothing to watch
    (src / "model.bin").write_bytes(os.urandom(3 << 20))
    assert tier.verify(2) == captured.manifest
    assert _entries(captured.manifest) == _crcs(FILES)


@pytest.mark.parametrize("code", [errno.EXDEV, errno.EPERM])
def test_a_refused_link_falls_back_to_a_copy_with_the_same_manifest(
        tmp_path: Path, code: int) -> None:
    src = _checkpoint(tmp_path / "work")
    linked = LocalTier(tmp_path / "linked", methods=NO_REFLINK).capture(
        src, 3, writer=0, writers=1)
    copier = LocalTier(tmp_path / "copied",
                       methods=linking.Methods(clone=_refuse(errno.EOPNOTSUPP),
                                               link=_refuse(code)))
    copied = copier.capture(src, 3, writer=0, writers=1)
    assert copied.methods == {"reflink": 0, "link": 0, "copy": 3}
    assert copied.manifest.files == linked.manifest.files
    assert os.stat(copier.data_dir(3) / "model.bin").st_nlink == 1
    assert not (copier.step_dir(3) / LINKS).exists()
    for rel, data in FILES.items():
        assert (copier.data_dir(3) / rel).read_bytes() == data


def test_an_unexpected_link_error_stops_the_capture(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "local",
                     methods=linking.Methods(clone=_refuse(errno.EOPNOTSUPP),
                                             link=_refuse(errno.EIO)))
    with pytest.raises(OSError, match="Input/output"):
        tier.capture(_checkpoint(tmp_path / "work"), 1, writer=0, writers=1)
    assert tier.steps() == [] and os.listdir(tmp_path / "local") == []


def _rewrite_in_place(path: Path, offset: int) -> None:
    """What a trainer saving again under the same name does: same inode, new bytes."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_rewrite_after_capture_fails_verify_and_the_drain_refuses_it(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work")
    tier = LocalTier(tmp_path / "local", methods=NO_REFLINK)
    tier.capture(src, 5, writer=0, writers=1)
    _rewrite_in_place(src / "model.bin", (3 << 20) // 2)  # same size: only the bytes tell
    with pytest.raises(IntegrityError, match=r"model\.bin"):
        tier.verify(5)
    store = LocalStore(tmp_path / "store")
    with pytest.raises(IntegrityError, match=r"model\.bin"):
        Drainer(store, part_size=PART).drain(tier.data_dir(5), tier.manifest(5),
                                             journal_path=tier.journal_path(5))
    assert store.head(keys.manifest_key(5, 0)) is None


def test_a_resized_rewrite_is_seen_by_its_stat_before_any_read(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work")
    tier = LocalTier(tmp_path / "local", methods=NO_REFLINK)
    tier.capture(src, 6, writer=0, writers=1)
    tier.check_links(6)
    with open(src / "opt" / "adam.bin", "ab") as f:
        f.write(b"more")
    with pytest.raises(IntegrityError, match=r"adam\.bin: changed since it was captured \(.*size"):
        tier.check_links(6)
    with pytest.raises(IntegrityError, match="rewrote it after publishing"):
        tier.verify(6)


def test_the_trainer_removing_its_own_name_is_not_a_rewrite(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work")
    tier = LocalTier(tmp_path / "local", methods=NO_REFLINK)
    captured = tier.capture(src, 7, writer=0, writers=1)
    time.sleep(0.02)  # past a clock tick: the unlink below moves ctime for sure
    for rel in FILES:
        (src / rel).unlink()  # the work dir's prune after capture
    assert os.stat(tier.data_dir(7) / "model.bin").st_nlink == 1
    assert tier.verify(7) == captured.manifest


def test_an_unreadable_links_file_fails_verify(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "local", methods=NO_REFLINK)
    tier.capture(_checkpoint(tmp_path / "work"), 8, writer=0, writers=1)
    (tier.step_dir(8) / LINKS).write_text('{"format": 1, "files": {"model.bin": [1, 2]}}')
    with pytest.raises(IntegrityError, match=r"links\.json: unreadable"):
        tier.verify(8)


def test_a_rewrite_during_the_checksum_read_is_captured_by_copy(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work", {"model.bin": FILES["model.bin"]})
    rewritten = os.urandom(4 << 20)  # longer: the read alone would not notice
    calls = []

    def trainer_writes_meanwhile() -> bool:  # called before each read of the link
        if not calls:
            (src / "model.bin").write_bytes(rewritten)  # same inode, other size and bytes
        calls.append(1)
        return False

    tier = LocalTier(tmp_path / "local", methods=NO_REFLINK)
    captured = tier.capture(src, 9, writer=0, writers=1, should_stop=trainer_writes_meanwhile)
    assert captured.methods == {"reflink": 0, "link": 0, "copy": 1}
    assert _entries(captured.manifest) == _crcs({"model.bin": rewritten})
    assert os.stat(tier.data_dir(9) / "model.bin").st_ino != os.stat(src / "model.bin").st_ino
    _rewrite_in_place(src / "model.bin", 0)  # the copy is immune
    assert tier.verify(9) == captured.manifest


def test_a_source_moving_during_its_copy_is_refused_and_nothing_published(
        tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work", {"model.bin": FILES["model.bin"]})

    def trainer_appends() -> bool:
        with open(src / "model.bin", "ab") as f:
            f.write(b"x")
        return False

    tier = LocalTier(tmp_path / "local",
                     methods=linking.Methods(clone=_refuse(errno.EOPNOTSUPP),
                                             link=_refuse(errno.EXDEV)))
    with pytest.raises(IntegrityError, match="changed"):
        tier.capture(src, 10, writer=0, writers=1, should_stop=trainer_appends)
    assert tier.steps() == [] and os.listdir(tmp_path / "local") == []


def test_an_abort_mid_capture_publishes_nothing_and_unlinks_only_its_own_names(
        tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work")
    asked = []

    def second_sigterm() -> bool:
        asked.append(1)
        return len(asked) > 1  # after the first file was linked and read

    tier = LocalTier(tmp_path / "local", methods=NO_REFLINK)
    with pytest.raises(CopyAborted):
        tier.capture(src, 11, writer=0, writers=1, should_stop=second_sigterm)
    assert tier.steps() == [] and os.listdir(tmp_path / "local") == []
    for rel, data in FILES.items():
        assert os.stat(src / rel).st_nlink == 1
        assert (src / rel).read_bytes() == data


_KILLED_MID_CAPTURE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from ckptdrain.node.localtier import LocalTier
    marker = Path(sys.argv[3])
    def hold() -> bool:
        marker.touch()
        time.sleep(60)
        return False
    LocalTier(Path(sys.argv[2])).capture(Path(sys.argv[1]), 12, writer=0, writers=1,
                                         should_stop=hold)
""")


def test_a_capture_killed_mid_way_leaves_nothing_published(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work")
    marker = tmp_path / "reading"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_MID_CAPTURE, str(src),
                             str(tmp_path / "local"), str(marker)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), "the capture never started reading"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    tier = LocalTier(tmp_path / "local")
    assert tier.steps() == []
    assert [p.name for p in tier.remove_temps()] and os.listdir(tmp_path / "local") == []
    for rel, data in FILES.items():
        assert (src / rel).read_bytes() == data and os.stat(src / rel).st_nlink == 1


def test_links_keep_the_refusals_of_a_copy(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work", {"a": b"1"})
    (src / "link").symlink_to("/etc/passwd")
    with pytest.raises(UnsafeSource, match="symlink"):
        LocalTier(tmp_path / "local", methods=NO_REFLINK).capture(src, 2, writer=0, writers=1)
    assert os.listdir(tmp_path / "local") == []
