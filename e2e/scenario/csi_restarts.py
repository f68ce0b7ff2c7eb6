"""Restarts under a draining writer on node a (the CSI step, csi.py).

Each restart is timed to land while the writer's agent drains a step to S3
(its newest report for that step is `Draining`):

- the driver's pod deleted: its replacement registers with kubelet again,
  the writer's pod runs on with its volume mounted and saves two newer
  steps into the driver's data dir;
- kubelet stopped, KUBELET_DOWN_S later started again, by
  `e2e/cluster/node.sh stop-kubelet` / `start-kubelet` (the flags, config
  and environment the cluster started it with), its health endpoint
  refusing all the while: the writer is the same pod (uid), no container
  of it restarted (counts and start times), its target path is still a
  mount, kubelet registers the driver again (kubelet keeps plugins in
  memory only; the driver's log counts the registrations), the driver's
  own pod is untouched, and the trainer saves a newer step. Kubelet is
  started again whatever fails while it is down.

After each, nothing is lost: every step the trainer saved until then was
committed by the agent to the local tier and reached the bucket. A
`BucketWatch` lists the policy's manifests (each writer's, written last)
all along, because global retention deletes older steps as newer land.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from csi_node import (
    DRIVER,
    KUBELET_HEALTHZ,
    NODE,
    REGISTERED,
    containers_started,
    driver_pod,
    keep_driver_logs,
    mounted,
    registered_by,
    registrations,
    saves,
    target,
    trainer_pod,
)
from kube import Failed, get, kubectl, wait_for
from trainers import Logs
from views import BUCKET, NS, OP_NS

Check = Callable[[object, str], None]
Say = Callable[[str], None]
REPO = Path(__file__).resolve().parent.parent.parent
NODE_SH = REPO / "e2e/cluster/node.sh"
#: How long kubelet stays stopped: long enough for steps to be saved and
#: drained without it, well short of the node controller's grace before it
#: marks the node NotReady (--node-monitor-grace-period: 50 s by default in
#: the pinned Kubernetes 1.33, which up.sh keeps).
KUBELET_DOWN_S = 12.0
#: node.sh waits up to 20 s for kubelet's stop and 120 s for its health.
NODE_SH_TIMEOUT_S = 180
#: How often the bucket is listed: a step stays there three intervals (30 s).
POLL_S = 0.5


class BucketWatch:
    """Lists a policy's manifests every POLL_S in a thread; `first_seen`
    maps each step to when its first manifest showed."""

    def __init__(self, s3: Any, prefix: str, namespace: str, policy: str) -> None:
        self.client = s3.client()
        self.prefix = f"{prefix}/{namespace}/{policy}/manifests/"
        self.first_seen: dict[int, float] = {}
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="bucket-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self._scan()
                self.last_error = None
            except Exception as err:
                # Any error is kept, shown by `check_nothing_lost`, and the
                # watch goes on: a listing that fails must not pass for one
                # that found nothing, nor end the watch unseen.
                self.last_error = f"{type(err).__name__}: {err}"
            self._stop.wait(POLL_S)

    @property
    def watching(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def _scan(self) -> None:
        now = time.time()
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=self.prefix)
        for page in pages:
            for obj in page.get("Contents") or []:
                step = obj["Key"][len(self.prefix):].split("/", 1)[0]
                self.first_seen.setdefault(int(step), now)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def draining(logs: Logs, pod: str) -> int | None:
    """The step the pod's agent is draining now: its newest report for it
    is `Draining` (None when no drain is in flight)."""
    state: dict[int, str] = {}
    for event in logs.agent(pod):
        state[int(event["step"])] = event["state"]
    return max((step for step, s in state.items() if s == "Draining"), default=None)


def lost_steps(logs: Logs, pod: str, bucket: BucketWatch,
               until: float) -> tuple[list[int], list[int]]:
    """The steps the trainer saved by `until`, and those of them the agent
    never committed to the local tier or the bucket never showed."""
    saved = sorted(e["step"] for e in logs.trainer(pod) if e["event"] == "save"
                   and e["at"] <= until)
    local = {int(e["step"]) for e in logs.agent(pod) if e["state"] == "Local"}
    return saved, [s for s in saved if s not in local or s not in bucket.first_seen]


def check_nothing_lost(logs: Logs, pod: str, bucket: BucketWatch, until: float,
                       check: Check) -> int:
    """Every step saved by `until` reaches the bucket (a drain takes ~3 s);
    returns how many there were."""
    with contextlib.suppress(Failed):  # the check below names the steps
        wait_for("every saved step in the bucket", lambda: not (
            r := lost_steps(logs, pod, bucket, until))[1] and r, 60, every=1)
    saved, lost = lost_steps(logs, pod, bucket, until)
    check(bucket.watching, f"the bucket watch still lists {bucket.prefix} every {POLL_S}s"
                           + (f" (last error: {bucket.last_error})" if bucket.last_error
                              else ""))
    check(saved and not lost,
          f"{len(saved)} steps saved up to now ({saved[:1]}…{saved[-1:]}), each committed to "
          f"the local tier by the agent and in the bucket; lost: {lost}"
          + (f" (last listing error: {bucket.last_error})" if lost and bucket.last_error
             else ""))
    return len(saved)


def check_drain_went_on(logs: Logs, pod: str, step: int, moment: float, what: str,
                        check: Check) -> float:
    """The drain of `step` was still in flight at `moment` and then reached
    the global tier (the agent's `Global` report of it, after `moment`);
    returns the seconds from `moment` to that report."""
    done = wait_for(f"step {step} Global", lambda: next(
        (e for e in logs.agent(pod) if int(e["step"]) == step and e["state"] == "Global"),
        None), 60, every=0.5)
    check(done["at"] > moment,
          f"the drain of step {step}, in flight when {what}, completed "
          f"{done['at'] - moment:.1f}s after that: {done.get('message')}")
    return float(done["at"] - moment)


def save_after(logs: Logs, pod: str, moment: float) -> dict[str, Any] | None:
    """The first save the trainer made after `moment`."""
    later = [e for e in logs.trainer(pod) if e["event"] == "save" and e["at"] > moment]
    return min(later, key=lambda e: e["at"], default=None)


def restart_driver(logs: Logs, name: str, data: Path, bucket: BucketWatch,
                   report: list[str], check: Check) -> None:
    """The driver's pod deleted while the writer `name` drains a step."""
    pod = get("pod", "-n", NS, name)
    started = containers_started(pod)
    first = saves(logs, name)
    old_driver = driver_pod()["metadata"]["name"]  # type: ignore[index]
    keep_driver_logs(logs.dir, "csi-node.before-restart.log")
    step = wait_for(f"{name}'s agent draining a step", lambda: draining(logs, name), 30,
                    every=0.2)
    restarted_at = time.time()
    began = time.monotonic()
    kubectl("-n", OP_NS, "delete", "pod", old_driver, "--wait=true", timeout=60)
    new_driver = wait_for("a new driver pod Ready", lambda: (p := driver_pod())
                          and p["metadata"]["name"] != old_driver and p, 120, every=1)
    new_name = new_driver["metadata"]["name"]
    wait_for(f"kubelet registered {new_name}", lambda: registered_by(new_name), 60, every=1)
    back = time.monotonic() - began
    # CSINode is no proof: the API may keep its entry whatever kubelet did.
    check(new_name != old_driver and registered_by(new_name),
          f"driver pod {old_driver} deleted while step {step} drained; {new_name} "
          f"registered {back:.1f}s later (its log: {REGISTERED!r})")
    after = wait_for("two checkpoints after the driver's restart", lambda: len(
        s := [n for n in saves(logs, name) if n > max(first)]) >= 2 and s, 60, every=1)
    still = trainer_pod()
    check(still and still["metadata"]["uid"] == pod["metadata"]["uid"]
          and containers_started(still) == started and mounted(target(pod)),
          f"{name} runs on, no container of it restarted, its volume stays mounted; steps "
          f"{after} saved after the restart")
    newer = [p for p in data.rglob("*") if p.is_file() and p.stat().st_mtime > restarted_at]
    check(newer, f"{len(newer)} files written to the driver's data dir after its restart")
    drained = check_drain_went_on(logs, name, step, restarted_at,
                                  "its driver's pod was deleted", check)
    steps = check_nothing_lost(logs, name, bucket, time.time(), check)
    report.append(f"| csi: driver pod deleted while step {step} drained → pod untouched, "
                  f"replacement registered, 0 steps lost | registered {back:.1f} s later; "
                  f"step {step} global {drained:.1f} s after the delete; {steps} of {steps} "
                  f"steps saved so far in S3 |")


def node_sh(action: str) -> None:
    """node.sh on node a (as root, like the cluster's start). E2E_NODE=a
    whatever the scenario's environment says; kubelet's own environment is
    node.sh's to give back (start-kubelet restores the stopped kubelet's)."""
    try:
        done = subprocess.run([str(NODE_SH), action], capture_output=True, text=True,
                              timeout=NODE_SH_TIMEOUT_S, env={**os.environ, "E2E_NODE": "a"})
    except subprocess.TimeoutExpired as err:
        raise Failed(f"node.sh {action} still running after {NODE_SH_TIMEOUT_S}s") from err
    if done.returncode != 0:
        raise Failed(f"node.sh {action} exited {done.returncode}: {done.stderr.strip()[-400:]}")


def health_refused() -> bool:
    """Whether node a's kubelet health endpoint refuses connections (no kubelet)."""
    try:
        with urllib.request.urlopen(KUBELET_HEALTHZ, timeout=2):
            return False
    except urllib.error.URLError as err:
        return isinstance(err.reason, ConnectionRefusedError)
    except OSError:
        return False


@contextlib.contextmanager
def kubelet_stopped(say: Say) -> Iterator[None]:
    """Node a's kubelet stopped for the block and started again however the
    block ends; a start that fails after the block failed is said, and the
    block's own error is the one raised."""
    node_sh("stop-kubelet")
    try:
        yield
    except BaseException:
        try:
            node_sh("start-kubelet")
        except Failed as err:
            say(f"  kubelet's start after a failure while it was stopped failed too: {err}")
        raise
    node_sh("start-kubelet")


def restart_kubelet(logs: Logs, name: str, bucket: BucketWatch, report: list[str],
                    say: Say, check: Check) -> None:
    """Node a's kubelet stopped and started again while `name` drains a step."""
    pod = get("pod", "-n", NS, name)
    started = containers_started(pod)
    driver = driver_pod()
    if driver is None:
        raise Failed(f"no Ready driver pod on {NODE} before kubelet's restart")
    driver_name = driver["metadata"]["name"]
    known = registrations(driver_name)
    step = wait_for(f"{name}'s agent draining a step", lambda: draining(logs, name), 30,
                    every=0.2)
    with kubelet_stopped(say):
        # The window kubelet was down: from its stop's end to its start's beginning.
        stopped = time.time()
        refused_at_stop = health_refused()
        time.sleep(KUBELET_DOWN_S)
        refused_before_start = health_refused()
        starting = time.time()
    back = time.time()
    down = starting - stopped
    # CSINode is no proof here: the API keeps the driver's entry while kubelet
    # is away. The driver logs each registration kubelet makes.
    count = wait_for(f"kubelet registers {driver_name} again", lambda: (
        n := registrations(driver_name)) > known and n, 60, every=0.5)
    registered = time.time() - back
    check(refused_at_stop and refused_before_start,
          f"kubelet was stopped {down:.1f}s while step {step} drained (its health endpoint "
          f"refused at the stop: {refused_at_stop}, before the start: {refused_before_start}); "
          f"answering {back - starting:.1f}s after node.sh start-kubelet began, and "
          f"{registered:.1f}s later it had registered {DRIVER} again (the driver's log: "
          f"{count} registrations, {known} before)")
    # The log streams ran through kubelet: follow again, from the start, once
    # kubelet serves the pod's logs (it answers NotFound until it knows the pod).
    wait_for(f"kubelet serving {name}'s logs", lambda: kubectl(
        "logs", "-n", NS, name, "-c", "trainer", "--tail=1", check=False).returncode == 0,
        60, every=0.5)
    logs.refollow(name)
    # Once a save after the restart shows, the refollowed logs hold all before it.
    following = wait_for("a step saved after kubelet's restart",
                         lambda: save_after(logs, name, back), 60, every=0.5)
    during = [e["step"] for e in logs.trainer(name) if e["event"] == "save"
              and stopped < e["at"] < starting]
    after = get("pod", "-n", NS, name)
    check(after["metadata"]["uid"] == pod["metadata"]["uid"]
          and containers_started(after) == started,
          f"{name} is the same pod (uid {pod['metadata']['uid']}), no container restarted: "
          f"{containers_started(after)}")
    check(mounted(target(pod)), f"kubelet's target path is still a mount: {target(pod)}")
    same = driver_pod()
    check(same and same["metadata"]["name"] == driver_name
          and containers_started(same) == containers_started(driver),
          f"the driver's pod {driver_name} untouched by kubelet's restart")
    check(during, f"the trainer saved steps {during} while kubelet was stopped")
    drained = check_drain_went_on(logs, name, step, stopped, "kubelet stopped", check)
    steps = check_nothing_lost(logs, name, bucket, following["at"], check)
    report.append(f"| csi: kubelet stopped {down:.1f} s while step {step} drained → pod "
                  f"untouched, driver registered again, 0 steps lost | step {step} global "
                  f"{drained:.1f} s after the stop; {len(during)} step(s) saved while kubelet "
                  f"was down; health back {back - starting:.1f} s after the start, driver "
                  f"registered {registered:.1f} s and step {following['step']} saved "
                  f"{following['at'] - back:.1f} s after that; {steps} of {steps} steps saved "
                  f"so far in S3 |")
