"""`ckptdrain goodput`'s report (goodput_report.py) and restore's annotations."""

from __future__ import annotations

import json

import pytest

from ckptdrain import cli, goodput, goodput_report
from ckptdrain.contract.goodput import MAX_REASON, AgentView, PodView, RestoreView, parse_restore
from ckptdrain.restore.annotations import pod_annotations
from ckptdrain.restore.result import RestoreResult

T0 = 1_700_000_000.0
POLICY = {"metadata": {"namespace": "ml", "name": "llm", "creationTimestamp":
                       "2023-11-14T22:13:20Z"},
          "spec": {"writers": 1}, "status": {"lastLocalStep": 60, "lastGlobalStep": 50}}


def test_report_joins_status_and_live_pods() -> None:
    old = PodView("llm-0-a", "0", agent=AgentView(
        training_at=T0, first_step=0, interrupted_at=T0 + 100, step=57, step_s=0.5,
        completed=((50, T0 + 90),), newest_local=57))
    status = goodput.merge({}, [old], 50)
    policy = {**POLICY, "status": {**POLICY["status"], "goodput": status}}
    new = PodView("llm-0-b", "0", agent=AgentView(training_at=T0 + 108, blocked_s=4.0),
                  restore=RestoreView("restored", T0 + 104, 1.5, step=50, tier="local"))
    report = goodput_report.build(policy, [new], now=T0 + 1000)
    assert report["interruptions"] == 1 and report["lostSteps"] == 7
    assert report["recoverySeconds"] == 8 and report["blockedSeconds"] == 4
    # 4 s until the replacement ran (its restore's start: its node's time is
    # not known here) are not the job's; 10 s redone + 4 s restore and load +
    # 4 s blocked, of 996 s.
    assert report["waitingForResourcesSeconds"] == 4
    assert report["runtimeGoodput"] == round(1 - 18 / 996, 6)
    text = goodput_report.text(report)
    assert "CheckpointPolicy ml/llm" in text and "98.19%" in text
    assert "waiting for resources 4s (interruption → replacement pod on a node" in text
    assert "llm-0-a / 0" in text and "50 (local)" in text and "7 / 10s" in text
    assert "replacement pod on a node after 4s, restoring after 4s" in text
    json.dumps(report)  # the --output json form


def test_report_names_a_failed_restore() -> None:
    failure = {"pod": "llm-0-b", "outcome": "store_unavailable", "reason": "S3 is down"}
    policy = {**POLICY, "status": {**POLICY["status"], "lastRestoreFailure": failure}}
    text = goodput_report.text(goodput_report.build(policy, [], now=T0 + 10))
    assert "last failed restore   pod llm-0-b: store_unavailable: S3 is down" in text


def test_restore_annotates_failures_too() -> None:
    ok = RestoreResult(False, 0, 1, T0, outcome="restored", step=5, tier="global", seconds=2.0)
    out = pod_annotations(ok, 0, T0 + 2)
    assert out["ckptdrain.io/restored-from"] == "step=5 tier=global"
    view = parse_restore(out["ckptdrain.io/restore-result"])
    assert view == RestoreView("restored", T0, 2.0, step=5, tier="global")
    bad = RestoreResult(False, 0, 1, T0, outcome="store_unavailable", reason="x" * 1000,
                        seconds=30.0, attempts=7)
    out = pod_annotations(bad, 3, T0 + 30)
    assert "ckptdrain.io/restored-from" not in out
    view = parse_restore(out["ckptdrain.io/restore-result"])
    assert view is not None and view.failed and view.attempts == 7
    assert len(view.reason) == MAX_REASON


@pytest.mark.parametrize(("argv", "field"), [
    (["goodput", "--output", "yaml"], "--output"),
    (["goodput", "--policy", "Not_A_Name"], "--policy"),
    (["goodput", "-n", "ml", "-A"], "--all-namespaces"),
])
def test_bad_flags_exit_2_naming_the_field_before_any_cluster_read(
        argv: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ckptdrain: error: {field}: expected ") and err.count("\n") == 1


def test_report_says_which_step_a_restart_restores_with_and_without_a_node() -> None:
    status = {**POLICY["status"], "recoveryPointTime": "2023-11-14T22:20:00Z"}
    text = goodput_report.text(goodput_report.build({**POLICY, "status": status}, [], T0))
    assert ("recovery point        local step 60 with every node intact; global step 50 "
            "(at 2023-11-14T22:20:00Z) after a node loss") in text
    peer = {**status, "recoveryPointOnNodeLoss": 58}
    text = goodput_report.text(goodput_report.build({**POLICY, "status": peer}, [], T0))
    assert ("local step 60 with every node intact; step 58 after a node loss (peer tier); "
            "global step 50") in text
