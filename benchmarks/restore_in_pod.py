"""The fixed cost of a restore as its init container pays it: a one-byte
checkpoint from MinIO, and the result written on the pod through a real
kube-apiserver, as the pod's ServiceAccount with the token and CA mounted.

    .venv/bin/python -m benchmarks restore_in_pod [--rounds N] [--compare-tree OLD]

Runs (interleaved, every variant once per round): `ckptdrain restore` in a
pod (the KUBERNETES_SERVICE_* environment, the token and CA in files), the
same outside a pod (no apiserver: what benchmarks/transfer.py --fixed-only
measures), and with --compare-tree the restore of another source tree in a
pod. The difference between in and out of a pod is what talking to the
apiserver costs a restore. Needs `make servers` (etcd, kube-apiserver,
MinIO). Writes docs/benchmarks-restore-in-pod.json unless --out says where.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.harness import run_child_under_load_watch
from benchmarks.machine_state import read_state

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

from support import apiserver  # noqa: E402
from support.s3servers import start_minio  # noqa: E402

NAMESPACE, POD, ACCOUNT = "bench", "trainer-0", "trainer"

#: Run in the child: point the in-cluster set-up at the benchmark's token and
#: CA (the kubelet's fixed paths are not ours to write here), then restore.
#: The SDK-free client reads its paths from kube_rest; a tree without it
#: (--compare-tree) builds the SDK's in-cluster configuration from the same
#: files. Either import is part of what the restore pays.
LAUNCH = """
import sys
try:
    from ckptdrain import kube_rest
    kube_rest.TOKEN_PATH, kube_rest.CA_PATH = sys.argv[1], sys.argv[2]
except ImportError:
    from kubernetes.config import incluster_config
    incluster_config.SERVICE_TOKEN_FILENAME = sys.argv[1]
    incluster_config.SERVICE_CERT_FILENAME = sys.argv[2]
