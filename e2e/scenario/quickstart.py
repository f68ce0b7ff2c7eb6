"""The quickstart (docs/quickstart.md), run as written on the real cluster.

After the scenario's own release is gone, this step runs the page's install
block and its store-policy-job block verbatim (read from the markdown, so a
page that drifts fails here), then checks what its "Check that it works"
section promises: both pods running with their agent, the policy with two
drainers and a global step, a record complete for both writers, and after
writer 0's pod is deleted as the page says, a replacement whose restore
placed the newest step complete for both and whose trainer resumes from it.
The page's clean-up ends it. The only thing the cluster is given that the page
does not do is the images: the e2e cluster cannot pull, so run.sh loads
ckptdrain:dev and MinIO (built from its Go module) under the names the
manifests use.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kube import POLICIES, Failed, get, helm, kubectl, wait_for

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.docs.blocks import Block, parse  # noqa: E402

PAGE = REPO / "docs/quickstart.md"
NS, RELEASE, OP_NS = "quickstart", "ckptdrain", "ckptdrain"
POLICY, APP = "ckptdrain-check", "ckptdrain-check"
#: The policy's local tier on the node (docs/examples/quickstart/policy.yaml).
LOCAL_ROOT = Path("/mnt/ckptdrain") / NS


def page_block(starts: str) -> Block:
    """The page's one cluster block whose first line starts with `starts`."""
    found = [b for b in parse(PAGE) if b.kind == "cluster"
             and b.text.lstrip().startswith(starts)]
    if len(found) != 1:
        raise Failed(f"{PAGE.name}: expected one cluster block starting {starts!r}, "
                     f"found {len(found)}")
    return found[0]


def run_block(block: Block, timeout: float = 600) -> None:
    """The block as a user pastes it: bash, from the repository's root, stopping
    at the first failing line."""
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ})
    if done.returncode != 0:
        raise Failed(f"{block.id} exited {done.returncode}:\n{done.stdout}{done.stderr}")


def pods() -> list[dict[str, Any]]:
    return [p for p in get("pods", "-n", NS, "-l", f"app={APP}")["items"]
            if not p["metadata"].get("deletionTimestamp")]


def running(pod: dict[str, Any]) -> bool:
    """Trainer running and the agent sidecar ready: the page's 2/2."""
    status = pod["status"]
    trainer = [c for c in status.get("containerStatuses") or [] if c["name"] == "trainer"]
    agent = [c for c in status.get("initContainerStatuses") or []
             if c["name"] == "ckptdrain-agent"]
    return bool(trainer and "running" in (trainer[0].get("state") or {})
                and agent and agent[0].get("ready"))


def index_of(pod: dict[str, Any]) -> str:
    return pod["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index", "")


def trainer_events(pod: str) -> list[dict[str, Any]]:
    out = kubectl("logs", "-n", NS, pod, "-c", "trainer", check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def complete_for_both() -> list[int]:
    """Steps whose record is Global for both writers, oldest first."""
    steps = []
    for record in get("checkpoints", "-n", NS)["items"]:
        status = record.get("status") or {}
        if status.get("state") == "Global":
            steps.append(int(record["spec"]["step"]))
    return sorted(steps)


def run(report: list[str], say: Callable[[str], None],
        check: Callable[[object, str], None]) -> None:
    say("9. the quickstart as written (docs/quickstart.md)")
    began = time.monotonic()
    shutil.rmtree(LOCAL_ROOT, ignore_errors=True)
    try:
        run_block(page_block("kubectl create namespace quickstart"))
        say("  ran: namespace and helm install with the page's values, as written")
        run_block(page_block("kubectl -n quickstart create secret generic quickstart-s3"))
        say("  ran: secret, MinIO and its bucket, policy and Job, as written")
        both = wait_for("both check pods running with their agent",
                        lambda: (p := pods()) and len(p) == 2 and all(map(running, p)) and p,
                        300, 1)
        check(sorted(map(index_of, both)) == ["0", "1"], "quickstart: pods of indexes 0 and 1 "
              "run trainer and agent (2/2)")
        status = wait_for("policy: 2 drainers and a global step", lambda: (
            s := get(POLICIES, "-n", NS, POLICY).get("status") or {}).get(
                "drainers") == 2 and s.get("lastGlobalStep") is not None and s, 180, 1)
        say(f"  ok: quickstart: policy shows drainers 2, global step {status['lastGlobalStep']}")
        # Past the first save (step 0, at start): a step the training reached.
        complete = wait_for("a step after the first Global for both writers", lambda: (
            c := complete_for_both()) and c[-1] > 0 and c, 180, 1)
        check(complete, f"quickstart: step {complete[-1]} complete for both writers")

        # "Now preempt writer 0 as an eviction would": the page's first line.
        preempt = page_block("kubectl -n quickstart delete pod")
        old = next(p["metadata"]["name"] for p in both if index_of(p) == "0")
        kubectl(*preempt.text.splitlines()[0].split()[1:], timeout=120)
        deleted = time.monotonic()
        before = complete_for_both()
        new = wait_for("writer 0's replacement running", lambda: next(
            (p["metadata"]["name"] for p in pods()
             if index_of(p) == "0" and p["metadata"]["name"] != old and running(p)), None),
            240, 1)
        start = wait_for(f"{new}'s start event", lambda: next(
            (e for e in trainer_events(new) if e["event"] == "start"), None), 120, 1)
        expected = max(before) if before else None
        check(start.get("restored") is not None and expected and start["restored"] >= expected,
              f"quickstart: {new} restored step {start.get('restored')} from the "
              f"{start.get('tier')} tier (newest complete for both when deleted: {expected})")
        check(start["from_step"] == start["restored"] + 1,
              f"quickstart: its trainer resumes at step {start['from_step']}")
        restore_log = kubectl("logs", "-n", NS, new, "-c", "ckptdrain-restore",
                              check=False).stdout
        said = f"ckptdrain restore: step {start['restored']} from the {start.get('tier')} tier"
        check(said in restore_log, f"quickstart: ckptdrain-restore's log says {said!r}")
        report.append(f"| quickstart: delete writer 0 → replacement resumed | "
                      f"{time.monotonic() - deleted:.1f} s |")
    finally:
        # The page's clean-up, then what the node keeps.
        kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true",
                "--timeout=120s", check=False, timeout=130)
        helm("uninstall", RELEASE, "-n", OP_NS, "--wait", "--timeout", "90s", check=False,
             timeout=100)
        kubectl("delete", "namespace", OP_NS, "--ignore-not-found", "--wait=true",
                "--timeout=90s", check=False, timeout=100)
        shutil.rmtree(LOCAL_ROOT, ignore_errors=True)
    report.append(f"| quickstart as written, install to clean-up | "
                  f"{time.monotonic() - began:.0f} s |")
