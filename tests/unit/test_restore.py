"""Restore's candidate order, and restore from the local tier with fallback."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore.engine import restore
from ckptdrain.restore.plan import Candidate, candidates


def test_newest_first_local_preferred_on_ties() -> None:
    assert candidates([5, 3], [4, 3], writers=1) == [
        Candidate(5, "local"), Candidate(4, "global"), Candidate(3, "local"),
        Candidate(3, "global")]


def test_prefer_global() -> None:
    assert candidates([3], [3], writers=1, prefer="global")[0] == Candidate(3, "global")


def test_several_writers_restore_only_globally_complete_steps() -> None:
    # Step 5 exists only on this node: other ranks may not have it.
    assert candidates([5, 3], [4, 3], writers=2) == [
        Candidate(4, "global"), Candidate(3, "local"), Candidate(3, "global")]


def _cfg(tmp_path: Path) -> config.AgentConfig:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(tmp_path / "work"),
        "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "local")})


def _capture(tmp_path: Path, step: int) -> LocalTier:
    src = tmp_path / "src" / f"step-{step}"
    src.mkdir(parents=True)
    (src / "w.bin").write_bytes(bytes([step]) * 100_000)
    tier = LocalTier(tmp_path / "local")
    tier.capture(src, step, writer=0, writers=1)
    return tier


def test_corrupt_local_copy_falls_back_to_older_and_says_why(tmp_path: Path) -> None:
    _capture(tmp_path, 1)
    tier = _capture(tmp_path, 2)
    with open(tier.data_dir(2) / "w.bin", "r+b") as f:
        f.seek(500)
        f.write(b"\xff")
    result, code = restore(_cfg(tmp_path), None)
    assert code == 0 and result.step == 1 and result.tier == "local"
    assert [(s.step, s.tier) for s in result.skipped] == [(2, "local")]
    assert "crc32c" in result.skipped[0].reason
    assert (tmp_path / "work" / "step-1" / "w.bin").read_bytes() == b"\x01" * 100_000
    assert not (tmp_path / "work" / "step-2").exists()
    result.write(tmp_path / "work" / "restore.json")
    doc = json.loads((tmp_path / "work" / "restore.json").read_text())
    assert doc["step"] == 1 and doc["skipped"][0]["step"] == 2


def test_nothing_anywhere_is_a_fresh_start(tmp_path: Path) -> None:
    result, code = restore(_cfg(tmp_path), None)
    assert code == 0 and result.fresh_start and result.step is None


def test_every_candidate_corrupt_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    tier = _capture(tmp_path, 1)
    (tier.data_dir(1) / "w.bin").write_bytes(b"junk")
    result, code = restore(_cfg(tmp_path), None)
    assert code == 4 and result.step is None and len(result.skipped) == 1
    assert not result.fresh_start and result.outcome == "none_verified"


def test_a_store_that_cannot_be_opened_fails_instead_of_starting_fresh(tmp_path: Path) -> None:
    result, code = restore(_cfg(tmp_path), None, "cannot open s3://b/p: endpoint refused")
    assert code == 3 and result.step is None
    assert [(s.step, s.tier) for s in result.skipped] == [(None, "global")]


def test_a_store_that_cannot_be_opened_still_lets_the_local_tier_restore(tmp_path: Path) -> None:
    _capture(tmp_path, 4)
    result, code = restore(_cfg(tmp_path), None, "cannot open s3://b/p: endpoint refused")
    assert code == 0 and result.step == 4 and result.tier == "local"


def test_run_with_an_unopenable_store_exits_3(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptdrain.restore import command

    monkeypatch.setenv("CKPTDRAIN_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("CKPTDRAIN_LOCAL_DIR", str(tmp_path / "local"))
    # A URI the parser accepts but whose directory cannot be created.
    (tmp_path / "file").write_bytes(b"")
    monkeypatch.setenv("CKPTDRAIN_STORE_URI", f"file://{tmp_path}/file/store")
    monkeypatch.setenv("CKPTDRAIN_RESTORE_RETRY_DEADLINE", "0")  # one try
    assert command.main([]) == 3
    doc = json.loads((tmp_path / "work" / "restore.json").read_text())
    assert doc["step"] is None and doc["skipped"][0]["tier"] == "global"
    assert doc["attempts"] == 1


class _OnePeer:
    """A peer tier holding step 7 of this writer: writes one file, as restore_step does."""

    def restore_step(self, step: int, tmp: Path, tier: LocalTier) -> tuple[int, str, str]:
        tmp.mkdir(parents=True)
        (tmp / "w.bin").write_bytes(b"peer")
        return 4, f"peer 10.0.0.2 writer 0 step {step}", "peer"


def test_a_step_restored_from_a_peer_is_reported_not_a_crash(tmp_path: Path) -> None:
    from ckptdrain.restore.engine import _try
    from ckptdrain.restore.result import RestoreResult

    cfg = _cfg(tmp_path)
    cfg.work_dir.mkdir(parents=True)
    result = RestoreResult(fresh_start=False, writer=0, writers=1, at=0.0)
    outcome = _try(cfg, LocalTier(cfg.local_dir), None, Candidate(7, "peer"), result,
                   None, _OnePeer())  # type: ignore[arg-type]
    assert outcome == "ok" and (result.step, result.tier, result.bytes) == (7, "peer", 4)
    assert result.step_created is None  # the peer's manifest time is not known here
    assert (tmp_path / "work" / "step-7" / "w.bin").read_bytes() == b"peer"


def test_a_store_directory_that_does_not_exist_is_no_fresh_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mistyped file:// path is an error naming it; an empty store that
    exists is a fresh start."""
    from ckptdrain.restore import command

    monkeypatch.setenv("CKPTDRAIN_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("CKPTDRAIN_LOCAL_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("CKPTDRAIN_STORE_URI", f"file://{tmp_path}/typo")
    assert command.main([]) == 3  # configuration: no retries to wait through
    doc = json.loads((tmp_path / "work" / "restore.json").read_text())
    assert not doc["fresh_start"] and f"{tmp_path}/typo does not exist" in doc["reason"]
    assert not (tmp_path / "typo").exists()
    (tmp_path / "typo").mkdir()
    assert command.main([]) == 0
    assert json.loads((tmp_path / "work" / "restore.json").read_text())["fresh_start"]


def test_a_new_policys_directory_under_an_existing_store_root_is_a_fresh_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The webhook gives a pod <spec.storage.uri>/<namespace>/<policy>, which the
    agent makes on its first drain, after the first pod's restore: under a root
    that exists that is a fresh start, while a missing root stays an error."""
    from ckptdrain.restore import command

    monkeypatch.setenv("CKPTDRAIN_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("CKPTDRAIN_LOCAL_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("CKPTDRAIN_POLICY", "research/llama")
    monkeypatch.setenv("CKPTDRAIN_STORE_URI", f"file://{tmp_path}/shared/research/llama")
    assert command.main([]) == 3  # the root itself is missing: a wrong path
    assert not (tmp_path / "shared").exists()
    (tmp_path / "shared").mkdir()
    assert command.main([]) == 0
    assert json.loads((tmp_path / "work" / "restore.json").read_text())["fresh_start"]
    # Only this pod's own /<namespace>/<policy> is taken as the webhook's suffix.
    monkeypatch.setenv("CKPTDRAIN_STORE_URI", f"file://{tmp_path}/shared/other/llama")
    assert command.main([]) == 3
