"""The DCP step: a resharded restart on the real cluster (full run, torch trainer).

An indexed Job of 2 pods (2 writers of CheckpointPolicy `dcp`) runs
`train_dcp.py`: a gloo group of both ranks (rendezvous file on a host
directory every pod mounts; one node), checkpointing step SAVE_AT with
`ckptdrain.dcp.async_save`, each tensor sharded over both ranks. Once both
writers' manifests of that step are in S3, the Job is deleted, the policy
goes to 1 writer, and a Job of 1 pod comes back, with nothing else changed.
Its restore init container finds the newest step saved by 2 writers, places
nothing and hands it over (outcome `reshard`, restore/reshard.py); the pod
loads it with `ckptdrain.dcp.load`, resharded from 2 writers to 1: it must
resume from SAVE_AT with the state hash the 2 ranks saved.

No retries (backoffLimit 0): a replacement pod would meet its peer through
the first attempt's rendezvous file, at an address that is gone ("No route to
host"), hiding why the first attempt failed. A failed trainer fails the step
at once with every DCP pod's state and log tail in the message.

    run(s3, allowed_root, torch_site, workdir, report, say, check)
"""

from __future__ import annotations

import json
import shutil
import string
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kube import POLICIES, Fatal, apply, get, kubectl, logs, wait_for
from views import BUCKET, GRACE, NS, S3_NS

NAME, PREFIX, SAVE_AT, SAVED_WRITERS = "dcp", "dcp", 40, 2
RESTORE_RESULT = "ckptdrain.io/restore-result"
HERE = Path(__file__).resolve().parent

Say = Callable[[str], None]
Check = Callable[[object, str], None]


def _render(name: str, **values: object) -> str:
    return string.Template((HERE / name).read_text()).substitute(
        {k: str(v) for k, v in values.items()})


def policy_manifest(allowed_root: str, s3_port: int, writers: int) -> str:
    doc = yaml.safe_load(_render("policy.yaml", NAMESPACE=NS, CHECKPOINT_BYTES="10M",
                                 ALLOWED_ROOT=allowed_root, BUCKET=BUCKET, S3_NAMESPACE=S3_NS,
                                 S3_PORT=s3_port))
    doc["metadata"]["name"] = NAME
    doc["spec"]["selector"] = {"matchLabels": {"app": NAME}}
    doc["spec"]["writers"] = writers
    doc["spec"]["storage"]["uri"] = f"s3://{BUCKET}/{PREFIX}"
    return json.dumps(doc)


def job_manifest(name: str, writers: int, s3_port: int, torch_site: str, rdv: Path) -> str:
    """job.yaml's torch pod running train_dcp.py as `writers` ranks of one gloo group."""
    job = yaml.safe_load(_render("job.yaml", NAMESPACE=NS, GRACE=GRACE, EPOCH="0",
                                 TORCH_SITE=torch_site))
    job["metadata"]["name"] = name
    job["spec"] |= {"completions": writers, "parallelism": writers, "backoffLimit": 0}
    job["spec"].pop("podFailurePolicy", None)
    pod = job["spec"]["template"]
    pod["metadata"]["labels"] = {"app": NAME, "ckptdrain.io/inject": "true"}
    (container,) = pod["spec"]["containers"]
    container["command"] = ["python3", "/opt/trainer/train_dcp.py"]
    container["env"] = [e for e in container["env"] if e["name"] == "TRAIN_TORCH_SITE"] + [
        {"name": "TRAIN_SAVE_AT", "value": str(SAVE_AT)},
        {"name": "TRAIN_STEP_SECONDS", "value": "0.1"},
        {"name": "TRAIN_RDV", "value": f"/rdv/{name}"},
        # Where the agent drains: the policy's URI, then <namespace>/<policy>.
        {"name": "CKPTDRAIN_STORE_URI", "value": f"s3://{BUCKET}/{PREFIX}/{NS}/{NAME}"},
        {"name": "CKPTDRAIN_S3_ENDPOINT",
         "value": f"http://s3.{S3_NS}.svc.cluster.local:{s3_port}"},
        {"name": "AWS_REGION", "value": "us-east-1"},
    ]
    container["envFrom"] = [{"secretRef": {"name": "s3-credentials"}}]
    container["volumeMounts"].append({"name": "rdv", "mountPath": "/rdv"})
    pod["spec"]["volumes"].append({"name": "rdv", "hostPath": {"path": str(rdv),
                                                              "type": "Directory"}})
    return json.dumps(job)