from ckptdrain import cli
sys.exit(cli.main(["restore"]))
"""


def _cluster_side(cluster: Any, work: Path) -> tuple[dict[str, str], Path, Path, str]:
    """A namespace, a ServiceAccount that may patch pods there, a pod, a
    token bound to it: (environment, token file, CA file, pod uid)."""
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": ACCOUNT, "namespace": NAMESPACE},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": ACCOUNT, "namespace": NAMESPACE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
         "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": NAMESPACE},
         "spec": {"serviceAccountName": ACCOUNT,
                  "containers": [{"name": "trainer", "image": "trainer:1"}]}},
    ]
    for obj in objects:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
    uid = cluster.kubectl("get", "pod", POD, "-n", NAMESPACE,
                          "-o", "jsonpath={.metadata.uid}").stdout
    token = cluster.kubectl("create", "token", ACCOUNT, "-n", NAMESPACE, "--duration=2h",
                            "--bound-object-kind=Pod", f"--bound-object-name={POD}",
                            f"--bound-object-uid={uid}").stdout.strip()
    token_file, ca_file = work / "token", work / "ca.crt"
    token_file.write_text(token)
    ca_file.write_bytes(Path(cluster.ca_file).read_bytes())
    address = urlsplit(cluster.server)
    return ({"KUBERNETES_SERVICE_HOST": str(address.hostname),
             "KUBERNETES_SERVICE_PORT": str(address.port)}, token_file, ca_file, uid)


def _summary(runs: list[tuple[Any, Any]]) -> dict[str, Any]:
    fed = [run for run, load in runs if not load.starved] or [run for run, _ in runs]
    wall, cpu = [r.seconds for r in fed], [r.cpu_seconds for r in fed]
    return {"wall_ms": round(statistics.median(wall) * 1000), "wall_min_ms":
            round(min(wall) * 1000), "wall_max_ms": round(max(wall) * 1000),
            "cpu_ms": round(statistics.median(cpu) * 1000), "cpu_min_ms": round(min(cpu) * 1000),
            "cpu_max_ms": round(max(cpu) * 1000), "runs": len(runs),
            "starved_runs": sum(load.starved for _, load in runs)}


def measure(rounds: int, compare_tree: Path | None, work: Path) -> dict[str, Any]:
    with apiserver.running(work / "cluster") as cluster, start_minio(work / "s3") as server:
        bucket = server.create_bucket()
        src = work / "step-1"
        src.mkdir()
        (src / "model.bin").write_bytes(b"x")
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("CKPTDRAIN_", "AWS_", "KUBERNETES_"))}
        base.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode as the image has it
        base.update(AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key,
                    AWS_REGION=server.region, CKPTDRAIN_S3_ENDPOINT=server.endpoint_url,
                    CKPTDRAIN_STORE_URI=f"s3://{bucket}/job")
        ours = base | {"PYTHONPATH": str(ROOT / "operator")}
        push = run_child_under_load_watch(
            [sys.executable, "-m", "ckptdrain", "push", str(src), f"s3://{bucket}/job", "-q",
             "--endpoint-url", server.endpoint_url], ours, [])[0]
        assert push.returncode == 0, push.stderr
        kube_env, token, ca, uid = _cluster_side(cluster, work)
        pod_env = {**kube_env, "CKPTDRAIN_POLICY": f"{NAMESPACE}/llama",
                   "CKPTDRAIN_POD_NAME": POD, "CKPTDRAIN_POD_UID": uid,
                   "CKPTDRAIN_NAMESPACE": NAMESPACE}
        variants = {"in a pod": (ROOT, pod_env), "outside a pod": (ROOT, {})}
        if compare_tree is not None:
            variants["in a pod, before"] = (compare_tree, pod_env)
        runs: dict[str, list[tuple[Any, Any]]] = {name: [] for name in variants}
        for index in range(rounds):
            for name, (tree, extra) in variants.items():
                env = base | extra | {
                    "PYTHONPATH": str(tree / "operator"),
                    "CKPTDRAIN_WORK_DIR": str(work / f"work-{index}-{len(runs[name])}"),
                    "CKPTDRAIN_LOCAL_DIR": str(work / "local")}
                argv = [sys.executable, "-c", LAUNCH, str(token), str(ca)]
                run, load = run_child_under_load_watch(argv, env, [server.process.pid])
                # A patch that failed is logged, not fatal: a run that did not
                # reach the apiserver would measure less than a restore pays.
                assert run.returncode == 0 and "could not annotate" not in run.stderr, \
                    f"{name}: {run.stderr}"
                runs[name].append((run, load))
        out = {name: _summary(got) for name, got in runs.items()}
    for name, e in out.items():
        print(f"  {name:18} {e['wall_ms']:5d} ms wall ({e['wall_min_ms']}–{e['wall_max_ms']}) "
              f"{e['cpu_ms']:5d} ms CPU ({e['cpu_min_ms']}–{e['cpu_max_ms']}), "
              f"{e['runs']} runs ({e['starved_runs']} starved)", flush=True)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks restore_in_pod",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--compare-tree", type=Path, default=None,
                        help="another source tree (with operator/ckptdrain/) restored in a pod "
                             "beside this one")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks-restore-in-pod.json"))
    args = parser.parse_args(argv)
    if args.compare_tree is not None and not (
            args.compare_tree / "operator" / "ckptdrain" / "__init__.py").is_file():
        parser.error(f"--compare-tree: expected a source tree with operator/ckptdrain/, "
                     f"got {args.compare_tree}")
    report: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "benchmarks", "restore_in_pod", *argv]),
        "machine_at_start": read_state().to_json(), "rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="ckptdrain-bench-pod-") as tmp:
        print(f"restore of a one-byte checkpoint from MinIO, {args.rounds} interleaved rounds:",
              flush=True)
        report["restore"] = measure(args.rounds, args.compare_tree, Path(tmp))
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0
