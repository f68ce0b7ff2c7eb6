"""The rules by which ranks agree on one restore step (restore/agreement.py)."""

from __future__ import annotations

import pytest

from ckptdrain.restore.agreement import (
    Decision,
    Report,
    agreed_step,
    decide,
    fallback,
    next_move,
    pod_digest,
)


def rep(rank: int, local: dict[int, str] | None = None, *, round_: int = 1,
        uid: str | None = None, peer: tuple[int, ...] = (), complete: tuple[int, ...] = (),
        failed: int | None = None) -> Report:
    return Report(round=round_, rank=rank, uid=uid or f"uid-{rank}", local=local or {},
                  peer=peer, complete=complete, failed=failed)


def decision(round_: int = 3, step: int | None = 100, members: dict[int, str] | None = None,
             at: float = 1000.0, why: str = "agreed") -> Decision:
    members = members if members is not None else {0: "uid-0", 1: "uid-1"}
    return Decision(round_, step, why, "", {r: pod_digest(u) for r, u in members.items()},
                    at, f"r{round_}-x")


# -- which step ------------------------------------------------------------------

def test_the_newest_step_every_rank_holds_locally_beats_the_newest_global_one() -> None:
    reports = {0: rep(0, {100: "t", 90: "t"}, complete=(50,)),
               1: rep(1, {100: "t", 90: "t"}, complete=(50,))}
    assert agreed_step(reports, 2) == 100


def test_a_rank_on_a_new_node_pulls_the_agreement_down_to_what_it_can_get() -> None:
    reports = {0: rep(0, {100: "t", 90: "t"}, complete=(50,)),
               1: rep(1, {}, complete=(50,))}
    assert agreed_step(reports, 2) == 50
    # ... unless a peer holds its copy of a newer step.
    reports[1] = rep(1, {}, peer=(90,), complete=(50,))
    assert agreed_step(reports, 2) == 90


def test_copies_from_two_timelines_are_never_mixed() -> None:
    reports = {0: rep(0, {100: "new", 90: "old"}), 1: rep(1, {100: "old", 90: "old"})}
    assert agreed_step(reports, 2) == 90
    untagged = {0: rep(0, {100: ""}), 1: rep(1, {100: ""})}
    assert agreed_step(untagged, 2) is None  # no timeline: nothing proves they match


def test_a_globally_complete_step_needs_no_timeline() -> None:
    reports = {0: rep(0, {100: "a"}, complete=(100,)), 1: rep(1, {100: "b"})}
    assert agreed_step(reports, 2) == 100  # one commit: one timeline


def test_nothing_agreed_while_a_rank_is_missing() -> None:
    assert agreed_step({0: rep(0, {100: "t"})}, 2) is None
    assert decide({0: rep(0, {100: "t"})}, 2, 1, 5.0, "r1") is None


def test_decide_counts_only_this_rounds_reports() -> None:
    stale = rep(1, {100: "t"}, round_=1, uid="old-1")
    reports = {0: rep(0, {100: "t"}, round_=2), 1: stale}
    assert decide(reports, 2, 2, 5.0, "r2") is None
    reports[1] = rep(1, {100: "t"}, round_=2)
    made = decide(reports, 2, 2, 5.0, "r2-x")
    assert made is not None and made.step == 100 and made.why == "agreed"
    assert made.members == {0: pod_digest("uid-0"), 1: pod_digest("uid-1")}
    assert "newer than any global" in made.detail


def test_fallback_is_the_newest_global_step_and_names_the_missing_ranks() -> None:
    reports = {0: rep(0, {100: "t"}, complete=(40,), round_=4)}
    made = fallback(reports, 3, 4, 9.0, [50], 120.0, "r4-y")
    assert made.step == 50 and made.why == "fallback" and made.members == {0: pod_digest("uid-0")}
    assert "ranks 1, 2 did not report within 120s" in made.detail
    assert fallback({}, 2, 1, 9.0, [], 5.0, "r1").step is None


# -- which round -----------------------------------------------------------------

def test_no_decision_yet_starts_round_one() -> None:
    assert (next_move(None, None, 0, "u", 10.0).move, next_move(None, None, 0, "u", 10.0).round) \
        == ("report", 1)


def test_a_new_pod_generation_starts_a_new_round() -> None:
    d = decision()
    nxt = next_move(d, rep(1, round_=3), 1, "uid-1-new", now=1001.0)
    assert (nxt.move, nxt.round) == ("report", 4)


def test_the_same_pod_retrying_joins_its_decision_while_it_is_young() -> None:
    d = decision()
    nxt = next_move(d, rep(1, round_=3), 1, "uid-1", now=1100.0)
    assert nxt.move == "join" and nxt.decision == d
    # Its init containers again long after (a node rebooted under the pod).
    assert next_move(d, rep(1, round_=3), 1, "uid-1", now=99999.0).move == "report"