def _events(pod: str) -> list[dict[str, Any]]:
    return [e for e in logs(NS, pod, "trainer") if "event" in e]


def _pods(job: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in get(
        "pods", "-n", NS, "-l", f"batch.kubernetes.io/job-name={job}")["items"]
        if not p["metadata"].get("deletionTimestamp"))


def _event(pod: str, kind: str) -> dict[str, Any] | None:
    return next((e for e in _events(pod) if e["event"] == kind), None)


def _diagnosis(job: str) -> str:
    """Each of the Job's pods: phase, how its containers ended, its trainer log tail."""
    lines = []
    for pod in get("pods", "-n", NS, "-l", f"batch.kubernetes.io/job-name={job}")["items"]:
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        containers = ((status.get("initContainerStatuses") or [])
                      + (status.get("containerStatuses") or []))
        ended = [f"{c['name']}: {json.dumps(c.get('state'))}" for c in containers]
        tail = kubectl("logs", "-n", NS, name, "-c", "trainer", "--tail=15", check=False)
        lines += [f"--- {name} ({status.get('phase')}, {status.get('podIP')})", *ended,
                  (tail.stdout or tail.stderr).rstrip()]
    return "\n".join(lines)


def _failed(job: str) -> bool:
    found = get("jobs", "-n", NS, "--field-selector", f"metadata.name={job}")["items"]
    return bool(found and (found[0].get("status") or {}).get("failed"))


def _all_have(job: str, count: int, kind: str) -> list[str] | None:
    """The Job's `count` pods once each printed a `kind` event, else None.
    Fails at once, with the pods' story, when one of them failed."""
    if _failed(job):
        raise Fatal(f"job {job} failed before every trainer printed {kind!r}:\n"
                     + _diagnosis(job))
    names = _pods(job)
    if len(names) == count and all(_event(n, kind) for n in names):
        return names
    return None


def _injects_one_writer() -> bool:
    """Whether the webhook has seen the policy's new writer count: a server-side
    dry run of a bare pod it selects (no rank: admitted only with 1 writer)."""
    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "dcp-probe", "namespace": NS,
                          "labels": {"app": NAME, "ckptdrain.io/inject": "true"}},
             "spec": {"containers": [{"name": "trainer", "image": "docker.io/library/ckptdrain:dev",
                                      "imagePullPolicy": "Never"}]}}
    done = kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                   input=json.dumps(probe), check=False)
    if done.returncode != 0:
        return False
    env = {e["name"]: e.get("value") for c in json.loads(done.stdout)["spec"]["containers"]
           if c["name"] == "trainer" for e in c.get("env") or []}
    return env.get("CKPTDRAIN_WRITERS") == "1"


def _restore_of(pod: str) -> tuple[dict[str, Any], str]:
    """What the pod's restore init container did: its `ckptdrain.io/restore-result`
    annotation and the last line it printed."""
    annotations = get("pod", "-n", NS, pod)["metadata"].get("annotations") or {}
    lines = kubectl("logs", "-n", NS, pod, "-c", "ckptdrain-restore",
                    check=False).stdout.splitlines()
    return json.loads(annotations.get(RESTORE_RESULT) or "{}"), (lines[-1] if lines else "")


def _committed_writers(s3: Any, step: int) -> int:
    listed = s3.client().list_objects_v2(Bucket=BUCKET,
                                         Prefix=f"{PREFIX}/{NS}/{NAME}/manifests/{step:020d}/")
    return len(listed.get("Contents", []))


