"""Restore after the policy's store moved (CKPTDRAIN_EARLIER_STORES): a store
that answers with nothing is no fresh start while the policy's history says
its checkpoints reached a step elsewhere (outcome `history_elsewhere`, exit
5); deliberate fresh starts stay what they were. Against a real file://
store, through the engine and through `ckptdrain restore` itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.agent_config import agent_config

from ckptdrain import cli
from ckptdrain.agent.metrics import RESTORE_OUTCOMES
from ckptdrain.contract.earlier_stores import EarlierStore, encode, parse
from ckptdrain.errors import InvalidInput
from ckptdrain.node import config
from ckptdrain.restore.engine import restore
from ckptdrain.restore.result import OUTCOMES
from ckptdrain.store.local import LocalStore

OLD = "s3://old-bucket/runs/ml/llama"
EARLIER = encode([EarlierStore(OLD, 4200, "2026-11-29T10:00:00Z", "bucket migration"),
                  EarlierStore("s3://older/runs/ml/llama", 100, "2026-10-01T00:00:00Z")])


def _cfg(tmp_path: Path, **env: str) -> config.AgentConfig:
    return agent_config(tmp_path, **env)


def test_nothing_at_the_new_prefix_with_history_elsewhere_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    uri = f"file://{tmp_path}/store"
    result, code = restore(_cfg(tmp_path, CKPTDRAIN_STORE_URI=uri,
                                CKPTDRAIN_EARLIER_STORES=EARLIER), store)
    assert (code, result.outcome, result.fresh_start, result.step) == (
        5, "history_elsewhere", False, None)
    assert result.reason == (
        f"nothing under {uri}, but this policy's checkpoints reached step 4200 under {OLD} "
        'before it moved on 2026-11-29T10:00:00Z ("bucket migration"): copy '
        f"{OLD}/ to {uri}/ with the store's tools, or set spec.relocation.startFresh: true "
        "with a new spec.relocation.reason to start from step 0")


def test_without_history_nothing_anywhere_is_still_a_fresh_start(tmp_path: Path) -> None:
    result, code = restore(_cfg(tmp_path), LocalStore(tmp_path / "store"))
    assert (code, result.outcome, result.fresh_start) == (0, "fresh_start", True)


def _push(tmp_path: Path, step: int, writers: int = 1) -> None:
    src = tmp_path / "src" / f"step-{step}"
    src.mkdir(parents=True)
    for w in range(writers):
        (src / "w.bin").write_bytes(b"copied over" * 100)
        assert cli.main(["push", str(src), f"file://{tmp_path}/store", "-q", "--create",
                         "--writer", str(w), "--writers", str(writers)]) == 0


def test_a_checkpoint_at_the_new_prefix_is_restored_whatever_the_history(
        tmp_path: Path) -> None:
    _push(tmp_path, 4200)
    result, code = restore(_cfg(tmp_path, CKPTDRAIN_EARLIER_STORES=EARLIER),
                           LocalStore(tmp_path / "store"))
    assert (code, result.outcome, result.step) == (0, "restored", 4200)


def test_a_step_older_than_the_history_names_elsewhere_is_refused(tmp_path: Path) -> None:
    # old@4200 -> new, which trained to 5000 -> back to old: 4200 would
    # silently throw the steps since away.
    _push(tmp_path, 4200)
    uri = f"file://{tmp_path}/store"
    newer = encode([EarlierStore("s3://new-bucket/runs/ml/llama", 5000, "2026-11-30T10:00:00Z",
                                 "back")])
    result, code = restore(_cfg(tmp_path, CKPTDRAIN_STORE_URI=uri,
                                CKPTDRAIN_EARLIER_STORES=newer), LocalStore(tmp_path / "store"))
    assert (code, result.outcome, result.step, result.fresh_start) == (
        5, "history_elsewhere", None, False)
    assert result.reason == (
        f"step 4200 is the newest this restore could use here ({uri}), but this policy's "
        "checkpoints reached step 5000 under s3://new-bucket/runs/ml/llama before it moved on "
        '2026-11-30T10:00:00Z ("back"): copy s3://new-bucket/runs/ml/llama/ to '
        f"{uri}/ with the store's tools to resume from step 5000, or set "
        "spec.relocation.startFresh: true with a new spec.relocation.reason to restore step "
        "4200")
    assert not (tmp_path / "work" / "step-4200").exists()


def test_a_newest_step_that_fails_does_not_fall_back_past_the_history(tmp_path: Path) -> None:
    _push(tmp_path, 4000)
    _push(tmp_path, 4500)
    for data in (tmp_path / "store").rglob("*"):
        if data.is_file() and "4500" in str(data) and "manifest" not in data.name:
            data.write_bytes(b"corrupt")
    result, code = restore(_cfg(tmp_path, CKPTDRAIN_EARLIER_STORES=EARLIER),
                           LocalStore(tmp_path / "store"))
    assert (code, result.outcome) == (5, "history_elsewhere")
    assert result.reason.startswith("step 4000 is the newest this restore could use here")
    assert [s.step for s in result.skipped] == [4500]


def test_a_step_of_another_writer_count_older_than_the_history_is_not_handed_over(
        tmp_path: Path) -> None:
    _push(tmp_path, 4000, writers=2)
    env = {"CKPTDRAIN_RESTORE_RESHARD": "trainer"}
    result, code = restore(_cfg(tmp_path, **env), LocalStore(tmp_path / "store"))
    assert (code, result.outcome, result.step) == (0, "reshard", 4000)
    result, code = restore(_cfg(tmp_path, CKPTDRAIN_EARLIER_STORES=EARLIER, **env),
                           LocalStore(tmp_path / "store"))
    assert (code, result.outcome) == (5, "history_elsewhere")
    assert "step 4000 is the newest" in result.reason and "step 4200 under" in result.reason


def test_a_reader_gets_the_same_protection(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, CKPTDRAIN_ROLE="reader", CKPTDRAIN_EARLIER_STORES=EARLIER)
    assert cfg.reader
    result, code = restore(cfg, LocalStore(tmp_path / "store"))
    assert (code, result.outcome, result.fresh_start) == (5, "history_elsewhere", False)


def test_the_outcome_is_one_every_reader_of_outcomes_knows() -> None:
    assert set(RESTORE_OUTCOMES) == set(OUTCOMES) and OUTCOMES["history_elsewhere"] == 5


@pytest.mark.parametrize("text", [
    "not json", "{}", '[{"uri": "", "step": 1}]', '[{"uri": "s3://a/b", "step": -1}]',
    '[{"uri": "s3://a/b", "step": true}]', '[{"uri": "s3://a/b"}]',
    json.dumps([{"uri": f"s3://a/{i}", "step": i} for i in range(6)])])
def test_a_list_restore_cannot_read_stops_it_naming_the_variable(
        tmp_path: Path, text: str) -> None:
    with pytest.raises(InvalidInput, match=r"^CKPTDRAIN_EARLIER_STORES: expected a JSON list"):
        _cfg(tmp_path, CKPTDRAIN_EARLIER_STORES=text)


def test_a_list_nested_too_deep_or_too_long_is_refused_naming_the_variable(
        tmp_path: Path) -> None:
    for text, seen in (("[" * 60_000, "got '[[["),
                       ('[{"uri": "s3://a/b", "step": 1, "reason": "' + "x" * 70_000 + '"}]',
                        "at most 64 KiB, got '70")):
        with pytest.raises(InvalidInput, match=r"^CKPTDRAIN_EARLIER_STORES: expected") as err:
            _cfg(tmp_path, CKPTDRAIN_EARLIER_STORES=text)
        assert seen in str(err.value) and len(str(err.value)) < 500


def test_the_list_reads_back_as_written() -> None:
    assert parse("f", EARLIER)[0] == EarlierStore(OLD, 4200, "2026-11-29T10:00:00Z",
                                                  "bucket migration")
    assert parse("f", "") == () and parse("f", "[]") == ()


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CKPTDRAIN_")}
    (tmp_path / "store").mkdir(parents=True, exist_ok=True)
    base.update(CKPTDRAIN_WORK_DIR=str(tmp_path / "work"),
                CKPTDRAIN_LOCAL_DIR=str(tmp_path / "local"),
                CKPTDRAIN_STORE_URI=f"file://{tmp_path}/store", **env)
    proc = subprocess.run([sys.executable, "-m", "ckptdrain", "restore"], env=base,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, tmp_path / "work" / "restore.json"


def test_the_init_step_fails_with_exit_5_and_says_why(tmp_path: Path) -> None:
    proc, result = _run(tmp_path, CKPTDRAIN_EARLIER_STORES=EARLIER)
    assert proc.returncode == 5, proc.stderr
    doc = json.loads(result.read_text())
    assert (doc["outcome"], doc["fresh_start"]) == ("history_elsewhere", False)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ckptdrain restore: history_elsewhere: nothing under file://")
    assert f"step 4200 under {OLD}" in last and last.endswith("(exit 5)")


def test_skip_and_disabled_stay_deliberate_fresh_starts(tmp_path: Path) -> None:
    proc, result = _run(tmp_path / "a", CKPTDRAIN_EARLIER_STORES=EARLIER,
                        CKPTDRAIN_RESTORE_MODE="skip")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(result.read_text())["outcome"] == "fresh_start"
    proc, result = _run(tmp_path / "b", CKPTDRAIN_EARLIER_STORES=EARLIER,
                        CKPTDRAIN_RESTORE="false")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(result.read_text())["outcome"] == "disabled"


def test_a_list_restore_cannot_read_is_exit_2(tmp_path: Path) -> None:
    proc, _ = _run(tmp_path, CKPTDRAIN_EARLIER_STORES="[oops")
    assert proc.returncode == 2
    assert "CKPTDRAIN_EARLIER_STORES: expected a JSON list" in proc.stderr
