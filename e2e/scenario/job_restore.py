"""Steps 5-7: trainer pods deleted under the Job, each emergency checkpoint
durable and drained within the grace period, and each replacement restoring
the right step from the right tier (local; S3 after a wipe; S3 again after a
corrupted local copy, full run only)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import agreement
import corruption
import goodput_check
from kube import Failed, get, kubectl, wait_for
from narration import REPORT, check, say
from trainers import Logs
from views import (
    EVERY,
    GRACE,
    JOB,
    NS,
    complete_steps,
    pod_of,
    policy_status,
    ranks_in,
    records,
    wait_mid_interval,
)

#: Writer 0's state hash of every step it saved, across its pods, oldest pod first
#: (a later pod re-saving a step overwrites it everywhere, and here too).
HISTORY: dict[int, str] = {}


def saves(logs: Logs, pod: str) -> dict[int, str]:
    return {e["step"]: e["hash"] for e in logs.trainer(pod) if e["event"] == "save"}

def emergency(logs: Logs, old: str, deleted_at: float) -> int:
    save = wait_for(f"{old}: emergency checkpoint", lambda: next(
        (e for e in logs.trainer(old) if e["event"] == "save" and e["reason"] == "sigterm"),
        None), GRACE)
    def state(name: str) -> dict[str, Any] | None:
        return next((e for e in logs.agent(old) if e["step"] == save["step"]
                     and e["state"] == name), None)

    # The agent is a native sidecar: it is stopped after the trainer, so it usually
    # captures the emergency checkpoint in its normal loop, then flushes on its SIGTERM.
    local = wait_for(f"{old}: emergency step captured", lambda: state("Local"), GRACE)
    check(local, f"{old}: emergency step {save['step']} captured durably on the local tier "
          f"{local['at'] - deleted_at:.2f}s after the delete")
    glob = wait_for(f"{old}: emergency step drained", lambda: state("Global"),
                    max(1.0, deleted_at + GRACE + 5 - time.time()))
    check(glob["at"] - deleted_at < GRACE, f"{old}: emergency step {save['step']} on S3 "
          f"{glob['at'] - deleted_at:.2f}s after the delete (grace period {GRACE}s)")
    return int(save["step"])


def step5_6(logs: Logs, pods: dict[int, str], epoch: float, goes_on: bool) -> dict[int, str]:
    say("5. delete one trainer pod: emergency checkpoint durable and drained in the grace period")
    old = pods[0]
    before = saves(logs, old)
    complete = complete_steps()
    wait_mid_interval(epoch)
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, old, "--wait=false")
    say(f"  deleted {old}")
    step = emergency(logs, old, deleted)
    events: dict[str, Any] = {e["state"]: e for e in logs.agent(old) if e["step"] == step}
    local, glob = events["Local"], events["Global"]
    REPORT.append(f"| SIGTERM → emergency checkpoint durable on the local tier | "
                  f"{local['at'] - deleted:.2f} s (capture {local.get('seconds') or 0:.2f} s) |")
    REPORT.append(f"| SIGTERM → emergency checkpoint on S3 | {glob['at'] - deleted:.2f} s "
                  f"(drain {glob.get('seconds') or 0:.2f} s; grace period {GRACE} s) |")
    # The deleted pod's last word (its Global, written as it stopped) is
    # folded into the record although the pod is gone.
    record = wait_for(f"writer 0 Global in the record of step {step}",
                      lambda: (r := records().get(step)) and 0 in ranks_in(
                          ((r.get("status") or {}).get("ranks") or {}).get("Global")) and r,
                      30)
    status = record.get("status") or {}
    check(0 in ranks_in((status.get("ranks") or {}).get("Global")),
          f"record {record['metadata']['name']}: writer 0 Global though its pod is gone "
          f"(record {status.get('state')}, {status.get('writersReady')} writers)")
    before.update(saves(logs, old))
    HISTORY.update(before)

    say("6. the Job recreates the pod: restore from the local tier, resume from that step")
    new = wait_for("a new pod for index 0",
                   lambda: (p := pod_of(0)) and p["metadata"]["name"] != old and p,
                   180)["metadata"]["name"]
    logs.follow(new)
    load = wait_for(f"{new} restored", lambda: next(
        (e for e in logs.trainer(new) if e["event"] in ("load", "fresh")), None), 120)
    complete = [s for s in complete_steps() if s in before]
    expected = max(complete) if complete else None
    other = saves(logs, pods[1])
    check(load["event"] == "load" and load["tier"] == "local",
          f"{new}: restored from the {load.get('tier')} tier ({load.get('source')})")
    # Writer 1 trains on and its agent reports what it holds, so the ranks
    # agree at once on the newest step both hold: at least the newest global
    # one, never the emergency step only writer 0 saved.
    check(expected is not None and load["step"] >= expected and load["step"] in other
          and load["step"] != step, f"{new}: restored step {load['step']}, a step both writers "
          f"saved, at least the newest complete global step ({expected}; the emergency step "
          f"{step} has one writer)")
    check(load["hash"] == before[load["step"]], f"model+optimizer state hash at load equals "
          f"the hash at save ({load['hash'][:16]}…)")
    resume = wait_for("resume", lambda: next(
        (e for e in logs.trainer(new) if e["event"] == "resume"), None), 30)
    check(resume["step"] == load["step"] + 1, f"trainer resumes at step {resume['step']}")
    annotation = wait_for("restored-from annotation", lambda: get("pod", "-n", NS, new)[
        "metadata"].get("annotations", {}).get("ckptdrain.io/restored-from"), 30)
    check(f"step={load['step']}" in annotation and "local" in annotation,
          f"pod annotation ckptdrain.io/restored-from: {annotation}")
    restores = wait_for("policy status.restores", lambda: [
        r for r in policy_status().get("restores") or [] if r.get("pod") == new], 60, 1)
    check(restores, f"policy status records the restore: {restores[0]}")
    goodput_check.interruption(logs, old, new, writer_pods(logs, 0), load, REPORT, check)
    REPORT.append(f"| restore from the local tier ({load['bytes'] / 1e6:.1f} MB) | "
                  f"{load['restore_seconds']:.2f} s in the init container; pod deleted → "
                  f"trainer loaded {load['at'] - deleted:.1f} s |")
    pods[0] = new
    if not goes_on:
        return pods
    # Training goes on: the resumed writer catches up and checkpoints complete again.
    newer = wait_for("a checkpoint completed after the restore", lambda: [
        s for s in complete_steps() if s > load["step"] + EVERY], 120, 1)
    check(newer, f"step {newer[0]} complete for both writers after the restore")
    return pods


def _wipe_after_flush(mine: Path, flushed: int) -> None:
    """Between a wipe and the SIGTERM the agent may capture the trainer's
    newest save again (its schedule finds it missing from the local tier).
    Its flush is done once `emergency` returns, so nothing more comes: leave
    only the emergency step, which no other writer has, before the
    replacement restores."""
    again = [e for e in mine.iterdir() if e.name.startswith("step-")
             and e.name != f"step-{flushed}"]
    for entry in again:
        shutil.rmtree(entry, ignore_errors=True)
    if again:
        say(f"  wiped again what was captured after the wipe: {sorted(e.name for e in again)}")


def step7a(logs: Logs, pods: dict[int, str], epoch: float, local_root: Path) -> None:
    say("7a. wipe the local tier and delete again: restore comes from S3")
    old = pods[0]
    mine = local_root / "writer-0"
    wait_mid_interval(epoch)
    before = dict(HISTORY)
    for entry in mine.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    say(f"  wiped {mine}")
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, old, "--wait=false")
    _wipe_after_flush(mine, emergency(logs, old, deleted))
    new, load = _reload(logs, 0, old)
    before |= saves(logs, old)
    HISTORY.update(saves(logs, old))
    check(load["event"] == "load" and load["tier"] == "global",
          f"{new}: restored from the {load.get('tier')} tier ({load.get('source')})")
    # Newest complete, by restore's rule: a newer step both records call Global
    # is passed by when its writers saved it in different runs (writer 1 never
    # restarted, so its saves after step 6 keep the first run's timeline,
    # restore/agreement.py); restore names each step it passed by.
    passed = {e.get("step") for e in load.get("skipped") or []}
    newer = sorted(s for s in complete_steps() if s in before and s > load["step"])
    check(load["hash"] == before[load["step"]] and all(s in passed for s in newer),
          f"step {load['step']} (newest complete; newer complete steps {newer} passed by: "
          f"{[e.get('reason') for e in load.get('skipped') or [] if e.get('step') in newer]}), "
          f"state hash equal at save and load")
    goodput_check.interruption(logs, old, new, writer_pods(logs, 0), load, REPORT, check)
    REPORT.append(f"| restore from S3 after a wiped local tier ({load['bytes'] / 1e6:.1f} MB) | "
                  f"{load['restore_seconds']:.2f} s in the init container; pod deleted → "
                  f"trainer loaded {load['at'] - deleted:.1f} s |")
    pods[0] = new


def step7b(logs: Logs, pods: dict[int, str], epoch: float, local_root: Path) -> None:
    say("7b. corrupt the local copy and delete again: restore detects it and falls back")
    # Writer 1 never restarted, so no step newer than 7a's is restorable (its
    # writers saved it in different runs) and restore would never look at a
    # local copy. Both pods restart together first: one decision puts both
    # writers on one timeline, and their next steps are restorable again.
    # First 7a's restored step leaves writer 0's local tier (newer captures
    # push it out): its copy there was captured again at that restore, with
    # that time and not its save's, and would skew goodput's lost seconds.
    olds = dict(pods)
    restored = next(e for e in logs.trainer(olds[0]) if e["event"] == "load")["step"]
    wait_for(f"step {restored} gone from writer 0's local tier", lambda: not (
        local_root / "writer-0" / f"step-{restored}").exists(), 120, every=0.5)
    wait_mid_interval(epoch)
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, olds[0], olds[1], "--wait=false")
    say(f"  deleted {olds[0]} and {olds[1]} at once")
    for i in (0, 1):
        emergency(logs, olds[i], deleted)
    HISTORY.update(saves(logs, olds[0]))
    history = {0: HISTORY, 1: saves(logs, olds[1])}
    loads: dict[int, dict[str, Any]] = {}
    for i in (0, 1):
        pods[i], loads[i] = _reload(logs, i, olds[i])
    steps = {i: e.get("step") for i, e in loads.items()}
    check(all(e["event"] == "load" for e in loads.values()) and steps[0] == steps[1],
          f"both writers restored the same step: {steps} "
          f"(tiers {[e.get('tier') for e in loads.values()]})")
    for i in (0, 1):
        check(loads[i]["hash"] == history[i].get(steps[i]),
              f"writer {i} ({pods[i]}): state hash equal to its save of step {steps[i]}")
    said = {i: wait_for(f"{pods[i]}: the agreement in its restore's log",
                        lambda i=i: agreement.agreement_of(logs, pods[i]), 30) for i in (0, 1)}
    check({a["round"] for a in said.values()} == {said[0]["round"]}
          and all(a["why"] == "agreed" for a in said.values()),
          f"one decision for both: round {said[0]['round']}, {said[0]['why']}")
    for i in (0, 1):
        goodput_check.interruption(logs, olds[i], pods[i], writer_pods(logs, i), loads[i],
                                   REPORT, check)
    _back_on_clock(logs, list(pods.values()), epoch, steps[0])
    # A step both current pods saved and drained (step numbers come back
    # after a restore: the records may hold an older run's step of that
    # number), taken while the next save is still ahead.
    target = wait_for("a step both restarted writers saved and drained, mid-interval",
                      lambda: corruption.settled(logs, pods.values(), epoch, steps[0]),
                      420, every=0.5)
    lines = {i: corruption.timeline(local_root, i, target) for i in (0, 1)}
    check(lines[0] and lines[0] == lines[1],
          f"step {target}: both writers' local copies in one run (timeline {lines[0]})")
    old = pods[0]
    mine = local_root / "writer-0"
    corrupted = corruption.flip_one_byte(mine)
    say(f"  flipped one byte in {corrupted}")
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, old, "--wait=false")
    emergency(logs, old, deleted)
    new, load = _reload(logs, 0, old)
    mine_saved = saves(logs, old)
    HISTORY.update(mine_saved)
    # The newest step complete for both writers in this run: the one restore picks.
    expected = max(corruption.drained(logs, [old, pods[1]]), default=None)
    skipped = [s for s in load.get("skipped") or [] if s.get("tier") == "local"
               and s.get("step") == expected and "crc32c" in str(s.get("reason"))]
    check(skipped and expected is not None and expected >= target,
          f"restore skipped the corrupt local copy of step {expected}: {skipped}")
    check(load["tier"] == "global" and load["step"] == expected,
          f"{new}: fell back to step {load['step']} on the {load['tier']} tier")
    check(load["hash"] == mine_saved[expected],
          f"state hash equal to {old}'s save of step {expected}")
    goodput_check.interruption(logs, old, new, writer_pods(logs, 0), load, REPORT, check)
    REPORT.append(f"| restore falling back to S3 from a corrupt local copy | "
                  f"{load['restore_seconds']:.2f} s in the init container (verification "
                  f"included); pod deleted → trainer loaded {load['at'] - deleted:.1f} s |")
    pods[0] = new


#: How long a replaying trainer may go without a newer save (one every EVERY
#: steps: seconds at any replay speed) before 7b calls it stuck.
STALL_S = 120


def _back_on_clock(logs: Logs, pods: list[str], epoch: float, restored: int) -> None:
    """Wait until every pod replayed the steps between `restored` and the
    shared clock, for as long as they keep saving newer steps.

    The restore in 7b may go far back (step 6 left the writers in two runs, so
    the newest step they share is older), and a trainer replays at a rate set
    by this machine's CPUs: a fixed bound would fail a slow machine while the
    job is fine. A replay that saves nothing newer for `STALL_S` fails."""
    best, since = restored, time.monotonic()
    while True:
        behind, slowest = corruption.trailing(logs, pods, epoch)
        if behind == 0:
            say(f"  both writers back on the clock at step {slowest} "
                f"(restored {restored})")
            return
        if slowest > best:
            best, since = slowest, time.monotonic()
        if time.monotonic() - since > STALL_S:
            raise Failed(f"the slowest writer saved nothing newer than step {best} for "
                         f"{STALL_S} s while {behind} steps behind the clock")
        time.sleep(1)


def writer_pods(logs: Logs, index: int) -> list[str]:
    """Every trainer pod the Job ran for `index`, as followed so far."""
    return sorted({pod for pod, container in logs.following
                   if container == "trainer" and pod.startswith(f"{JOB}-{index}-")})


def _reload(logs: Logs, index: int, old: str) -> tuple[str, dict[str, Any]]:
    # The Job controller's replacement slows with each interruption (docs/e2e.md,
    # "Slow pod replacement"): 7b's last one comes after four.
    new = wait_for(f"a new pod for index {index}",
                   lambda: (p := pod_of(index)) and p["metadata"]["name"] != old and p,
                   300)["metadata"]["name"]
    logs.follow(new)
    load = wait_for(f"{new} restored", lambda: next(
        (e for e in logs.trainer(new) if e["event"] in ("load", "fresh")), None), 120)
    return new, load
