"""The policy lookup the driver trusts: (namespace, name) -> metadata.uid,
read from the apiserver with the driver's own ServiceAccount (get on
checkpointpolicies, cluster-wide, nothing else).

The namespace is the pod's, from kubelet; the name is the tenant's. A 404
means no such policy there (NOT_FOUND for the pod); anything else means the
driver cannot tell, and kubelet retries (UNAVAILABLE).
"""

from __future__ import annotations

from typing import Any

from ckptdrain.csi.requests import Refused
from ckptdrain.csi.volumes import PolicyResolver
from ckptdrain.errors import InvalidInput

GROUP, VERSION, PLURAL = "ckptdrain.io", "v1alpha1", "checkpointpolicies"


def policies_api() -> Any:
    """The driver's CustomObjectsApi (in-cluster, else KUBECONFIG), made at
    start: missing credentials end the driver with one line instead of
    failing every volume later."""
    from kubernetes.config import ConfigException

    from ckptdrain import kubeclient

    try:
        return kubeclient.custom_objects_api()
    except ConfigException as err:
        raise InvalidInput("apiserver credentials",
                           "in-cluster (a ServiceAccount token) or a KUBECONFIG", str(err)) from err


def apiserver_resolver(api: Any) -> PolicyResolver:
    """A resolver over `api`, a kubernetes CustomObjectsApi."""

    def resolve(namespace: str, name: str) -> str | None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            policy = api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=10)
        except ApiException as err:
            if err.status == 404:
                return None
            raise Refused("UNAVAILABLE", f"reading CheckpointPolicy {namespace}/{name} from "
                          f"the apiserver: HTTP {err.status} {err.reason}") from err
        except (OSError, HTTPError) as err:  # no connection, a timeout
            raise Refused("UNAVAILABLE", f"reading CheckpointPolicy {namespace}/{name} from "
                          f"the apiserver: {err}") from err
        return str(policy["metadata"]["uid"])

    return resolve
