"""A policy's store moved: every kind of real store (file://, SeaweedFS, MinIO,
GCS) that answers "nothing under this prefix" makes restore refuse a fresh
start while the policy's history names where its checkpoints were, and
restores what was copied over once it is there."""

from __future__ import annotations

from pathlib import Path

from tests.support.agent_config import agent_config

from ckptdrain.contract.earlier_stores import EarlierStore, encode
from ckptdrain.node import config
from ckptdrain.restore.engine import restore
from ckptdrain.store.base import Store
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest

OLD = "s3://old-bucket/runs/ml/llama"


def _cfg(tmp_path: Path, store: Store) -> config.AgentConfig:
    return agent_config(tmp_path, CKPTDRAIN_STORE_URI=store.uri, CKPTDRAIN_EARLIER_STORES=encode(
        [EarlierStore(OLD, 4200, "2026-11-29T10:00:00Z")]))


def test_an_empty_prefix_after_a_move_is_refused_then_the_copy_restored(
        tmp_path: Path, store: Store) -> None:
    result, code = restore(_cfg(tmp_path, store), store)
    assert (code, result.outcome, result.fresh_start) == (5, "history_elsewhere", False)
    assert f"nothing under {store.uri}, but" in result.reason
    assert f"reached step 4200 under {OLD} before it moved on 2026-11-29T10:00:00Z:" \
        in result.reason
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"copied" * 1000)
    Drainer(store).drain(src, build_manifest(src, 4200, 0, 1, created=1.0),
                         journal_path=tmp_path / "journal")
    result, code = restore(_cfg(tmp_path, store), store)
    assert (code, result.outcome, result.step) == (0, "restored", 4200)
    assert (tmp_path / "work" / "step-4200" / "w.bin").read_bytes() == b"copied" * 1000


def test_a_move_back_to_an_older_step_is_refused_while_the_history_knows_a_newer_one(
        tmp_path: Path, store: Store) -> None:
    # old@4200 -> new, which trained to 5000 -> back to old: each real store
    # answers with step 4200, which restore must not resume from silently.
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"old run" * 1000)
    Drainer(store).drain(src, build_manifest(src, 4200, 0, 1, created=1.0),
                         journal_path=tmp_path / "journal")
    cfg = agent_config(tmp_path, CKPTDRAIN_STORE_URI=store.uri,
                       CKPTDRAIN_EARLIER_STORES=encode([EarlierStore(
                           "s3://new-bucket/runs/ml/llama", 5000, "2026-11-30T10:00:00Z",
                           "revert")]))
    result, code = restore(cfg, store)
    assert (code, result.outcome, result.step) == (5, "history_elsewhere", None)
    assert result.reason.startswith(f"step 4200 is the newest this restore could use here "
                                    f"({store.uri}), but this policy's checkpoints reached "
                                    "step 5000 under s3://new-bucket/runs/ml/llama")
    assert not (tmp_path / "work" / "step-4200").exists()
