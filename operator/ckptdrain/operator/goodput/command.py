"""`ckptdrain goodput`: each policy's runtime goodput, read from the cluster
through the kubeconfig (or in-cluster credentials), as a report to paste
into a postmortem (docs/goodput.md).

    ckptdrain goodput [--namespace NS | --all-namespaces] [--policy NAME]
                      [--output text|json]

Reads the policies and their injected pods; writes nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

from ckptdrain import goodput_report
from ckptdrain.contract import api
from ckptdrain.contract.goodput import pod_view
from ckptdrain.errors import CkptdrainError, InvalidInput

OUTPUTS = ("text", "json")
#: A Kubernetes object name (RFC 1123 subdomain).
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", "-n", help="the policies' namespace (default: the "
                        "kubeconfig context's, else 'default')")
    parser.add_argument("--all-namespaces", "-A", action="store_true",
                        help="every namespace's policies")
    parser.add_argument("--policy", help="only this CheckpointPolicy")
    parser.add_argument("--output", "-o", default="text", help="text (default) or json")


def _check(args: argparse.Namespace) -> None:
    if args.output not in OUTPUTS:
        raise InvalidInput("--output", "text or json", args.output)
    for flag, value in (("--namespace", args.namespace), ("--policy", args.policy)):
        if value is not None and not NAME.match(value):
            raise InvalidInput(flag, "a Kubernetes name (lower-case letters, digits, '-' "
                               "and '.')", value)
    if args.all_namespaces and args.namespace:
        raise InvalidInput("--all-namespaces", "no --namespace with it", args.namespace)


def _default_namespace() -> str:
    import yaml
    from kubernetes import config

    try:
        _, context = config.list_kube_config_contexts()
    except (config.ConfigException, OSError, TypeError, ValueError, yaml.YAMLError):
        return "default"
    return ((context or {}).get("context") or {}).get("namespace") or "default"


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def read(namespace: str | None, policy: str | None) -> list[dict[str, Any]]:
    """Each selected policy with its pods' goodput views (namespace None: all)."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from ckptdrain import kubeclient
    from ckptdrain.operator.apiserver.policy_edge import seen

    try:
        base = kubeclient.api_client()
        custom, core = client.CustomObjectsApi(base), client.CoreV1Api(base)
        if namespace is None:
            policies = custom.list_cluster_custom_object(api.GROUP, api.POLICY_VERSION,
                                                        api.POLICIES)
            pods = core.list_pod_for_all_namespaces(label_selector=f"{api.LABEL_INJECT}=true")
        else:
            policies = custom.list_namespaced_custom_object(
                api.GROUP, api.POLICY_VERSION, namespace, api.POLICIES)
            pods = core.list_namespaced_pod(namespace, label_selector=f"{api.LABEL_INJECT}=true")
    except (ConfigException, ValueError, yaml.YAMLError) as err:
        raise CkptdrainError(f"no usable kubeconfig: {_first_line(err)} (set KUBECONFIG to a "
                             "valid one)") from None
    except ApiException as err:
        raise CkptdrainError(f"the API server refused: {err.status} {err.reason}") from err
    except (HTTPError, OSError) as err:
        raise CkptdrainError(f"cannot reach the API server: {err}") from err
    # Read at the storage version, seen as the core reads it (policy_edge.py).
    items = [seen(p) for p in policies.get("items", [])
             if policy is None or p["metadata"]["name"] == policy]
    if policy is not None and not items:
        where = f"namespace {namespace!r}" if namespace else "any namespace"
        raise InvalidInput("--policy", f"the name of a CheckpointPolicy in {where}", policy)
    views: dict[tuple[str, str], list[Any]] = {}
    for pod in pods.items:
        meta = client.ApiClient().sanitize_for_serialization(pod.metadata)
        if meta.get("deletionTimestamp"):
            continue
        view = pod_view(meta.get("name", ""), meta,
                        client.ApiClient().sanitize_for_serialization(pod.status))
        owner = (meta.get("annotations") or {}).get(api.ANNOTATION_POLICY, "")
        if view is not None:
            views.setdefault((meta.get("namespace", ""), owner), []).append(view)
    return [{"policy": p, "pods": views.get((p["metadata"]["namespace"],
                                             p["metadata"]["name"]), [])} for p in items]


def run(args: argparse.Namespace) -> int:
    _check(args)
    namespace = None if args.all_namespaces else (args.namespace or _default_namespace())
    found = read(namespace, args.policy)
    now = time.time()
    reports = [goodput_report.build(f["policy"], f["pods"], now) for f in found]
    if args.output == "json":
        print(json.dumps({"generatedAt": now, "policies": reports}, indent=2, sort_keys=True))
    elif not reports:
        print(f"no CheckpointPolicy in {'any namespace' if namespace is None else namespace}")
    else:
        print("\n".join(goodput_report.text(r) for r in reports), end="")
    return 0