def run(s3: Any, allowed_root: str, torch_site: str, workdir: Path, report: list[str],
        say: Say, check: Check) -> None:
    say(f"DCP. {SAVED_WRITERS} ranks save with ckptdrain.dcp; 1 rank resumes, resharded")
    began = time.monotonic()
    # A fresh local tier, as the store is: a copy marked global in a store
    # an earlier run left behind would never be drained to this one.
    shutil.rmtree(Path(allowed_root) / NS / NAME, ignore_errors=True)
    rdv = workdir / "dcp-rdv"
    rdv.mkdir(parents=True, exist_ok=True)
    rdv.chmod(0o777)  # the trainer runs as an unprivileged user
    for old in rdv.iterdir():
        old.unlink()
    apply(policy_manifest(allowed_root, s3.port, SAVED_WRITERS))
    apply(job_manifest("dcp-save", SAVED_WRITERS, s3.port, torch_site, rdv))
    pods = wait_for("both DCP trainers to save", lambda: _all_have("dcp-save", SAVED_WRITERS,
                                                                 "save"), 600, every=3)
    saves = {n: _event(n, "save") for n in pods}
    hashes = {s["hash"] for s in saves.values() if s}
    check({s["step"] for s in saves.values() if s} == {SAVE_AT} and len(hashes) == 1,
          f"both ranks saved step {SAVE_AT} with one state hash ({sorted(hashes)})")
    wait_for(f"step {SAVE_AT} committed by both writers", lambda: _committed_writers(
        s3, SAVE_AT) == SAVED_WRITERS, 300, every=2)
    saved = time.monotonic() - began
    kubectl("delete", "job", "-n", NS, "dcp-save", "--wait=true", "--timeout=90s", timeout=100)
    wait_for("the saving pods gone", lambda: not _pods("dcp-save"), 120, every=2)

    # The policy webhook refuses a writer count change while pods of the
    # policy live, as its view of pods (a watch) has them: that view may
    # trail the API's by a moment after the last pod is gone.
    wait_for("the policy webhook to allow spec.writers 1 (no pod of it left)", lambda: kubectl(
        "-n", NS, "patch", POLICIES, NAME, "--type=merge",
        "-p", json.dumps({"spec": {"writers": 1}}), check=False).returncode == 0, 60, every=2)
    wait_for("the webhook to inject 1 writer", _injects_one_writer, 60, every=1)
    resumed_at = time.monotonic()
    apply(job_manifest("dcp-resume", 1, s3.port, torch_site, rdv))
    (pod,) = wait_for("the single DCP trainer to load",
                      lambda: _all_have("dcp-resume", 1, "load"), 600, every=3)
    load, start = _event(pod, "load"), _event(pod, "start")
    assert load is not None and start is not None
    result, line = _restore_of(pod)
    check(result.get("outcome") == "reshard" and result.get("step") == SAVE_AT
          and f"saved by {SAVED_WRITERS} writer(s), this job has 1" in line,
          f"restore handed step {result.get('step')} over to be resharded, nothing placed "
          f"(outcome {result.get('outcome')}): {line!r}")
    check(load["step"] == SAVE_AT and start["world"] == 1,
          f"1 rank (world {start['world']}) resumed from step {load['step']} with "
          f"ckptdrain.dcp.load (saved {SAVE_AT} by {SAVED_WRITERS})")
    check(load["hash"] in hashes, "the resharded state hash equals the one 2 ranks saved")
    report.append(f"| DCP: 2 ranks save step {SAVE_AT}, committed | {saved:.1f} s |")
    report.append(f"| DCP: 1 rank resumes it resharded, equal state hash | "
                  f"{time.monotonic() - resumed_at:.1f} s |")
    kubectl("delete", "job", "-n", NS, "dcp-resume", "--wait=true", "--timeout=90s",
            timeout=100)
    wait_for("the resumed pod gone", lambda: not _pods("dcp-resume"), 120, every=2)
    kubectl("delete", POLICIES, "-n", NS, NAME, "--wait=true", timeout=60)
