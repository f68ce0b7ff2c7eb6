"""The pods people run: several processes per pod, trainers as root and as
uid 1000.

Two writers of one policy `procs`, one pod on each node, each pod running
two processes of the simulated trainer under ckptdrain.demo.processes (as
torchrun `--nproc_per_node=2` would): the pod is one writer, and its step
holds both processes' files. The trainers run first as root (the NGC
images' default), then as uid 1000 (runAsUser, no runAsGroup of ours):

U1. As root: the agents' checkpoint requests reach the trainers (the
    trainers acknowledge them) and every scheduled step holds both
    processes' shards, captured on each node and complete in the store.
    Both pods are deleted: every process saves the pod's emergency step,
    and after the replacements start, all four processes load one step,
    each with the digest of what it saved itself.
U2. The Job is replaced by one whose trainers run as uid 1000: they load
    what the root trainers saved (readable whatever uid wrote it), save,
    and after a second gang deletion all four processes load one step again.

    run(s3, allowed_root, workdir, report, say, check)   after the agreement step
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jobset
import yaml
from kube import apply, get, kubectl, wait_for
from peer import CHECKPOINT_BYTES, START_MARGIN_S, WRITERS, two_node_job
from trainers import TRAINERS, Logs, _json_lines
from views import EVERY, GRACE, NS, STEP_S, mid_interval, remove, wait_mid_interval

NAME = POLICY = PREFIX = "procs"
PROCESSES = 2
SELECT = f"app={NAME}"
AGREE_TIMEOUT_S = 60.0
#: Run in the trainer container: the control files and one published step,
#: as the trainer's user sees them.
LOOK = (
    "import json, os, stat\n"
    "w = '/ckptdrain/work'; c = w + '/.ckptdrain'\n"
    "def doc(n):\n"
    "    try: return json.load(open(os.path.join(c, n)))\n"
    "    except OSError as e: return {'error': str(e)}\n"
    "steps = sorted((n for n in os.listdir(w) if n.startswith('step-') and n[5:].isdigit()),"
    " key=lambda n: int(n[5:]))\n"
    "st = os.stat(os.path.join(w, steps[-1])) if steps else None\n"
    "print(json.dumps({'uid': os.getuid(), 'groups': os.getgroups(), 'request': doc('request'),"
    " 'ack': doc('ack'), 'step': steps[-1] if steps else None,"
    " 'files': sorted(os.listdir(os.path.join(w, steps[-1]))) if steps else [],"
    " 'mode': oct(stat.S_IMODE(st.st_mode)) if st else None, 'gid': st.st_gid if st else None}))\n"
)

Say = Callable[[str], None]
Check = Callable[[object, str], None]
Pods = dict[int, dict[str, Any]]


def policy_manifest(allowed_root: str, s3_port: int) -> str:
    doc = json.loads(jobset.policy_manifest(allowed_root, s3_port, policy=POLICY, app=NAME,
                                            prefix=PREFIX))
    doc["spec"]["writers"] = WRITERS
    doc["spec"]["model"]["checkpointBytes"] = f"{CHECKPOINT_BYTES // 1_000_000}M"
    doc["spec"]["peerTier"] = {"enabled": False}
    return json.dumps(doc)


def job_manifest(epoch: float, uid: int) -> str:
    job = two_node_job(epoch, f"{NAME}-uid{uid}", NAME)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    # Each process writes its share of the pod's shard.
    command[command.index("--size") + 1] = str(CHECKPOINT_BYTES // WRITERS // PROCESSES)
    container["command"] = [
        "python3", "-m", "ckptdrain.demo.processes", "--processes", str(PROCESSES),
        "--clock", f"{epoch:.3f}", "--step-time", str(STEP_S), "--", *command]
    container["securityContext"] = {"runAsUser": uid, "runAsNonRoot": uid != 0,
                                    "allowPrivilegeEscalation": False}
    return yaml.safe_dump(job)


def events(logs: Logs, pod: str) -> list[dict[str, Any]]:
    """The pod's trainer lines, each with its `process`."""
    return [e for e in _json_lines(logs.dir / f"{pod}.trainer.log") if "process" in e]


