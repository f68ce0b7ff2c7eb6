"""Several writers after the policy's store moved: the ranks' decision of no
step is no fresh start while the history names checkpoints elsewhere, its
refusal says what this rank found, and the next try starts a new round
instead of joining the same decision again (restore/engine.py,
restore/coordinated.py, restore/agreement.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from tests.support.agent_config import agent_config

from ckptdrain import cli
from ckptdrain.contract.earlier_stores import EarlierStore, encode
from ckptdrain.node import config
from ckptdrain.restore import coordinated, engine
from ckptdrain.restore import meeting as meeting_mod
from ckptdrain.restore.agreement import Decision, Opened, Report, next_move, pod_digest
from ckptdrain.store.local import LocalStore

OLD = "s3://old-bucket/runs/ml/llama"


def _cfg(tmp_path: Path, history: bool = True) -> config.AgentConfig:
    env = {"CKPTDRAIN_STORE_URI": f"file://{tmp_path}/store",
           "CKPTDRAIN_WRITER_ID": "1", "CKPTDRAIN_WRITERS": "2"}
    if history:
        env["CKPTDRAIN_EARLIER_STORES"] = encode([EarlierStore(OLD, 4200, "")])
    return agent_config(tmp_path, **env)


def _decided(step: int | None) -> Decision:
    return Decision(1, step, "agreed", "every rank reported; no step every rank can get"
                    if step is None else f"step {step}", {0: pod_digest("uid-0"),
                                                          1: pod_digest("uid-1")},
                    1000.0, "r1-x")


@pytest.fixture
def agreeing(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The ranks' decision is the one the test sets; the failures noted are kept."""
    state: dict[str, Any] = {"decision": None, "noted": []}
    monkeypatch.setattr(coordinated, "coordinates", lambda cfg: True)
    monkeypatch.setattr(coordinated, "agree", lambda *a, **k: state["decision"])
    monkeypatch.setattr(coordinated, "note_failure",
                        lambda cfg, decision, held: state["noted"].append(decision))
    return state


def _push(tmp_path: Path, step: int) -> None:
    src = tmp_path / "src" / f"step-{step}"
    src.mkdir(parents=True)
    for w in range(2):
        (src / "w.bin").write_bytes(bytes([w]) * 100)
        assert cli.main(["push", str(src), f"file://{tmp_path}/store", "-q", "--create",
                         "--writer", str(w), "--writers", "2"]) == 0


def test_nothing_anywhere_and_no_step_agreed_is_history_elsewhere_and_a_new_round(
        tmp_path: Path, agreeing: Any) -> None:
    agreeing["decision"] = _decided(None)
    result, code = engine.restore(_cfg(tmp_path), LocalStore(tmp_path / "store"))
    assert (code, result.outcome) == (5, "history_elsewhere")
    assert result.reason.startswith(f"nothing under file://{tmp_path}/store, but")
    assert agreeing["noted"] == [agreeing["decision"]]


def test_a_decision_of_no_step_made_before_the_copy_landed_is_no_fresh_start(
        tmp_path: Path, agreeing: Any) -> None:
    _push(tmp_path, 4200)  # the copy landed after the ranks decided
    agreeing["decision"] = _decided(None)
    result, code = engine.restore(_cfg(tmp_path), LocalStore(tmp_path / "store"))
    assert (code, result.outcome, result.fresh_start) == (4, "none_verified", False)
    assert result.reason.startswith(
        "ranks agreed on no step in round 1 (every rank reported; no step every rank can "
        "get), but this rank found step(s) 4200 and this policy's checkpoints reached step "
        f"4200 under {OLD}")
    assert "nothing under" not in result.reason
    assert agreeing["noted"] == [agreeing["decision"]]
    # A new round agrees on the copy, and it is restored.
    agreeing["decision"] = _decided(4200)
    result, code = engine.restore(_cfg(tmp_path), LocalStore(tmp_path / "store"))
    assert (code, result.outcome, result.step) == (0, "restored", 4200)


def test_without_history_a_decision_of_no_step_is_the_fresh_start_it_was(
        tmp_path: Path, agreeing: Any) -> None:
    _push(tmp_path, 4200)
    agreeing["decision"] = _decided(None)
    result, code = engine.restore(_cfg(tmp_path, history=False), LocalStore(tmp_path / "store"))
    assert (code, result.outcome, result.fresh_start) == (0, "fresh_start", True)
    assert agreeing["noted"] == []


