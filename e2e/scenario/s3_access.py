"""Step 2: the S3 server as pods reach it (a Service by name), its bucket and
the credentials Secret the policy names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kube import get, kubectl, run, wait_for
from narration import check, say
from views import NS, S3_NS

REPO = Path(__file__).resolve().parent.parent.parent


def step2_s3(s3: Any) -> None:
    say("2. S3 server reachable from pods, bucket, credentials Secret")
    run(str(REPO / "e2e/cluster/host-service.sh"), S3_NS, "s3", str(s3.port))
    kubectl("-n", NS, "create", "secret", "generic", "s3-credentials",
            f"--from-literal=AWS_ACCESS_KEY_ID={s3.access_key}",
            f"--from-literal=AWS_SECRET_ACCESS_KEY={s3.secret_key}")
    check(s3.client().head_bucket(Bucket=s3.bucket), f"bucket {s3.bucket} exists")
    # From a pod, by Service name, as the agents will reach it.
    probe = ("import urllib.request,urllib.error\ntry: print('http', urllib.request.urlopen("
             f"'http://s3.{S3_NS}.svc.cluster.local:{s3.port}/', timeout=5).status)\n"
             "except urllib.error.HTTPError as e: print('http', e.code)")
    # Logs read once it has finished: `kubectl run -i` may attach after a quick
    # container exited and print nothing.
    kubectl("-n", NS, "run", "s3-probe", "--restart=Never",
            "--image=docker.io/library/ckptdrain:dev", "--image-pull-policy=Never",
            "--command", "--", "python3", "-c", probe)
    wait_for("the S3 probe pod to finish", lambda: get("pod", "-n", NS, "s3-probe")[
        "status"].get("phase") in ("Succeeded", "Failed"), 90)
    out = kubectl("-n", NS, "logs", "s3-probe").stdout
    kubectl("-n", NS, "delete", "pod", "s3-probe", "--wait=false")
    check("http" in out, f"a pod reaches the S3 Service by name ({out.strip()})")

