"""The restore agreement step: the ranks of a multi-writer job restore one
step, the newest every rank can get, so intact nodes give back their newest
local step and not the older global one.

Two writers of one policy `agree` run on the cluster's two nodes, one on
each, like the peer step's (peer.two_node_job), with the peer tier off and
`globalEvery: 3` (the store gets one local checkpoint per three intervals,
the same step from both writers, so the global tier lags the local one).
Every restore agrees through the apiserver
(operator/ckptdrain/restore/agreement.py; `restore.agreementTimeout`, 1m).

A1. Gang restart, both nodes intact: once both writers hold a local step
    newer than the newest complete global one, both pods are deleted at once.
    Both replacements load the same step from the local tier, newer than the
    newest global step at the restart and at least the newest local step
    both held, each with the state hash its own writer saved; their restore
    init containers say the ranks agreed (every rank reported) in one round.
    That step is the newest both old agents captured locally, and the
    policy's status.goodput counts for each rank only the steps since it:
    its step at SIGTERM minus the step loaded, as its trainer logged them
    (goodput_check.py: steps exact, seconds within its tolerance).
A2. One node lost: writer 0's local tier is wiped and both pods deleted.
    Both ranks load the same step, one writer 0 can still get: the newest
    complete global step (from the store; the peer tier is off).
A3. Restart in place: the Job is replaced by one whose pods restart in place
    (`restartPolicy: OnFailure`). Writer 0's trainer gets SIGTERM inside its
    pod, saves an emergency step only it has, exits 143 and is started again
    by the kubelet. The restarted trainer loads the newest step both writers
    saved before the kill: newer than the step restored at pod start, not
    its own emergency step, without waiting out the agreement timeout.

A4. Reader replicas (readers.py, on a policy and Job of their own): 2
    writers and 2 readers (`spec.readers: Replicas`), all 4 pods deleted at
    once; every replacement loads the writers' newest step, each reader its
    shard with the hash its writer saved, through restore alone (no agent).

A3 runs on a second Job because a Job whose pods restart in place may have
no podFailurePolicy (it requires `restartPolicy: Never`): every deleted pod
of A1 and A2 would then count as a failure, and the Job would hold back
each replacement by its failure back-off (10 s, doubling per failure).

    run(s3, allowed_root, workdir, report, say, check)   after the peer step
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import goodput_check
import jobset
import readers
import yaml
from kube import apply, get, kubectl, wait_for
from peer import CHECKPOINT_BYTES, START_MARGIN_S, WRITERS, two_node_job, wipe
from trainers import TRAINERS, Logs, _json_lines
from views import GRACE, NS, mid_interval, remove, wait_mid_interval

NAME = POLICY = PREFIX = "agree"
#: The second Job (A3): its trainers restart inside their pods.
IN_PLACE = "agree-in-place"
GLOBAL_EVERY, LOCAL_KEEP = 3, 10
SELECT = f"app={NAME}"
#: The policy's restore.agreementTimeout (left at its default).
AGREE_TIMEOUT_S = 60.0
#: How restore's last line says the ranks came to its step (restore/result.py):
#: "...; ranks decided it in round 2 (agreed: every rank reported; ...) -> <path>".
AGREED = re.compile(r"; ranks (\w+) it in round (\d+) \((\w+): (.*)\) -> \S+$")
#: Run in the trainer container: SIGTERM to its PID 1, the simulated trainer
#: (job.yaml's command), which saves an emergency step and exits 143.
KILL_TRAINER = (
    "import os, signal, sys\n"
    "cmd = open('/proc/1/cmdline', 'rb').read()\n"
    "if b'ckptdrain.demo.trainer' not in cmd:\n"
    "    sys.exit(f'PID 1 is not the trainer: {cmd!r}')\n"
    "os.kill(1, signal.SIGTERM)\n")

Say = Callable[[str], None]
Check = Callable[[object, str], None]
Pods = dict[int, dict[str, Any]]


def policy_manifest(allowed_root: str, s3_port: int) -> str:
    doc = json.loads(jobset.policy_manifest(allowed_root, s3_port, policy=POLICY, app=NAME,
                                            prefix=PREFIX))
    doc["spec"]["writers"] = WRITERS
    doc["spec"]["model"]["checkpointBytes"] = f"{CHECKPOINT_BYTES // 1_000_000}M"
    doc["spec"]["globalEvery"] = GLOBAL_EVERY
    # Writer 1 still holds the newest global step locally after the restarts.
    doc["spec"]["localTier"]["keep"] = LOCAL_KEEP
    # Off, as by default: with it, a wiped node's writer would get newer steps
    # from its partner, and A2 would not ask for the global tier.
    doc["spec"]["peerTier"] = {"enabled": False}
    return json.dumps(doc)


def job_manifest(epoch: float, in_place: bool = False) -> str:
    job = two_node_job(epoch, IN_PLACE if in_place else NAME, NAME)
    if in_place:
        # The kubelet starts a trainer that exited non-zero again in its pod.
        job["spec"].pop("podFailurePolicy")
        job["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    return yaml.safe_dump(job)


def complete_steps() -> list[int]:
    return jobset.complete_steps(POLICY)


def saves(logs: Logs, pod: str) -> dict[int, str]:
    return {e["step"]: e["hash"] for e in logs.trainer(pod) if e["event"] == "save"}


def local_steps(logs: Logs, pod: str) -> set[int]:
    """Steps the pod's agent captured on its node's local tier."""
    return {int(e["step"]) for e in logs.agent(pod) if e.get("state") == "Local"}


def agreement_of(logs: Logs, pod: str) -> dict[str, Any] | None:
    """How the pod's restore came to its step, from its last line (None
    until that line is there)."""
    path = logs.dir / f"{pod}.ckptdrain-restore.log"
    for line in reversed(path.read_text(errors="replace").splitlines() if path.exists() else []):
        match = AGREED.search(line)
        if match:
            return {"how": match[1], "round": int(match[2]), "why": match[3],
                    "detail": match[4]}
    return None


def current_trainer(logs: Logs, pod: str) -> list[dict[str, Any]]:
    """The events of the pod's running trainer container (the followed log
    ends with the first one), kept as <pod>.trainer.restarted.log."""
    path = logs.dir / f"{pod}.trainer.restarted.log"
    path.write_text(kubectl("logs", "-n", NS, pod, "-c", "trainer", check=False).stdout)
    return logs.kind.events(_json_lines(path))


def replaced(old: Iterable[str]) -> Pods | None:
    """Both writers' running pods, when none of them is in `old`."""
    pods, old = jobset.running_pods(SELECT), set(old)
    if sorted(pods) == list(range(WRITERS)) and not any(
            p["metadata"]["name"] in old for p in pods.values()):
        return pods
    return None