def saved(logs: Logs, pod: str) -> dict[tuple[int, int], dict[str, Any]]:
    """(process, step) → the save event."""
    return {(e["process"], e["step"]): e for e in events(logs, pod) if e["event"] == "saved"}


def starts(logs: Logs, pod: str) -> dict[int, dict[str, Any]]:
    return {e["process"]: e for e in events(logs, pod) if e["event"] == "start"}


def local_steps(logs: Logs, pod: str) -> set[int]:
    return {int(e["step"]) for e in logs.agent(pod) if e.get("state") == "Local"}


def look(pod: str) -> dict[str, Any]:
    out = kubectl("exec", "-n", NS, pod, "-c", "trainer", "--", "python3", "-c", LOOK,
                  timeout=30).stdout
    return json.loads(out.strip().splitlines()[-1])


def replaced(old: set[str]) -> Pods | None:
    pods = jobset.running_pods(SELECT)
    if sorted(pods) == list(range(WRITERS)) and not any(
            p["metadata"]["name"] in old for p in pods.values()):
        return pods
    return None


def names_of(pods: Pods) -> dict[int, str]:
    return {w: p["metadata"]["name"] for w, p in pods.items()}


def run(s3: Any, allowed_root: str, workdir: Path, report: list[str],
        say: Say, check: Check) -> None:
    say("U. the pods people run: 2 pods x 2 processes, trainers as root, then as uid 1000")
    logs = Logs(workdir / "logs" / "processes", NS, TRAINERS["sim"])
    try:
        _run(s3, allowed_root, logs, report, say, check)
    finally:
        logs.stop()
        remove(POLICY, f"{NAME}-uid0", f"{NAME}-uid1000")


def _run(s3: Any, allowed_root: str, logs: Logs, report: list[str],
         say: Say, check: Check) -> None:
    shutil.rmtree(Path(allowed_root) / NS / POLICY, ignore_errors=True)
    apply(policy_manifest(allowed_root, s3.port))
    epoch = time.time() + START_MARGIN_S
    history: dict[tuple[int, int], dict[int, str]] = {}
    seen: set[str] = set()  # every pod so far: a new Job's pods are the others
    for uid in (0, 1000):
        say(f"  U{1 if uid == 0 else 2}. trainers as uid {uid}")
        apply(job_manifest(epoch, uid))
        pods = wait_for(f"2 pods of uid {uid} running", lambda: replaced(seen), 240, every=1)
        for name in names_of(pods).values():
            logs.follow(name)
            seen.add(name)
        loaded = loads(logs, pods)
        if uid == 1000:
            check_one_step(pods, loaded, history, check, "uid 1000 after the root trainers")
        pods = cycle(logs, pods, epoch, uid, history, seen, report, say, check)
        kubectl("delete", "job", "-n", NS, f"{NAME}-uid{uid}", "--wait=true", "--timeout=90s",
                timeout=100)
        wait_for(f"uid {uid} pods gone", lambda: not get(
            "pods", "-n", NS, "-l", SELECT)["items"], GRACE + 60, every=1)
        for w, name in names_of(pods).items():
            remember(history, w, saved(logs, name))


def remember(history: dict[tuple[int, int], dict[int, str]], writer: int,
             saves: dict[tuple[int, int], dict[str, Any]]) -> None:
    for (process, step), e in saves.items():
        history.setdefault((writer, process), {})[step] = e["digest"]


def loads(logs: Logs, pods: Pods) -> dict[tuple[int, int], dict[str, Any]]:
    """Every process's start event, once all are there."""
    def all_started() -> dict[tuple[int, int], dict[str, Any]] | None:
        got = {(w, p): e for w, name in names_of(pods).items()
               for p, e in starts(logs, name).items()}
        return got if len(got) == WRITERS * PROCESSES else None
    return wait_for("every process of both pods started", all_started, AGREE_TIMEOUT_S + 90)


