"""The CheckpointPolicy objects and reads both conversion test modules use:
the two versions, the CRD's name, kubectl's name for a version, and a
v1alpha1 policy whose spellings v1beta1 writes otherwise."""

from __future__ import annotations

import json
from typing import Any

from operator_process import ALLOWED_ROOT

from support.apiserver import Cluster

ALPHA, BETA = "ckptdrain.io/v1alpha1", "ckptdrain.io/v1beta1"
CRD = "checkpointpolicies.ckptdrain.io"


def resource(version: str) -> str:
    """The CRD's resource at one version, as kubectl names it."""
    return f"checkpointpolicies.{version.partition('/')[2]}.ckptdrain.io"


def read(cluster: Cluster, namespace: str, version: str, name: str,
         check: bool = True) -> Any:
    got = cluster.kubectl("get", "-n", namespace, resource(version), name, "-o", "json",
                          check=check)
    return json.loads(got.stdout) if check else got


def alpha_policy(name: str) -> dict[str, Any]:
    """A v1alpha1 policy with the spellings v1beta1 writes otherwise."""
    return {"apiVersion": ALPHA, "kind": "CheckpointPolicy", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "model": {"parameters": "405B", "bytesPerParameter": 12.5},
                     "interval": "1d", "overlap": "0.1",
                     "localTier": {"path": f"{ALLOWED_ROOT}/nvme", "keep": 2,
                                   "capacity": "1.5TiB"},
                     "caps": {"bandwidth": "10GB/s"},
                     "storage": {"uri": "s3://ckpt-bucket/runs",
                                 "endpoint": "http://minio.storage:9000",
                                 "credentialsSecretRef": {"name": "s3-creds"}}}}
