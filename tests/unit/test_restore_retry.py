"""Restore against a store that does not answer: retried with jittered,
capped back-off until restore.retryDeadline, never a fall-back to an older
step; and the annotation that asks for a deliberate fresh start."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from tests.support.agent_config import agent_config
from tests.support.faults import FaultyStore

from ckptdrain.errors import ObjectMissing
from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore import command, retry
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


class RangedFaults(FaultyStore):
    """Faults on the ranged read the fetch uses on stores that offer it."""

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int:
        self._enter("get_range_into")
        return int(self.inner.get_range_into(key, start, buffer))


def _cfg(tmp_path: Path, **env: str) -> config.AgentConfig:
    return agent_config(tmp_path, **env)


def _source(tmp_path: Path, name: str, content: bytes) -> Path:
    src = tmp_path / "src" / name
    src.mkdir(parents=True)
    (src / "w.bin").write_bytes(content)
    return src


def _push(tmp_path: Path, store: LocalStore, step: int, content: bytes) -> None:
    src = _source(tmp_path, f"push-{step}", content)
    Drainer(store).drain(src, build_manifest(src, step, 0, 1, created=1.0),
                         journal_path=tmp_path / f"j-{step}")


def test_delays_grow_double_are_capped_and_jittered_in_their_upper_half() -> None:
    rng = random.Random(7)
    for attempt, ceiling in ((1, 1.0), (2, 2.0), (3, 4.0), (6, 30.0), (40, 30.0)):
        waits = [retry.delay(attempt, rng) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits), (attempt, min(waits))
        assert len(set(waits)) > 100  # jittered: writers do not knock in step


def test_until_deadline_makes_its_last_try_on_the_deadline_and_says_it_gave_up() -> None:
    clock = FakeClock()
    tries: list[float] = []
    done = retry.until_deadline(lambda n: tries.append(clock()) or "down", lambda v: True, 60.0,
                                clock=clock, sleep=clock.sleep, rng=random.Random(1))
    assert done.gave_up and done.attempts == len(tries) > 3
    assert tries[-1] == 60.0 and sum(clock.waits) == 60.0


def test_until_deadline_zero_is_one_try_and_a_good_answer_ends_at_once() -> None:
    clock = FakeClock()
    done = retry.until_deadline(lambda n: "down", lambda v: True, 0.0,
                                clock=clock, sleep=clock.sleep, rng=random.Random(1))
    assert (done.attempts, done.gave_up, clock.waits) == (1, True, [])
    done = retry.until_deadline(lambda n: "up" if n == 3 else "down", lambda v: v == "down",
                                60.0, clock=clock, sleep=clock.sleep, rng=random.Random(1))
    assert (done.value, done.attempts, done.gave_up) == ("up", 3, False)


def test_a_store_down_for_a_while_is_waited_for_then_restored(tmp_path: Path) -> None:
    inner = LocalStore(tmp_path / "store")
    _push(tmp_path, inner, 5, b"five" * 1000)
    store = FaultyStore(inner)
    store.fail("list", times=3)  # the catalog cannot be listed three times over
    clock = FakeClock()
    result, code = command.restore_with_retries(
        _cfg(tmp_path), lambda cfg: (store, None), clock=clock, sleep=clock.sleep,
        rng=random.Random(3))
    assert (code, result.outcome, result.step, result.attempts) == (0, "restored", 5, 4)
    assert len(clock.waits) == 3 and (tmp_path / "work" / "step-5" / "w.bin").exists()


def test_a_store_down_past_the_deadline_fails_with_exit_3_saying_so(tmp_path: Path) -> None:
    clock = FakeClock()
    result, code = command.restore_with_retries(
        _cfg(tmp_path, CKPTDRAIN_RESTORE_RETRY_DEADLINE="2m"),
        lambda cfg: (None, "cannot open s3://b/p: endpoint did not answer"),
        clock=clock, sleep=clock.sleep, rng=random.Random(3))
    assert (code, result.outcome, result.fresh_start) == (3, "store_unavailable", False)
    assert clock.now == 120.0 and result.attempts == len(clock.waits) + 1
    assert "did not answer" in result.reason and "gave up after" in result.reason
    assert "restore.retryDeadline 2m" in result.reason


def test_a_store_that_cannot_be_configured_is_not_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A password in the endpoint (refused, redacted) is configuration: no
    # later try can open the store, so restore fails at once with exit 3.
    clock = FakeClock()
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://user:hunter2@127.0.0.1:1")
    cfg = _cfg(tmp_path, CKPTDRAIN_STORE_URI="s3://bucket/run")
    result, code = command.restore_with_retries(cfg, clock=clock, sleep=clock.sleep,
                                                rng=random.Random(3))
    assert (code, result.outcome, result.attempts) == (3, "store_unavailable", 1)
    assert clock.waits == [] and "hunter2" not in result.reason
    assert "invalid configuration" in result.reason


def test_a_store_failing_mid_fetch_never_falls_back_to_an_older_local_step(
        tmp_path: Path) -> None:
    inner = LocalStore(tmp_path / "store")
    _push(tmp_path, inner, 5, b"five" * 1000)
    LocalTier(tmp_path / "local").capture(_source(tmp_path, "old", b"four" * 1000), 4,
                                          writer=0, writers=1)
    store = RangedFaults(inner)
    store.fail("get_range_into", times=1)  # the listing works; the fetch of step 5 does not
    result, code = command.restore(_cfg(tmp_path), store)
    assert (code, result.outcome, result.step) == (3, "store_unavailable", None)
    assert "mid-restore" in result.reason and "step 5" in result.reason
    assert not (tmp_path / "work" / "step-4").exists()
    # Asked again (the store answers now): the newest step, not the older local one.
    result, code = command.restore(_cfg(tmp_path), store)
    assert (code, result.step, result.tier) == (0, 5, "global")


def test_a_missing_object_is_not_transient_the_next_candidate_is_tried(tmp_path: Path) -> None:
    inner = LocalStore(tmp_path / "store")
    _push(tmp_path, inner, 5, b"five" * 1000)
    LocalTier(tmp_path / "local").capture(_source(tmp_path, "old", b"four" * 1000), 4,
                                          writer=0, writers=1)
    store = RangedFaults(inner)
    store.fail("get_range_into", times=1, error=lambda: ObjectMissing("gone"))
    result, code = command.restore(_cfg(tmp_path), store)
    assert (code, result.step, result.tier) == (0, 4, "local")


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> int:
    for key in list(os.environ):
        if key.startswith("CKPTDRAIN_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CKPTDRAIN_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("CKPTDRAIN_LOCAL_DIR", str(tmp_path / "local"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return command.main([])


def test_the_skip_annotation_is_a_fresh_start_that_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    LocalTier(tmp_path / "local").capture(_source(tmp_path, "s", b"x" * 1000), 9,
                                          writer=0, writers=1)
    stale = tmp_path / "work" / "step-8"
    stale.mkdir(parents=True)
    (stale / "w.bin").write_bytes(b"old timeline")
    message = tmp_path / "termination-log"
    message.write_text("")
    monkeypatch.setattr(command, "TERMINATION_LOG", message)
    assert _run(tmp_path, monkeypatch, CKPTDRAIN_RESTORE_MODE="skip") == 0
    doc = json.loads((tmp_path / "work" / "restore.json").read_text())
    assert (doc["outcome"], doc["fresh_start"], doc["step"]) == ("fresh_start", True, None)
    assert doc["reason"] == "skipped by annotation"
    assert not stale.exists()  # nothing of the old timeline for the trainer to find
    assert "skipped by annotation" in message.read_text()
    assert "skipped by annotation" in capsys.readouterr().out


def test_a_mistyped_annotation_stops_restore_with_one_line_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(tmp_path, monkeypatch, CKPTDRAIN_RESTORE_MODE="Skip") == 2
    err = capsys.readouterr().err
    assert "ckptdrain.io/restore" in err and "'skip'" in err and "Traceback" not in err
    assert not (tmp_path / "work" / "restore.json").exists()


def test_the_reason_of_a_failure_is_the_termination_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_bytes(b"")
    message = tmp_path / "termination-log"
    message.write_text("")
    monkeypatch.setattr(command, "TERMINATION_LOG", message)
    assert _run(tmp_path, monkeypatch, CKPTDRAIN_STORE_URI=f"file://{tmp_path}/file/store",
                CKPTDRAIN_RESTORE_RETRY_DEADLINE="0") == 3
    text = message.read_text()
    assert text.startswith("ckptdrain restore: store_unavailable:") and "exit 3" in text


def test_no_termination_log_is_created_outside_a_pod(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "TERMINATION_LOG", tmp_path / "absent")
    assert _run(tmp_path, monkeypatch) == 0
    assert not (tmp_path / "absent").exists()
