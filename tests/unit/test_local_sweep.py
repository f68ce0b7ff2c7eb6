"""The file:// store cleans up after killed writers: temp files, half-made and
half-removed uploads, once older than a grace period; live state stays."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ckptdrain.store import local_sweep
from ckptdrain.store.local import LocalStore

HOUR = 3600.0


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name.startswith((".ckptdrain-tmp-", "trash-")) or
                  (p.parent.name == ".ckptdrain-multipart" and p.is_dir()))


def test_sweep_removes_what_killed_writers_left_and_keeps_live_state(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put_bytes("data/a/obj", b"kept")
    stale_tmp = tmp_path / "s" / "data" / "a" / ".ckptdrain-tmp-dead"
    stale_tmp.write_bytes(b"x" * 1000)  # a put killed before its rename
    age(stale_tmp, 2 * HOUR)
    fresh_tmp = tmp_path / "s" / "data" / "a" / ".ckptdrain-tmp-live"
    fresh_tmp.write_bytes(b"y")  # maybe a put in progress right now
    lonely = tmp_path / "s" / "data" / "b" / ".ckptdrain-tmp-dead2"
    lonely.parent.mkdir(parents=True)
    lonely.write_bytes(b"z")
    age(lonely, 2 * HOUR)
    live = store.create_multipart("data/a/big")
    store.upload_part("data/a/big", live, 1, b"part")
    keyless = tmp_path / "s" / ".ckptdrain-multipart" / ("f" * 32)
    keyless.mkdir()  # killed between mkdir and writing its key
    (keyless / "00001.part").write_bytes(b"p" * 100)
    age(keyless, 2 * HOUR)
    half_removed = tmp_path / "s" / ".ckptdrain-multipart" / f"trash-{'e' * 32}-0000"
    half_removed.mkdir()
    (half_removed / "00002.part").write_bytes(b"q")

    assert store.sweep(older_than=HOUR) == 4
    assert not stale_tmp.exists() and not keyless.exists() and not half_removed.exists()
    assert not lonely.parent.exists()  # its now-empty directory too
    assert fresh_tmp.exists() and store.get_bytes("data/a/obj") == b"kept"
    assert store.list_parts("data/a/big", live) is not None  # live upload untouched
    assert [u.upload_id for u in store.list_multipart_uploads("data/")] == [live]


def test_abort_and_complete_leave_nothing_behind(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    for key in ("k/aborted", "k/done"):
        upload = store.create_multipart(key)
        part = store.upload_part(key, upload, 1, b"data")
        if key == "k/aborted":
            store.abort_multipart(key, upload)
        else:
            store.complete_multipart(key, upload, [part])
    assert leftovers(tmp_path / "s") == []
    assert store.get_bytes("k/done") == b"data"


def test_an_upload_killed_mid_removal_is_gone_at_once_and_swept_later(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    upload = store.create_multipart("k/x")
    store.upload_part("k/x", upload, 1, b"data")
    path = tmp_path / "s" / ".ckptdrain-multipart" / upload
    # The rename is the removal: what a kill leaves after it is trash.
    os.rename(path, path.with_name(f"{local_sweep.TRASH_PREFIX}{upload}-dead"))
    assert store.list_parts("k/x", upload) is None
    assert store.list_multipart_uploads("") == []
    store.sweep(older_than=HOUR)
    assert leftovers(tmp_path / "s") == []