def gone(names: Iterable[str]) -> None:
    names = set(names)
    wait_for(f"{', '.join(sorted(names))} gone", lambda: not names & {
        p["metadata"]["name"] for p in get("pods", "-n", NS, "-l", SELECT)["items"]},
        GRACE + 30, every=1)


def names_of(pods: Pods) -> dict[int, str]:
    return {w: p["metadata"]["name"] for w, p in pods.items()}


def loads(logs: Logs, pods: Pods) -> dict[int, dict[str, Any]]:
    """Each writer's trainer's first load (or fresh) event, followed from now on."""
    for name in names_of(pods).values():
        logs.follow(name)
    return {w: wait_for(f"{name} restored", lambda name=name: next(
        (e for e in logs.trainer(name) if e["event"] in ("load", "fresh")), None),
        AGREE_TIMEOUT_S + 60) for w, name in names_of(pods).items()}


def check_one_step(pods: Pods, loaded: dict[int, dict[str, Any]],
                   history: dict[int, dict[int, str]], check: Check) -> int:
    """Both ranks loaded one step, each its own writer's state; returns it."""
    steps = {w: e.get("step") for w, e in loaded.items()}
    tiers = {w: e.get("tier") for w, e in loaded.items()}
    check(all(e["event"] == "load" for e in loaded.values()) and len(set(steps.values())) == 1,
          f"both ranks restored the same step: {steps} (tiers {tiers})")
    step = int(steps[0])
    for w, e in sorted(loaded.items()):
        check(e["hash"] == history[w].get(step), f"writer {w} ({pods[w]['metadata']['name']}):"
              f" state hash equal to what writer {w} saved at step {step}")
    return step


