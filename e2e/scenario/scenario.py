"""The end-to-end scenario of issue 6, as a user lives it, on a running cluster.

    python e2e/scenario/scenario.py --report FILE ...   (e2e/run.sh sets everything up)
    python e2e/scenario/scenario.py --short ...         (e2e/run.sh --short)

Each step asserts what a user would check with kubectl, and the run ends with
a short report of measured timings. Needs KUBECONFIG, kubectl and helm on
PATH (or KUBECTL/HELM), root (the local tier is a directory on this node),
and the images ckptdrain:dev and ckptdrain-trainer:dev in the cluster.

`--short` (CI's scenario) runs the demo's simulated trainer from the project
image (no torch, no trainer image) and leaves out what the full run measures
at length: it waits for one complete checkpoint instead of three, does not
wait for training to go on after the first restore, and skips the corrupted
local copy (7b). Everything else is the same step, asserted the same way.

After the main steps, the peer tier step (e2e/scenario/peer.py, in both
runs): two writers on the cluster's two nodes, one node lost (its local tier
wiped, its pod deleted), and the replacement restores the newest local step
from its partner, not the older global one.

Then the restore agreement step (e2e/scenario/agreement.py, in both runs):
two writers on the two nodes with the peer tier off. Both pods deleted with
their nodes intact, both ranks restore the same local step, newer than the
newest global one, and status.goodput counts only the steps since it;
writer 0's node lost (its local tier wiped) and both pods deleted, both
restore the newest global step; a trainer restarted inside its pod
(restartPolicy OnFailure) resumes from the newest step both writers saved,
not from the one restored when its pod started; 2 writers and 2 reader
replicas deleted at once all restore one step, each reader its shard.

Then the pods people run (e2e/scenario/processes.py, in both runs): two
pods of two processes each (ckptdrain.demo.processes, as torchrun
`--nproc_per_node=2`), the trainers as root and then as uid 1000: requests
reach them, every step holds both processes' files, and after each gang
deletion all four processes load one step, the uid 1000 trainers first
what the root trainers saved.

More steps run before the uninstall when asked: `--jobset-chart` the
JobSet step (e2e/scenario/jobset.py: 4 writers of one JobSet on the real
JobSet controller), `--lws-chart` the LeaderWorkerSet step
(e2e/scenario/lws.py: 4 writers of one LeaderWorkerSet on the real LWS
controller), `--kueue-chart` the Kueue step (e2e/scenario/kueue.py: a
queued JobSet preempted by the real Kueue, readmitted with no step lost;
`--only kueue` runs it alone, with the JobSet controller it needs),
`--chaos` the chaos step (e2e/scenario/chaos.py:
operator pods killed under a burst of opted-in pods, the sweep, admission
latency through a rolling restart).

`--only csi` (full run only, E2E_ONLY=csi) runs the CSI node tier step
alone (e2e/scenario/csi.py): the driver on the real kubelet, a writer of
a `restricted` namespace checkpointing and restoring through it.

Last, in both runs, the quickstart (e2e/scenario/quickstart.py): the blocks of
docs/quickstart.md run as written on the same cluster, and what its "Check
that it works" promises, checked.

This file holds the order of the steps; each lives in a module named for it:
options.py (the command line), release.py (steps 1 and 8: the chart's
install and uninstall, a previous run's leftovers), s3_access.py (step 2),
job_drain.py (steps 3-4), job_restore.py (steps 5-7), narration.py (`say`,
`check` and the report table every step writes to).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agreement
import chaos
import csi
import dcp
import dcp_procs
import diagnosis
import goodput_check
import jobset
import kueue
import lws
import move
import options
import peer
import platform_class
import processes
import quickstart
from job_drain import step3_apply, step4_drain
from job_restore import step5_6, step7a, step7b
from kube import Failed, kubectl
from narration import REPORT, check, say, write_report
from release import keep_operator_logs, leftovers, step1_install, step8_uninstall
from s3_access import step2_s3
from s3server import seaweedfs
from trainers import TRAINERS, Logs, Trainer
from views import BUCKET, NS, POLICY


def main_steps(s3: Any, args: argparse.Namespace, trainer: Trainer, logs: Logs,
               local_root: Path) -> None:
    """Steps 3-7: the training Job, its drains, SIGTERM, restores."""
    epoch = step3_apply(s3, args.allowed_root, trainer, args.torch_site or "/nonexistent")
    pods = step4_drain(logs, local_root, complete=1 if args.short else 3)
    pods = step5_6(logs, pods, epoch, goes_on=not args.short)
    step7a(logs, pods, epoch, local_root)
    if not args.short:
        step7b(logs, pods, epoch, local_root)
    # Each deleted pod is one interruption: 5/6 and 7a, and 7b's three (both
    # writers at once, then writer 0).
    goodput_check.cli(REPORT, check, say, interruptions=2 if args.short else 5)


def main() -> int:
    args = options.parse(__doc__.splitlines()[0])
    trainer = TRAINERS["sim" if args.short else "torch"]
    logs = Logs(args.workdir / "logs", NS, trainer)
    local_root = Path(args.allowed_root) / NS / POLICY
    shutil.rmtree(local_root, ignore_errors=True)
    ok = False
    try:
        leftovers()
        if args.jobset_chart:
            # Installed first, awaited later: its certificates settle meanwhile.
            jobset.install_controller(args.jobset_chart, args.jobset_image)
        if args.lws_chart:
            lws.install_controller(args.lws_chart, args.lws_image)
        step1_install(args.image_repo, args.allowed_root)
        with seaweedfs(args.node_ip, args.workdir / "s3", BUCKET) as s3:
            step2_s3(s3)
            platform_class.install(s3, args.allowed_root, say, check)
            if not args.only:
                main_steps(s3, args, trainer, logs, local_root)
            if args.only in (None, "peer"):
                peer.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.only in (None, "agreement"):
                agreement.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.only in (None, "processes"):
                processes.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.only in (None, "move"):
                move.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.only == "csi":
                csi.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.jobset_chart and args.jobset_step:
                jobset.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.lws_chart:
                lws.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.kueue_chart:
                kueue.run(s3, args.kueue_chart, args.kueue_image, args.allowed_root,
                          args.workdir, REPORT, say, check)
            if args.dcp:
                dcp.run(s3, args.allowed_root, args.torch_site, args.workdir, REPORT, say, check)
                dcp_procs.run(s3, args.allowed_root, args.torch_site, REPORT, say, check)
            if args.chaos:
                chaos.run(s3, args.allowed_root, REPORT, say, check)
            step8_uninstall()
        if not args.only:
            quickstart.run(REPORT, say, check)
            if s3.restarts:
                REPORT.append(f"| S3 server restarts (stopped from outside) | "
                              f"{len(s3.restarts)} |")
        ok = True
    except Failed as err:
        say(f"FAILED: {err}")
        for line in kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp",
                            check=False).stdout.splitlines()[-25:]:
            print("  event:", line)
        diagnosis.print_state(say)
        keep_operator_logs(logs.dir / "operator.log")
    finally:
        logs.stop()
        write_report(args.report)
        say(f"logs of every pod in {logs.dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
