"""Prefix spreading on real stores: new checkpoints spread, old layouts keep
restoring beside them, and retention removes either (file://, SeaweedFS, MinIO)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ckptdrain import keys
from ckptdrain.store.base import Store
from ckptdrain.transfer import journal as jr
from ckptdrain.transfer.catalog import complete_steps
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.prune import prune_writer
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration
PART = 5 << 20


@dataclass
class OldJournal(jr.UploadJournal):
    """A journal as drains made them before spreading: 16 hex digits, no "s"."""

    attempt: str = field(default_factory=lambda: secrets.token_hex(8))


def _push(store: Store, root: Path, step: int, writer: int, writers: int) -> None:
    src = root / f"src-{step}-{writer}"
    src.mkdir(parents=True)
    (src / "big.bin").write_bytes(bytes([step, writer]) * (PART + 3))  # multipart
    (src / "small.bin").write_bytes(f"{step}/{writer}".encode())
    manifest = build_manifest(src, step, writer, writers, created=time.time())
    Drainer(store, part_size=PART, concurrency=2).drain(
        src, manifest, journal_path=root / f"j-{step}-{writer}")


def test_old_layout_checkpoints_restore_beside_spread_ones_and_retention_removes_both(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writers = 3
    with monkeypatch.context() as old_code:
        old_code.setattr(jr, "UploadJournal", OldJournal)
        for w in range(writers):
            _push(store, tmp_path, 1, w, writers)
    for w in range(writers):
        _push(store, tmp_path, 2, w, writers)
    data = [i.key for i in store.list(keys.DATA)]
    old = [k for k in data if k.startswith(f"data/{1:020d}/")]
    spread = {k.split("/")[1] for k in data if not k.startswith("data/0000")}
    assert len(old) == 2 * writers  # step 1 where old drains put it
    assert spread == {keys.spread(w) for w in range(writers)}  # step 2 spread per writer
    assert [c.step for c in complete_steps(store)] == [2, 1]
    for step in (1, 2):
        out = tmp_path / f"out-{step}"
        fetch(store, out, step=step)
        for w in range(writers):  # every writer's files, byte for byte, in dest/<writer>/
            assert (out / str(w) / "small.bin").read_bytes() == f"{step}/{w}".encode()
            assert (out / str(w) / "big.bin").read_bytes() == bytes([step, w]) * (PART + 3)
    for w in range(writers):
        prune_writer(store, w, keep=1)
    assert [c.step for c in complete_steps(store)] == [2]
    assert not [i.key for i in store.list(keys.DATA) if keys.parse_data_key(i.key)[0] == 1]