def check_agreed(logs: Logs, pods: Pods, check: Check) -> dict[str, Any]:
    """Both restores say every rank reported, in one round; returns rank 0's."""
    said = {w: wait_for(f"{name}: the agreement in its restore's log", lambda name=name:
                        agreement_of(logs, name), 30) for w, name in names_of(pods).items()}
    how = ", ".join(f"rank {w} {a['how']} it" for w, a in sorted(said.items()))
    check(all(a["why"] == "agreed" for a in said.values())
          and len({a["round"] for a in said.values()}) == 1,
          f"the ranks agreed in round {said[0]['round']} ({how}): {said[0]['why']}: "
          f"{said[0]['detail']}")
    return said[0]


def run(s3: Any, allowed_root: str, workdir: Path, report: list[str],
        say: Say, check: Check) -> None:
    say("A. restore agreement: two writers, peer tier off, one restore step for every rank")
    logs = Logs(workdir / "logs" / "agreement", NS, TRAINERS["sim"])
    try:
        _run(s3, allowed_root, logs, report, say, check)
    finally:
        logs.stop()
        remove(POLICY, NAME, IN_PLACE)
    # A4 times its deletes by its step clock: it starts once these pods have
    # flushed and gone, not beside them.
    wait_for("the agreement Jobs' pods gone", lambda: not get(
        "pods", "-n", NS, "-l", SELECT)["items"], GRACE + 60, every=1)
    readers.run(s3, allowed_root, workdir, report, say, check)


def _run(s3: Any, allowed_root: str, logs: Logs, report: list[str],
         say: Say, check: Check) -> None:
    local_root = Path(allowed_root) / NS / POLICY
    shutil.rmtree(local_root, ignore_errors=True)
    apply(policy_manifest(allowed_root, s3.port))
    # Both trainers start before the step clock does (peer.py says why).
    epoch = time.time() + START_MARGIN_S
    apply(job_manifest(epoch))
    pods = wait_for("2 writers running", lambda: replaced(()), 240, every=1)
    for name in names_of(pods).values():
        logs.follow(name)
    nodes = {w: p["spec"]["nodeName"] for w, p in pods.items()}
    check(len(set(nodes.values())) == WRITERS, f"one writer on each node: {nodes}")
    #: Each writer's state hash of every step it saved, later pods overwriting.
    history: dict[int, dict[int, str]] = {w: {} for w in range(WRITERS)}
    pods = gang_restart(logs, pods, epoch, history, report, say, check)
    pods = node_lost(logs, pods, epoch, local_root / "writer-0", history, report, say, check)
    in_place(logs, pods, epoch, history, report, say, check)


