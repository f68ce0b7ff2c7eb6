"""The scenario's goodput checks: what the policy status and `ckptdrain goodput`
report about an interruption equals what the trainers logged.

Steps are exact: the trainer's newest step at SIGTERM (its emergency save)
minus the step the replacement restored (0 when that is the emergency step
itself: ranks that all saved it restore it, and nothing is redone). Times
are compared with TOLERANCE_S: every time involved is read from one clock
(the cluster's nodes share the host's), so the only gaps are
between the trainer's log line and the client's own reading of the clock
around the same event: the SIGTERM handler (microseconds apart), the first
step after the restore (at most one step of the shared clock, STEP_S, after
the `start` line), and a save (the client notes completion before the
trainer hashes the files and logs it, or restore takes the capture time,
within the agent's 0.2 s poll). Half a second bounds each of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from kube import wait_for
from trainers import Logs
from views import NS, POLICY, STEP_S, policy_status

TOLERANCE_S = 0.5
assert STEP_S < TOLERANCE_S


def _saved_at(logs: Logs, pods: list[str], step: int, before: float) -> float | None:
    """When a pod of this writer logged the save of `step` (the newest before `before`)."""
    times = [e["at"] for pod in pods for e in logs.trainer(pod)
             if e["event"] == "save" and e["step"] == step and e["at"] <= before]
    return max(times, default=None)


def interruption(logs: Logs, old: str, new: str, writer_pods: list[str], load: dict[str, Any],
                 report: list[str], check: Callable[[object, str], None],
                 policy: str = POLICY) -> dict[str, Any]:
    """The status entry of `old`'s interruption, checked against the trainer logs."""
    sigterm = next(e for e in logs.trainer(old) if e["event"] == "sigterm")
    resume = wait_for(f"{new} resumes", lambda: next(
        (e for e in logs.trainer(new) if e["event"] == "resume"), None), 60)
    entry = wait_for(f"status.goodput: {old}'s interruption, training again", lambda: next(
        (e for e in (policy_status(policy).get("goodput") or {}).get("recent") or []
         if e.get("pod") == old and e.get("recoverySeconds") is not None), None), 60, 1)
    lost = sigterm["step"] - load["step"]
    check(entry["step"] == sigterm["step"] and entry["restoredStep"] == load["step"]
          and entry["lostSteps"] == lost and entry["restoredTier"] == load["tier"]
          and entry["restorePod"] == new,
          f"goodput: {old} interrupted at step {entry['step']}, {new} restored step "
          f"{entry['restoredStep']} from the {entry['restoredTier']} tier: {entry['lostSteps']} "
          f"steps lost, as the trainers logged ({sigterm['step']} - {load['step']})")
    logged_recovery = resume["at"] - sigterm["at"]
    check(abs(entry["recoverySeconds"] - logged_recovery) <= TOLERANCE_S,
          f"goodput: interruption → training again {entry['recoverySeconds']:.2f} s; the "
          f"trainers logged {logged_recovery:.2f} s (± {TOLERANCE_S} s)")
    waited = entry.get("waitingSeconds")
    check(waited is not None and 0 <= waited <= entry["recoverySeconds"],
          f"goodput: {new} had its node {waited} s after the interruption (waiting for "
          f"resources, beside the ratio), within the {entry['recoverySeconds']:.2f} s to "
          "training again")
    if load["step"] == sigterm["step"]:
        # The emergency step itself, saved after SIGTERM: no training redone.
        logged_lost = 0.0
    else:
        saved = _saved_at(logs, writer_pods, load["step"], sigterm["at"])
        check(saved is not None, f"a trainer log holds the save of step {load['step']}")
        logged_lost = sigterm["at"] - saved  # type: ignore[operator]
    check(abs(entry["lostSeconds"] - logged_lost) <= TOLERANCE_S,
          f"goodput: {entry['lostSeconds']:.2f} s of training lost; the trainers logged "
          f"{logged_lost:.2f} s from the save of step {load['step']} to SIGTERM "
          f"(± {TOLERANCE_S} s)")
    report.append(f"| goodput: {old} → {new} ({entry['restoredTier']}) | {entry['lostSteps']} "
                  f"steps / {entry['lostSeconds']:.1f} s lost, training again after "
                  f"{entry['recoverySeconds']:.1f} s (trainer logs: {lost} steps, "
                  f"{logged_lost:.1f} s, {logged_recovery:.1f} s) |")
    return entry


def cli(report: list[str], check: Callable[[object, str], None], say: Callable[[str], None],
        interruptions: int) -> None:
    """`ckptdrain goodput` reads the same figures from the cluster; its text is printed."""
    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "ckptdrain", "goodput", "-n", NS,
                               "--policy", POLICY, *args], capture_output=True, text=True,
                              env=os.environ, timeout=60)
        check(done.returncode == 0, f"ckptdrain goodput {' '.join(args)} exits 0 "
              f"({done.stderr.strip()[-200:]})")
        return done.stdout

    (doc,) = json.loads(run("--output", "json"))["policies"]
    status = policy_status().get("goodput") or {}
    check(doc["interruptions"] == interruptions and doc["lostSteps"] >= status["lostSteps"]
          and doc["runtimeGoodput"] is not None and 0 < doc["runtimeGoodput"] < 1,
          f"ckptdrain goodput: {doc['interruptions']} interruptions, {doc['lostSteps']} steps "
          f"lost, runtime goodput {100 * doc['runtimeGoodput']:.1f}% (status: "
          f"{status['lostSteps']} steps)")
    text = run()
    say("  ckptdrain goodput:\n" + "\n".join("    " + line for line in text.splitlines()))
    report.append(f"| runtime goodput (`ckptdrain goodput`) | "
                  f"{100 * doc['runtimeGoodput']:.1f}% over {doc['availableSeconds']:.0f} s "
                  f"with the job's resources ({doc['waitingForResourcesSeconds']:.1f} s "
                  f"waiting for them beside it): "
                  f"{doc['interruptions']} interruptions, {doc['lostSteps']} steps lost, "
                  f"{doc['recoverySeconds']:.1f} s to training again, "
                  f"{doc['blockedSeconds']:.1f} s blocked in saves |")
