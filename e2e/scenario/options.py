"""The driver's command line: its options, the combinations it refuses (each
refusal names the option and what was expected), and what `--only` leaves
out of the run."""

from __future__ import annotations

import argparse
from pathlib import Path


def parse(description: str) -> argparse.Namespace:
    """The options, checked, with `--only` applied: the optional steps it
    leaves out are cleared, and `jobset_step` says whether the JobSet step
    itself runs (Kueue's step needs the JobSet controller, not that step)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--node-ip", default="10.244.0.1")
    parser.add_argument("--allowed-root", required=True)
    parser.add_argument("--torch-site", help="an installed torch for train.py (not --short)")
    parser.add_argument("--short", action="store_true",
                        help="CI's scenario: the simulated trainer, fewer waits, no 7b")
    parser.add_argument("--image-repo", default="docker.io/library/ckptdrain")
    parser.add_argument("--jobset-chart", help="JobSet's Helm chart: run the JobSet step "
                        "(e2e/scenario/jobset.py) on the real JobSet controller")
    parser.add_argument("--jobset-image", default="localhost/ckptdrain/jobset:v0.9.1")
    parser.add_argument("--lws-chart", help="LeaderWorkerSet's Helm chart: run the LWS step "
                        "(e2e/scenario/lws.py) on the real LWS controller")
    parser.add_argument("--lws-image", default="localhost/ckptdrain/lws:v0.7.0")
    parser.add_argument("--kueue-chart", help="Kueue's Helm chart: run the Kueue preemption "
                        "step (e2e/scenario/kueue.py; needs --jobset-chart)")
    parser.add_argument("--kueue-image", default="localhost/ckptdrain/kueue:v0.13.5")
    parser.add_argument("--chaos", action="store_true",
                        help="run the chaos step (e2e/scenario/chaos.py) before uninstalling")
    parser.add_argument("--dcp", action="store_true",
                        help="run the DCP resharding step (e2e/scenario/dcp.py; not --short)")
    parser.add_argument("--only", choices=("dcp", "peer", "agreement", "processes", "move",
                                            "jobset", "kueue", "csi"),
                        help="install, S3, that step alone, uninstall (skips steps 3-7 and "
                        "the other optional steps)")
    args = parser.parse_args()
    if args.short and args.only == "csi":
        parser.error("--only csi: expected the full run (the CSI step is not part of CI's)")
    if not args.short and not args.torch_site and args.only not in ("kueue", "csi"):
        parser.error("--torch-site: expected the directory holding torch (or --short)")
    if (args.dcp or args.only == "dcp") and args.short:
        parser.error("--dcp/--only dcp: expected the full run (the torch trainer image)")
    args.jobset_step = True
    if args.only == "kueue" and not args.kueue_chart:
        parser.error("--only kueue: expected --kueue-chart (the full run builds Kueue)")
    if args.kueue_chart and not args.jobset_chart:
        parser.error("--kueue-chart: expected --jobset-chart too (Kueue queues a JobSet)")
    if args.only:
        args.lws_chart = None
        # Kueue's step queues a JobSet: its controller stays, its own step
        # goes (it runs only alone or in the whole run).
        args.jobset_step = args.only == "jobset"
        if args.only not in ("jobset", "kueue"):
            args.jobset_chart = None
        if args.only != "kueue":
            args.kueue_chart = None
        args.chaos, args.dcp = False, args.only == "dcp"
    return args