def gang_restart(logs: Logs, pods: Pods, epoch: float, history: dict[int, dict[int, str]],
                 report: list[str], say: Say, check: Check) -> Pods:
    say("  A1. gang restart with both nodes intact: both pods deleted at once")
    old = names_of(pods)

    def ahead() -> tuple[int, int] | None:
        # Between two scheduled saves, so it still holds at the delete.
        if not mid_interval(epoch):
            return None
        glob = max(complete_steps(), default=-1)
        newer = [s for s in set.intersection(*(local_steps(logs, n) for n in old.values()))
                 if s > glob]
        return (max(newer), glob) if glob >= 0 and newer else None
    held, glob = wait_for("both writers holding a local step newer than the newest global one",
                          ahead, 180)
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, *old.values(), "--wait=false")
    say(f"  deleted {', '.join(old.values())}: both hold step {held} locally, the newest "
        f"global step is {glob}")
    gone(old.values())
    for w, name in old.items():
        history[w].update(saves(logs, name))
    pods = wait_for("both replacements running", lambda: replaced(old.values()), 180, every=1)
    loaded = loads(logs, pods)
    step = check_one_step(pods, loaded, history, check)
    check(all(e.get("tier") == "local" for e in loaded.values()),
          f"both from the local tier: {[e.get('source') for e in loaded.values()]}")
    check(step > glob and step >= held, f"step {step}: newer than the newest global step "
          f"{glob} at the restart, at least the newest local step both held ({held})")
    said = check_agreed(logs, pods, check)
    report.append(f"| restore agreement: gang restart, nodes intact → both at local step {step} "
                  f"(global was {glob}; round {said['round']}) | pods deleted → both trainers "
                  f"loaded {max(e['at'] for e in loaded.values()) - deleted:.1f} s |")
    gang_goodput(logs, old, pods, loaded, report, check)
    return pods


def gang_goodput(logs: Logs, old: dict[int, str], pods: Pods,
                 loaded: dict[int, dict[str, Any]], report: list[str], check: Check) -> None:
    """What status.goodput counts for the gang restart: each rank loses the
    steps since the newest local checkpoint every rank held, no more."""
    common = max(set.intersection(*(local_steps(logs, n) for n in old.values())))
    step = loaded[0]["step"]
    check(step == common, f"step {step} is the newest step both old agents captured on the "
          f"local tier ({common}, their SIGTERM captures included)")
    for w, name in sorted(old.items()):
        # The step at SIGTERM minus the local step loaded, exactly; the lost and
        # recovery seconds within goodput_check's tolerance of the trainer logs.
        entry = goodput_check.interruption(logs, name, pods[w]["metadata"]["name"], [name],
                                           loaded[w], report, check, policy=POLICY)
        check(entry["restoredTier"] == "local" and entry["restoredStep"] == common,
              f"goodput: writer {w} lost {entry['lostSteps']} steps, those since the newest "
              f"local checkpoint both ranks held ({common}; newest on its own node "
              f"{entry.get('restorableLocal')}, newest global {entry.get('restorableGlobal')})")


def node_lost(logs: Logs, pods: Pods, epoch: float, mine: Path,
              history: dict[int, dict[int, str]], report: list[str], say: Say,
              check: Check) -> Pods:
    say("  A2. writer 0's node lost (its local tier wiped), both pods deleted")
    old = names_of(pods)
    wait_mid_interval(epoch)
    wipe(mine, running=True)
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, *old.values(), "--wait=false")
    say(f"  wiped {mine} and deleted {', '.join(old.values())}")
    # The old agent still captured the trainer's emergency save after the
    # wipe: once it has exited, wipe again, before the Job's replacement
    # (made only once the old pod is gone) can restore.
    wait_for(f"{old[0]}'s agent exited", lambda: any(
        "agent exiting" in str(doc.get("msg", "")) for doc in _json_lines(
            logs.dir / f"{old[0]}.ckptdrain-agent.log")), GRACE + 30)
    wipe(mine)
    gone(old.values())
    for w, name in old.items():
        history[w].update(saves(logs, name))
    glob = max(complete_steps(), default=-1)
    pods = wait_for("both replacements running", lambda: replaced(old.values()), 180, every=1)
    loaded = loads(logs, pods)
    step = check_one_step(pods, loaded, history, check)
    check(loaded[0].get("tier") == "global",
          f"writer 0 from the global tier, all it can still get: {loaded[0].get('source')} "
          f"(writer 1 from the {loaded[1].get('tier')} tier)")
    check(step >= glob, f"step {step}: at least the newest complete global step once the old "
          f"pods were gone ({glob})")
    wait_for(f"step {step} complete in the global tier", lambda: step in complete_steps(), 30)
    said = check_agreed(logs, pods, check)
    report.append(f"| restore agreement: writer 0's node lost → both at global step {step} "
                  f"(round {said['round']}) | pods deleted → both trainers loaded "
                  f"{max(e['at'] for e in loaded.values()) - deleted:.1f} s |")
    return pods