def check_one_step(pods: Pods, loaded: dict[tuple[int, int], dict[str, Any]],
                   history: dict[tuple[int, int], dict[int, str]], check: Check,
                   what: str) -> int:
    steps = {k: e.get("restored") for k, e in loaded.items()}
    check(None not in steps.values() and len(set(steps.values())) == 1,
          f"{what}: all {len(steps)} processes restored one step: {steps}")
    step = int(next(iter(steps.values())))
    for (w, p), e in sorted(loaded.items()):
        check(e.get("digest") == history.get((w, p), {}).get(step),
              f"writer {w} process {p}: the digest of what it saved at step {step} "
              f"({e.get('tier')} tier)")
        check(e.get("from_step") == step + 1, f"writer {w} process {p} resumes at {step + 1}")
    return step


def cycle(logs: Logs, pods: Pods, epoch: float, uid: int,
          history: dict[tuple[int, int], dict[int, str]], seen: set[str], report: list[str],
          say: Say, check: Check) -> Pods:
    """Scheduled saves captured and drained, then a gang deletion and restore."""
    old = names_of(pods)
    started = time.time()

    def drained() -> int | None:
        if not mid_interval(epoch):
            return None
        common = set.intersection(*(local_steps(logs, n) for n in old.values()))
        glob = [s for s in jobset.complete_steps(POLICY) if s in common]
        return max(glob) if glob else None
    # Room for a few intervals: a step superseded by a newer one before it
    # is global never completes, and the next one must.
    step = wait_for(f"a scheduled step of the uid {uid} trainers local on both nodes and "
                    f"complete in the store", drained, 240)
    for name in old.values():
        mine = {p for (p, s) in saved(logs, name) if s == step}
        check(mine == set(range(PROCESSES)), f"{name}: step {step} saved by processes "
              f"{sorted(mine)} of {PROCESSES}")
        inside = look(name)
        files = inside["files"]
        check(all(any(f.startswith(f"p{p}-") for f in files) for p in range(PROCESSES)),
              f"{name}: its newest step holds every process's files ({len(files)} files)")
        check(inside["uid"] == uid and inside["mode"] == "0o2775"
              and inside["gid"] in inside["groups"],
              f"{name}: as uid {inside['uid']}, {inside['step']} is mode {inside['mode']} in "
              f"the pod's group {inside['gid']} (groups {inside['groups']})")
        # The agent's request can land just after the trainer's save at the
        # same boundary: then the next save answers it.
        def answered(name: str = name) -> dict[str, Any] | None:
            now = look(name)
            request, ack = now["request"], now["ack"]
            return now if isinstance(request.get("seq"), int) and isinstance(
                ack.get("seq"), int) and ack["seq"] >= request["seq"] - 1 else None
        answer = wait_for(f"{name}: an answer to the agent's requests", answered,
                          3 * STEP_S * EVERY, every=1)
        check(True, f"{name}: the agent's requests reach the uid {uid} trainer "
              f"(request {answer['request']}, ack {answer['ack']})")
    wait_mid_interval(epoch)
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, *old.values(), "--wait=false")
    say(f"  deleted {', '.join(old.values())} (step {step} held on both nodes and in the store)")
    wait_for("the deleted pods gone", lambda: not set(old.values()) & {
        p["metadata"]["name"] for p in get("pods", "-n", NS, "-l", SELECT)["items"]},
        GRACE + 30, every=1)
    for w, name in old.items():
        saves = saved(logs, name)
        remember(history, w, saves)
        emergency = {p: s for (p, s), e in saves.items() if e.get("emergency")}
        check(len(emergency) == PROCESSES and len(set(emergency.values())) == 1,
              f"{name}: every process saved the pod's emergency step: {emergency}")
    pods = wait_for("both replacements running", lambda: replaced(seen), 180, every=1)
    for name in names_of(pods).values():
        logs.follow(name)
        seen.add(name)
    loaded = loads(logs, pods)
    restored = check_one_step(pods, loaded, history, check, f"uid {uid} after deletion")
    check(restored >= step, f"restored step {restored} is at least the drained step {step}")
    took = max(e["t"] for e in loaded.values()) - deleted
    report.append(f"| pods people run: 2 pods × {PROCESSES} processes as uid {uid} → all "
                  f"{len(loaded)} at step {restored} | deleted → every process loaded "
                  f"{took:.1f} s (cycle {time.time() - started:.0f} s) |")
    return pods