def test_an_agreed_step_older_than_the_history_is_refused_and_a_new_round_asked(
        tmp_path: Path, agreeing: Any) -> None:
    _push(tmp_path, 4000)
    agreeing["decision"] = _decided(4000)
    result, code = engine.restore(_cfg(tmp_path), LocalStore(tmp_path / "store"))
    assert (code, result.outcome, result.step) == (5, "history_elsewhere", None)
    assert result.reason.startswith("step 4000 is the newest this restore could use here")
    assert agreeing["noted"] == [agreeing["decision"]]


class FakeMeeting:
    """The Leases of one policy's meeting, in memory, through the same JSON."""

    def __init__(self) -> None:
        self.decided: str | None = None
        self.opened: str | None = None
        self.filed: dict[int, str] = {}

    def state(self) -> tuple[Decision | None, Opened | None, dict[str, Any] | None]:
        return (Decision.from_json(self.decided), Opened.from_json(self.opened), {})

    def own_report(self, rank: int) -> Report | None:
        return Report.from_json(self.filed.get(rank))

    def report(self, report: Report, pod: str | None = None) -> None:
        self.filed[report.rank] = report.to_json()

    def reports(self) -> dict[int, Report]:
        found = {r: Report.from_json(t) for r, t in self.filed.items()}
        return {r: rep for r, rep in found.items() if rep is not None}

    def write_decision(self, decision: Decision, read: Any) -> Decision:
        self.decided, self.opened = decision.to_json(), None
        return decision

    def open(self, round_: int, uid: str, read: Any, current: Any, now: float) -> bool:
        self.opened = Opened(round_, uid, now).to_json()
        return True


def test_a_pod_that_refused_a_fresh_start_meets_the_others_in_a_new_round(
        tmp_path: Path) -> None:
    cfg = dataclasses.replace(_cfg(tmp_path), pod_uid="uid-1", namespace="ml",
                              policy="llama")
    meet = FakeMeeting()
    meet.decided = _decided(None).to_json()
    held = coordinated.Holdings({}, (), ())
    meet.report(Report(1, 1, "uid-1"))
    now = [1010.0]
    args = {"rank": 1, "uid": "uid-1", "writers": 2, "uncoordinated": [],
            "timeout_s": 5.0, "clock": lambda: now[0], "monotonic": lambda: now[0],
            "sleep": lambda s: now.__setitem__(0, now[0] + max(s, 0.5))}
    # Without the failure noted, the retry joins the same decision.
    joined = meeting_mod.agree(meet, report_for=lambda r: Report(r, 1, "uid-1"), **args)
    assert (joined.how, joined.decision.step) == ("joined", None)
    coordinated.note_failure(cfg, _decided(None), held, meeting=meet)
    assert meet.own_report(1) is not None and meet.own_report(1).failed_fresh
    # Rank 0 failed the same way and reported in round 2, with the copy it sees.
    meet.report(Report(2, 0, "uid-0", complete=(4200,)))
    agreed = meeting_mod.agree(meet, report_for=lambda r: Report(r, 1, "uid-1",
                                                                 complete=(4200,)), **args)
    assert (agreed.decision.round, agreed.decision.step) == (2, 4200)
    assert meet.reports()[1].failed_fresh  # carried: it never falls back alone


def test_the_refused_fresh_start_rides_on_the_report() -> None:
    mine = Report(1, 1, "uid-1", failed_fresh=True)
    assert Report.from_json(mine.to_json()) == mine
    assert "failedFresh" not in Report(1, 1, "uid-1").to_json()  # older readers see the same
    nxt = next_move(_decided(None), mine, 1, "uid-1", now=1001.0)
    assert (nxt.move, nxt.round, nxt.may_fall_back) == ("report", 2, False)
    assert nxt.why == "this pod could not start fresh"
    # It says nothing of a decision with a step, nor does a failed step of one without.
    assert next_move(_decided(4200), mine, 1, "uid-1", now=1001.0).move == "join"
    stepped = Report(1, 1, "uid-1", failed=4200)
    assert next_move(_decided(None), stepped, 1, "uid-1", now=1001.0).move == "join"
    waiting = next_move(_decided(None), Report(2, 1, "uid-1", failed_fresh=True), 1, "uid-1",
                        now=1001.0)
    assert (waiting.move, waiting.may_fall_back) == ("wait", False)


def test_a_report_nested_too_deep_counts_as_no_report() -> None:
    assert Report.from_json('{"a":' * 50_000 + "1" + "}" * 50_000) is None
    assert Decision.from_json("[" * 100_000) is None
