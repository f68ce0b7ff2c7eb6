"""Restore for readers, and for a job at another world size (restore/engine.py,
restore/reshard.py), against a real file store and local tier; and the
agent a reader never runs."""

from __future__ import annotations

import argparse
import os
import unittest.mock
from pathlib import Path

import pytest

from ckptdrain.client import Client
from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore import reshard
from ckptdrain.restore.engine import restore
from ckptdrain.restore.plan import Candidate, candidates
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest


def _cfg(tmp_path: Path, writer: int, writers: int, **env: str) -> config.AgentConfig:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(tmp_path / "work"),
        "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "local"),
        "CKPTDRAIN_WRITER_ID": str(writer), "CKPTDRAIN_WRITERS": str(writers), **env})


def _source(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    src = tmp_path / "src" / name
    src.mkdir(parents=True)
    for path, content in files.items():
        (src / path).write_bytes(content)
    return src


def _push(tmp_path: Path, store: LocalStore, step: int, writer: int, writers: int,
          files: dict[str, bytes]) -> None:
    src = _source(tmp_path, f"push-{step}-{writer}-{writers}", files)
    Drainer(store).drain(src, build_manifest(src, step, writer, writers, created=1.0),
                         journal_path=tmp_path / f"j-{step}-{writer}-{writers}")


def _dcp_save(tmp_path: Path, store: LocalStore, step: int, writers: int) -> None:
    """What `ckptdrain.dcp.save` leaves: each rank's file, `.metadata` in writer 0's."""
    for w in range(writers):
        files = {f"__{w}_0.distcp": bytes([w]) * 4096}
        if w == 0:
            files[".metadata"] = b"dcp metadata"
        _push(tmp_path, store, step, w, writers, files)


# -- readers -----------------------------------------------------------------------


def test_a_reader_restores_its_shard_from_the_store(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for w in (0, 1):
        _push(tmp_path, store, 100, w, 2, {"w.bin": bytes([w]) * 1000})
    result, code = restore(_cfg(tmp_path, 1, 2, CKPTDRAIN_ROLE="reader"), store)
    assert (code, result.outcome, result.step, result.tier) == (0, "restored", 100, "global")
    assert (tmp_path / "work" / "step-100" / "w.bin").read_bytes() == b"\x01" * 1000
    result.write(tmp_path / "work" / "restore.json")
    restored = Client(tmp_path / "work").restored()
    assert restored is not None and restored.step == 100


def test_a_reader_uses_its_writers_copy_on_this_node_only_when_it_is_the_committed_one(
        tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for w in (0, 1):
        _push(tmp_path, store, 100, w, 2, {"w.bin": bytes([w]) * 1000})
    tier = LocalTier(tmp_path / "local")
    tier.capture(_source(tmp_path, "same", {"w.bin": b"\x01" * 1000}), 100, writer=1,
                 writers=2)
    os.chmod(tmp_path / "local", 0o555)  # mounted read-only: restore only reads it
    try:
        result, code = restore(_cfg(tmp_path, 1, 2, CKPTDRAIN_ROLE="reader"), store)
    finally:
        os.chmod(tmp_path / "local", 0o755)
    assert (code, result.step, result.tier, result.skipped) == (0, 100, "local", [])


def test_one_writers_newer_local_step_is_not_a_readers_or_its_own_when_readers_restore(
        tmp_path: Path) -> None:
    """With one writer, its node's step 120 never reached the store: a reader
    cannot get it, so neither the reader nor (told readers restore beside
    it) the writer may resume from it, or the replicas would part."""
    store = LocalStore(tmp_path / "store")
    _push(tmp_path, store, 100, 0, 1, {"w.bin": b"G" * 100})
    LocalTier(tmp_path / "local").capture(_source(tmp_path, "newer", {"w.bin": b"L" * 100}),
                                          120, writer=0, writers=1)
    alone, _ = restore(_cfg(tmp_path / "a", 0, 1, CKPTDRAIN_LOCAL_DIR=str(tmp_path / "local")),
                       store)
    assert alone.step == 120  # the writer on its own keeps today's local-first promise
    for name, value in (("CKPTDRAIN_ROLE", "reader"), ("CKPTDRAIN_READERS", "true")):
        result, code = restore(_cfg(tmp_path / name, 0, 1, **{
            "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "local"), name: value}), store)
        assert (code, result.step, result.tier) == (0, 100, "global")
        assert [(s.step, s.tier) for s in result.skipped] == [(120, "local")]


def test_the_plan_takes_local_only_steps_only_for_a_pod_restoring_alone() -> None:
    assert candidates([7], [5], writers=1) == [Candidate(7, "local"), Candidate(5, "global")]
    assert candidates([7], [5], writers=1, alone=False) == [Candidate(5, "global")]


# -- another world size -------------------------------------------------------------


def test_a_dcp_step_of_another_writer_count_is_handed_to_the_trainer(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _dcp_save(tmp_path, store, 90, 1)   # an older step at the job's new count
    _dcp_save(tmp_path, store, 100, 2)  # the newest, saved by two
    stale = tmp_path / "work" / "step-80"
    stale.mkdir(parents=True)  # an earlier incarnation's step in the work dir
    result, code = restore(_cfg(tmp_path, 0, 1), store)
    assert (code, result.outcome, result.fresh_start) == (0, "reshard", False)
    assert (result.step, result.step_writers, result.tier) == (100, 2, "global")
    assert "saved by 2 writer(s), this job has 1" in result.reason
    assert result.skipped == [] and result.step_created == 1.0
    # Nothing of either layout in the work dir: the trainer loads step 100 itself.
    assert os.listdir(tmp_path / "work") == []
    result.write(tmp_path / "work" / "restore.json")
    assert Client(tmp_path / "work").restored() is None


def test_more_writers_than_before_reshard_too(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _dcp_save(tmp_path, store, 100, 2)
    for writer in range(4):
        result, code = restore(_cfg(tmp_path / str(writer), writer, 4), store)
        assert (code, result.outcome, result.step, result.step_writers) == (
            0, "reshard", 100, 2)


def test_once_the_job_saved_at_its_new_count_that_step_is_restored(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _dcp_save(tmp_path, store, 100, 2)
    _dcp_save(tmp_path, store, 110, 1)
    result, code = restore(_cfg(tmp_path, 0, 1), store)
    assert (code, result.outcome, result.step, result.step_writers) == (
        0, "restored", 110, None)


def test_a_trainer_that_reshards_gets_any_format(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for w in (0, 1):
        _push(tmp_path, store, 100, w, 2, {"w.bin": bytes([w]) * 1000})
    result, code = restore(_cfg(tmp_path, 0, 3, CKPTDRAIN_RESTORE_RESHARD="trainer"), store)
    assert (code, result.outcome, result.step, result.step_writers) == (0, "reshard", 100, 2)


def test_pending_is_the_newest_global_step_of_another_count_past_the_plan() -> None:
    counts = {("global", 100): 2, ("global", 90): 1, ("local", 95): 2}
    assert reshard.pending(counts, 1, [Candidate(90, "global")]) == reshard.Pending(100, 2)
    assert reshard.pending(counts, 1, [Candidate(100, "peer")]) is None
    assert reshard.pending({("global", 90): 1}, 1, []) is None


def test_a_reader_runs_no_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    import signal

    from ckptdrain.agent import command as agent

    monkeypatch.setenv("CKPTDRAIN_ROLE", "reader")
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = agent.main(["--work-dir", str(tmp_path / "w"), "--local-dir",
                           str(tmp_path / "l"), "--metrics-port", "0"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 2
    assert "a reader restores its shard and never writes" in capsys.readouterr().err
    assert not (tmp_path / "l").exists()  # refused before touching anything


def test_what_a_rank_offers_the_agreement_is_what_every_pod_can_restore(
        tmp_path: Path) -> None:
    """The agreement among writers (restore/coordinated.py): a global step of
    another writer count is no rank's shard (restore hands it over instead),
    with readers beside the writers a step only the nodes hold is not
    offered, and a reader holds no rank, so it takes no part."""
    from ckptdrain.restore import coordinated

    tier = LocalTier(tmp_path / "local")
    for step in (100, 120):
        tier.capture(_source(tmp_path, f"l{step}", {"w.bin": b"x"}), step, writer=1, writers=2)
    counts = {("global", 90): 4, ("global", 100): 2, ("local", 100): 2, ("local", 120): 2}
    writer = _cfg(tmp_path, 1, 2)
    held = coordinated.holdings(writer, tier, [120, 100], counts, [100, 90], [])
    assert (sorted(held.local), held.complete) == ([100, 120], (100,))
    beside = _cfg(tmp_path, 1, 2, CKPTDRAIN_READERS="true")
    held = coordinated.holdings(beside, tier, [120, 100], counts, [100, 90], [])
    assert (sorted(held.local), held.complete) == ([100], (100,))
    env = {"CKPTDRAIN_POD_UID": "u", "CKPTDRAIN_POLICY": "ml/p", "CKPTDRAIN_NAMESPACE": "ml",
           "CKPTDRAIN_POD_NAME": "p-3"}
    with unittest.mock.patch.dict(os.environ, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}):
        assert coordinated.coordinates(_cfg(tmp_path, 1, 2, **env))
        assert not coordinated.coordinates(_cfg(tmp_path, 1, 2, CKPTDRAIN_ROLE="reader",
                                                **env))