def test_a_pod_that_could_not_get_the_decided_step_starts_a_new_round() -> None:
    d = decision()
    nxt = next_move(d, rep(1, round_=3, failed=100), 1, "uid-1", now=1001.0)
    assert (nxt.move, nxt.round) == ("report", 4)
    assert not nxt.may_fall_back  # the others restored 100: never settle alone
    joiner = decision(members={0: "uid-0", 1: "uid-1"}, why="fallback")
    nxt = next_move(joiner, rep(1, round_=3, failed=100), 1, "uid-1", now=1001.0)
    assert (nxt.move, nxt.round) == ("report", 4)
    waiting = next_move(joiner, rep(1, round_=4, failed=100), 1, "uid-1", now=1001.0)
    assert (waiting.move, waiting.may_fall_back) == ("wait", False)


def test_a_late_rank_joins_a_fallback_made_without_it_within_the_window() -> None:
    d = decision(members={0: "uid-0"}, why="fallback")
    assert next_move(d, None, 1, "uid-1", now=1010.0, join_window=600).move == "join"
    late = next_move(d, None, 1, "uid-1", now=1700.0, join_window=600)
    assert (late.move, late.round) == ("report", 4)


def test_a_rank_whose_previous_pod_joined_late_starts_a_new_round() -> None:
    d = decision(members={0: "uid-0"}, why="fallback").with_member(1, "uid-1-old")
    assert next_move(d, None, 1, "uid-1-new", now=1001.0).move == "report"
    assert next_move(d, None, 1, "uid-1-old", now=1100.0).move == "join"


def test_a_pod_that_already_reported_waits_in_its_round() -> None:
    d = decision()
    nxt = next_move(d, rep(1, round_=4, uid="uid-1-new"), 1, "uid-1-new", now=1001.0)
    assert (nxt.move, nxt.round) == ("wait", 4)


# -- on the wire -----------------------------------------------------------------

def test_reports_and_decisions_survive_the_round_trip() -> None:
    r = rep(3, {7: "t", 5: ""}, round_=2, peer=(6,), complete=(4, 2), failed=7)
    assert Report.from_json(r.to_json()) == r
    d = decision()
    assert Decision.from_json(d.to_json()) == d


@pytest.mark.parametrize("text", [None, "", "[]", "{}", '{"round": -1, "rank": 0, "uid": "u"}',
                                  '{"round": 1, "rank": true, "uid": "u"}',
                                  '{"round": 1, "rank": 0, "uid": ""}',
                                  '{"round": 1, "rank": 0, "uid": "u", "local": {"x": "t"}}',
                                  "x" * 70000])
def test_a_malformed_report_counts_as_none(text: object) -> None:
    assert Report.from_json(text) is None


def test_a_report_keeps_only_its_newest_steps() -> None:
    r = rep(0, {s: "t" for s in range(100)}, complete=tuple(range(100)))
    back = Report.from_json(r.to_json())
    assert back is not None and min(back.local) == 84 and min(back.complete) == 84


# -- running ranks that wait at their step ---------------------------------------

def test_a_rank_waiting_at_its_restored_step_pins_the_agreement() -> None:
    running = rep(0, {100: "t", 90: "t"}, round_=2)
    running = Report(**{**running.__dict__, "pinned": 100})
    corrupt = rep(1, {90: "t"}, round_=2)  # its copy of 100 failed and is gone
    assert agreed_step({0: running, 1: corrupt}, 2) is None
    assert decide({0: running, 1: corrupt}, 2, 2, 5.0, "r2") is None  # undecided: wait
    whole = rep(1, {100: "t", 90: "t"}, round_=2)
    assert agreed_step({0: running, 1: whole}, 2) == 100


def test_a_large_decision_stays_small() -> None:
    d = Decision(1, 5, "agreed", "", {r: pod_digest(f"uid-{r}") for r in range(5000)}, 1.0, "t")
    text = d.to_json()
    assert len(text) < 64 * 1024 and Decision.from_json(text) == d


def test_a_fall_back_keeps_to_the_step_a_round_restored_moments_ago() -> None:
    from ckptdrain.restore.agreement import held_back

    before = decision(step=80, at=1000.0)
    assert held_back(before, rep(1, {80: "t"}), now=1010.0) == (True, 80)
    assert held_back(before, rep(1, {70: "t"}, complete=(50,)), now=1010.0) == (False, 80)
    assert held_back(before, rep(1, {}), now=1000.0 + 3600) is None  # long ago: free
    assert held_back(None, rep(1, {}), now=1.0) is None
