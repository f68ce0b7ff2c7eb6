"""Steps 3 and 4: the CheckpointPolicy and the training Job applied, then
checkpoints landing on the local tier and draining to S3 at the allocated
share."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kube import POLICIES_V1BETA1, apply, get, kubectl, wait_for
from narration import REPORT, check, say
from trainers import Logs, Trainer
from views import (
    BUCKET,
    CHECKPOINT_BYTES,
    CLASS,
    EVERY,
    GRACE,
    NS,
    POLICY,
    S3_NS,
    STEP_S,
    WRITERS,
    complete_steps,
    pod_of,
    policy_status,
    render,
)


def step3_apply(s3: Any, allowed_root: str, trainer: Trainer, torch_site: str) -> float:
    say("3. apply the CheckpointPolicy and the training Job")
    # The validating webhook refuses what the schema cannot catch (over TLS).
    bad = render("policy.yaml", NAMESPACE=NS, CHECKPOINT_BYTES="50M", ALLOWED_ROOT="/etc",
                 BUCKET=BUCKET, S3_NAMESPACE=S3_NS, S3_PORT=s3.port)
    refused = kubectl("apply", "--dry-run=server", "-f", "-", input=bad, check=False)
    check(refused.returncode != 0 and "webhook" in refused.stderr,
          f"validating webhook refuses a local tier outside the allowed root: "
          f"{refused.stderr.strip()[-160:]}")
    apply(render("policy.yaml", NAMESPACE=NS, CHECKPOINT_BYTES="50M",
                 ALLOWED_ROOT=allowed_root, BUCKET=BUCKET, S3_NAMESPACE=S3_NS, S3_PORT=s3.port))
    wait_for("policy status", lambda: policy_status().get("requiredBandwidth"), 60)
    # Read as users read it, v1beta1 through the conversion webhook: the
    # policy named no class, admission wrote in the default one.
    bound = get(POLICIES_V1BETA1, "-n", NS, POLICY)
    resolved = wait_for("the policy's ClassResolved condition", lambda: next(
        (c for c in (get(POLICIES_V1BETA1, "-n", NS, POLICY).get("status") or {})
         .get("conditions", []) if c["type"] == "ClassResolved"), None), 60, 1)
    check(bound["apiVersion"] == "ckptdrain.io/v1beta1"
          and bound["spec"].get("checkpointClassName") == CLASS
          and resolved["status"] == "True",
          f"policy {POLICY} (read at {bound['apiVersion']}) bound to the default class "
          f"{bound['spec'].get('checkpointClassName')}: ClassResolved {resolved['status']} "
          f"({resolved.get('reason')})")
    epoch = time.time()
    apply(trainer.job(render("job.yaml", NAMESPACE=NS, GRACE=GRACE, EPOCH=f"{epoch:.3f}",
                             TORCH_SITE=torch_site),
                      EVERY, STEP_S, epoch, CHECKPOINT_BYTES // WRITERS))
    return epoch


def step4_drain(logs: Logs, local_root: Path, complete: int) -> dict[int, str]:
    say("4. checkpoints land on the local tier and drain to S3 at the allocated share")
    began = time.monotonic()
    pods = {}
    for i in (0, 1):
        pod = wait_for(f"trainer {i} running", lambda i=i: pod_of(i), 240)
        pods[i] = pod["metadata"]["name"]
        logs.follow(pods[i])
        init = [c["name"] for c in pod["spec"]["initContainers"]]
        check(init[:3] == ["ckptdrain-prepare", "ckptdrain-restore", "ckptdrain-agent"],
              f"{pods[i]}: injected {init}")
    say(f"  pods running {time.monotonic() - began:.1f}s after the Job")
    first = wait_for("a checkpoint complete on S3 (both writers)",
                     lambda: complete_steps(), 180, every=1)
    say(f"  first global checkpoint: step {first[0]} "
        f"({time.monotonic() - began:.1f}s after the Job)")
    wait_for(f"{complete} complete global checkpoint(s)",
             lambda: len(complete_steps()) >= complete, 120, 1)
    print(kubectl("get", "checkpoints", "-n", NS).stdout, flush=True)
    step = complete_steps()[-1]
    for i in (0, 1):
        manifest = local_root / f"writer-{i}" / f"step-{step}" / "manifest.json"
        check(manifest.is_file(), f"writer {i}: step {step} on the local tier ({manifest})")
    status = wait_for("policy status with both drainers and a recovery point",
                      lambda: (s := policy_status()).get("drainers") == 2
                      and s.get("lastGlobalStep") is not None and s, 60, 1)
    check(status.get("recoveryPointTime") and status.get("lastLocalStep") is not None,
          f"policy status: required {status['requiredBandwidth']}, drainers "
          f"{status['drainers']}, last local step {status['lastLocalStep']}, last global "
          f"step {status['lastGlobalStep']}, recovery point {status['recoveryPointTime']}")
    # Unversioned on purpose: what a user sees, v1beta1 (the preferred
    # version), made by the operator's conversion webhook (the CRD's caBundle
    # set by it too).
    print(kubectl("get", "checkpointpolicy", "-n", NS).stdout, flush=True)
    # The cluster scale: published in the namespace, and the policy's channel
    # leaves shrinks to it once both agents said (in their own reports, under
    # their RBAC) that they read it.
    scale = wait_for("the namespace's cluster scale", lambda: get(
        "checkpointshares", "-n", NS, "--field-selector",
        "metadata.name=cluster-scale.ckptdrain.io")["items"], 60, 1)
    check(scale[0]["spec"]["clusterScale"]["factor"] == 1,
          f"cluster scale published: {scale[0]['spec']['clusterScale']}")
    channel = wait_for("the channel with the policy's claim", lambda: next(
        (c for c in get("checkpointshares", "-n", NS, "--field-selector",
                        f"metadata.name={POLICY}")["items"]
         if c["spec"].get("wantedBytes")), None), 60, 1)
    check(channel["spec"]["wantedBytes"] >= channel["spec"]["budgetBytes"],
          f"share channel: budget {channel['spec']['budgetBytes']} B/s, claim "
          f"{channel['spec']['wantedBytes']} B/s (weight × cluster cap), shrinks left "
          "to the scale")
    REPORT.append(f"| required bandwidth (policy status) | {status['requiredBandwidth']} "
                  f"for {status.get('checkpointSize')} every 10 s at 50% overlap |")
    for i in (0, 1):
        pod = get("pod", "-n", NS, pods[i])
        now = int(pod["metadata"]["annotations"]["ckptdrain.io/bandwidth"])
        drained = [e for e in logs.agent(pods[i]) if e["state"] == "Global" and e.get("seconds")]
        check(drained, f"writer {i}: agent reported drains to the global tier")
        # Shares follow the policy's drainers (its share channel), so a drain is
        # held to the largest share its agent had while it ran, not to the one
        # of this moment.
        runs = [(e["bytes"] / e["seconds"],
                 logs.share_during(pods[i], e["at"] - e["seconds"], e["at"]) or now)
                for e in drained]
        rate, share = sorted(runs, key=lambda run: run[0] / run[1])[len(runs) // 2]
        check(rate <= share * 1.15, f"writer {i}: median drain {rate / 1e6:.2f} MB/s within "
              f"its share {share / 1e6:.2f} MB/s (+15%) while it ran (now {now / 1e6:.2f})")
        REPORT.append(f"| drain rate, writer {i} (median of {len(drained)}) | "
                      f"{rate / 1e6:.2f} MB/s against an allocated share of "
                      f"{share / 1e6:.2f} MB/s ({100 * rate / share:.0f}%) |")
    return {i: pods[i] for i in pods}  # type: ignore[misc]
