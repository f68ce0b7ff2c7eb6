"""The JobSet step's gang restart: `failurePolicy.maxRestarts: 1` on the real
JobSet controller, every rank back at one agreed step.

On the JobSet the JobSet step runs (4 writers, e2e/scenario/jobset.py), once
its first step is committed and every writer's agent holds a step locally,
writer 1's trainer fails (an interrupt to its PID 1: a traceback and exit
130, not the 143 of a preemption). The Job's podFailurePolicy fails the Job
on that exit code, so JobSet restarts the whole gang: every Job is recreated, the three other
trainers get SIGTERM and save their own emergency steps, which no other rank
has. Asserted: the JobSet counted one restart; all 4 new pods restore the
same step, each with the state its own writer saved there, the newest step
all 4 old agents had captured; their restores say every rank reported in one
round; and training goes on (a newer step complete for all 4 writers).

    run(logs, pods, epoch, report, say, check)   pods: writer -> running pod
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import jobset
from agreement import agreement_of, local_steps, saves
from kube import get, kubectl, wait_for
from trainers import Logs
from views import GRACE, NS, mid_interval

#: Run in writer 1's trainer container: SIGINT to its PID 1, the simulated
#: trainer, which has no handler for it: KeyboardInterrupt, exit 130.
FAIL_TRAINER = (
    "import os, signal, sys\n"
    "cmd = open('/proc/1/cmdline', 'rb').read()\n"
    "if b'ckptdrain.demo.trainer' not in cmd:\n"
    "    sys.exit(f'PID 1 is not the trainer: {cmd!r}')\n"
    "os.kill(1, signal.SIGINT)\n")
FAILED_EXIT = 130
FAILING = 1
#: How long a restoring rank waits for the others' reports (the policy's
#: restore.agreementTimeout, left at its default).
AGREE_TIMEOUT_S = 60.0

Say = Callable[[str], None]
Check = Callable[[object, str], None]
Pods = dict[int, dict[str, Any]]


def names_of(pods: Pods) -> dict[int, str]:
    return {w: p["metadata"]["name"] for w, p in pods.items()}


def common_local(logs: Logs, names: Iterable[str]) -> set[int]:
    """Steps every one of these pods' agents captured on its node's local tier."""
    return set.intersection(*(local_steps(logs, n) for n in names))


def trainer_exit(name: str) -> int | None:
    """The exit code of the pod's (first) trainer container, once it ended."""
    pods = get("pods", "-n", NS, "--field-selector", f"metadata.name={name}")["items"]
    for status in (pods[0]["status"].get("containerStatuses") or []) if pods else []:
        ended = (status.get("state") or {}).get("terminated") or (
            status.get("lastState") or {}).get("terminated")
        if status["name"] == "trainer" and ended:
            return int(ended["exitCode"])
    return None


def run(logs: Logs, pods: Pods, epoch: float, report: list[str], say: Say,
        check: Check) -> Pods:
    say(f"  J2. gang restart (failurePolicy.maxRestarts: 1): writer {FAILING}'s trainer fails")
    old = names_of(pods)

    def held() -> int | None:
        # Between two scheduled saves, so the newest step every agent holds
        # is still that at the failure.
        steps = common_local(logs, old.values())
        return max(steps) if steps and mid_interval(epoch) else None
    held_then = wait_for("a step every writer's agent captured", held, 90)
    failed = time.time()
    kubectl("exec", "-n", NS, old[FAILING], "-c", "trainer", "--", "python3", "-c",
            FAIL_TRAINER, timeout=30)
    say(f"  SIGINT to {old[FAILING]}'s trainer (every writer holds step {held_then})")
    code = wait_for(f"{old[FAILING]}: its trainer exited", lambda: trainer_exit(
        old[FAILING]), 30, every=0.5)
    check(code == FAILED_EXIT, f"{old[FAILING]}: trainer exited {code}, a failure, not "
          f"an interruption (143)")
    restarts = wait_for("JobSet restarting the gang", lambda: (get(
        "jobset", "-n", NS, jobset.NAME).get("status") or {}).get("restarts"), 60)
    check(restarts == 1, f"JobSet {jobset.NAME}: status.restarts {restarts}")
    wait_for("every old pod gone", lambda: not set(old.values()) & {
        p["metadata"]["name"] for p in get("pods", "-n", NS, "-l", jobset.SELECT)["items"]},
        GRACE + 60, every=1)
    history = {w: saves(logs, n) for w, n in old.items()}
    emergency = {w: e["step"] for w, n in old.items() for e in logs.trainer(n)
                 if e["event"] == "save" and e["reason"] == "sigterm"}
    newest = max(common_local(logs, old.values()))
    new = wait_for("4 new pods running", lambda: (p := jobset.running_pods()) and sorted(
        p) == list(range(jobset.WRITERS)) and not set(old.values()) & set(
        names_of(p).values()) and p, 180, every=1)
    for name in names_of(new).values():
        logs.follow(name)
    loaded = {w: wait_for(f"{name} restored", lambda name=name: next(
        (e for e in logs.trainer(name) if e["event"] in ("load", "fresh")), None),
        AGREE_TIMEOUT_S + 60) for w, name in names_of(new).items()}
    steps = {w: e.get("step") for w, e in loaded.items()}
    check(all(e["event"] == "load" for e in loaded.values()) and len(set(steps.values())) == 1,
          f"every rank restored the same step: {steps} "
          f"(tiers {[e.get('tier') for e in loaded.values()]}; emergency steps {emergency})")
    step = int(steps[0])
    for w, e in sorted(loaded.items()):
        check(e["hash"] == history[w].get(step), f"writer {w} ({names_of(new)[w]}): state "
              f"hash equal to what writer {w} saved at step {step}")
    check(step == newest, f"step {step} is the newest step all 4 old agents captured "
          f"({newest}), not any rank's own emergency step")
    said = {w: wait_for(f"{n}: the agreement in its restore's log", lambda n=n:
                        agreement_of(logs, n), 30) for w, n in names_of(new).items()}
    check(all(a["why"] == "agreed" for a in said.values())
          and len({a["round"] for a in said.values()}) == 1,
          f"the ranks agreed in round {said[0]['round']}: {said[0]['detail']}")
    # Training goes on: a newer step committed by all 4 writers (the
    # trainers' saves while they catch up with the clock are not enough).
    after = wait_for(f"a step after {step} complete for all 4 writers", lambda: [
        s for s in jobset.complete_steps() if s > step], 90, every=1)
    check(all(any(s >= after[0] for s in saves(logs, n)) for n in names_of(new).values()),
          f"training went on: step {after[0]} complete for all 4 writers after the restart")
    report.append(f"| JobSet: gang restart (maxRestarts 1), writer {FAILING} failed → all 4 "
                  f"at step {step} ({loaded[0].get('tier')} tier, round {said[0]['round']}) | "
                  f"failure → every trainer loaded "
                  f"{max(e['at'] for e in loaded.values()) - failed:.1f} s |")
    return new