def in_place(logs: Logs, pods: Pods, epoch: float, history: dict[int, dict[int, str]],
             report: list[str], say: Say, check: Check) -> None:
    say("  A3. the trainer restarts inside its pod (a Job with restartPolicy OnFailure)")
    old = names_of(pods)
    kubectl("delete", "job", "-n", NS, NAME, "--wait=true", "--timeout=90s", timeout=100)
    gone(old.values())
    for w, name in old.items():
        history[w].update(saves(logs, name))
    # The same step clock: a trainer restored at step N resumes at N + 1.
    apply(job_manifest(epoch, in_place=True))
    pods = wait_for(f"{IN_PLACE}'s 2 writers running", lambda: replaced(old.values()), 180,
                    every=1)
    started = loads(logs, pods)
    check_one_step(pods, started, history, check)
    names = names_of(pods)
    start = started[0]["step"]

    # Held, not only saved: a trainer saves faster than its agent starts, and
    # what a rank holds is what its agent captured (or its work dir keeps).
    def both_held() -> list[int]:
        return sorted(local_steps(logs, names[0]) & local_steps(logs, names[1]))
    wait_for("a step both writers' agents captured since they started",
             lambda: [s for s in both_held() if s > start], 60)
    wait_mid_interval(epoch)
    common = max(both_held())
    uid = pods[0]["metadata"]["uid"]
    killed = time.time()
    kubectl("exec", "-n", NS, names[0], "-c", "trainer", "--", "python3", "-c", KILL_TRAINER,
            timeout=30)
    say(f"  SIGTERM to {names[0]}'s trainer (both writers hold step {common}; "
        f"restored at pod start: {start})")
    emergency = wait_for(f"{names[0]}: emergency save", lambda: next(
        (e for e in logs.trainer(names[0]) if e["event"] == "save"
         and e["reason"] == "sigterm"), None), GRACE)
    load = wait_for(f"{names[0]}'s trainer started again and loaded", lambda: next(
        (e for e in current_trainer(logs, names[0]) if e["event"] in ("load", "fresh")
         and e["at"] > killed), None), AGREE_TIMEOUT_S + 60)
    pod = get("pod", "-n", NS, names[0])
    restarts = next((c.get("restartCount", 0) for c in pod["status"].get(
        "containerStatuses") or [] if c["name"] == "trainer"), 0)
    check(pod["metadata"]["uid"] == uid and restarts >= 1,
          f"{names[0]}: its trainer restarted in the same pod ({restarts} restart(s))")
    check(load["event"] == "load" and load["step"] >= common and load["step"] > start,
          f"restarted trainer loaded step {load.get('step')} ({load.get('tier')} tier): at "
          f"least the newest step both writers held before the kill ({common}), not the "
          f"step restored at pod start ({start})")
    check(load["step"] in saves(logs, names[1]),
          f"a step writer 1 saved too, not writer 0's own emergency step {emergency['step']}")
    check(load["hash"] == saves(logs, names[0]).get(load["step"]),
          f"state hash equal to what writer 0 saved at step {load['step']}")
    check(load["at"] - killed < AGREE_TIMEOUT_S, f"loaded {load['at'] - killed:.1f} s after "
          f"the kill, without waiting out the agreement timeout ({AGREE_TIMEOUT_S:.0f} s)")
    report.append(f"| restore agreement: trainer restarted in place → step {load['step']} "
                  f"({load.get('tier')} tier; emergency step {emergency['step']}, pod start "
                  f"{start}) | kill → trainer loaded {load['at'] - killed:.1f} s |")
