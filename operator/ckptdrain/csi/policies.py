"""The policy lookup the driver trusts: (namespace, name) -> metadata.uid
(and the class the policy names), read from the apiserver with the driver's
own ServiceAccount (get on checkpointpolicies, list on checkpointclasses,
cluster-wide, nothing else).

The namespace is the pod's, from kubelet; the name is the tenant's. Only a
404 whose body is a NotFound Status naming this very policy means no such
policy there (NOT_FOUND for the pod; DELETED for the collector). Any other
answer means the driver cannot tell, and kubelet retries (UNAVAILABLE; the
collector decides nothing): that includes the plain-text `404 page not
found` the apiserver gives for a group/version it does not serve (a CRD
upgrade that stops serving this version, an old driver mid-rollout), which
would otherwise read as every policy deleted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ckptdrain.contract.api import CLASS_VERSION, CLASSES, class_named
from ckptdrain.csi.class_reclaim import ClassLister
from ckptdrain.csi.requests import Refused
from ckptdrain.csi.volumes import PolicyFound, PolicyResolver
from ckptdrain.errors import InvalidInput

#: The storage version (from 0.3.0): the driver reads a policy's uid and
#: the class its spec names (spec.checkpointClassName) at this version, and
#: asks no conversion of the operator.
GROUP, VERSION, PLURAL = "ckptdrain.io", "v1beta1", "checkpointpolicies"


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


def storage_api(api: Any) -> Any:
    """A StorageV1Api with `api`'s credentials, on a client of its own that
    makes one try a request (urllib3 retries three more by default, each
    with the whole timeout, and a scan waits for the write): the node's free
    space is published through it (capacity_publisher.py)."""
    import copy

    from kubernetes import client
    from urllib3.util.retry import Retry

    configuration = copy.deepcopy(api.api_client.configuration)
    configuration.retries = Retry(total=0, raise_on_status=False)
    return client.StorageV1Api(client.ApiClient(configuration))


def api_errors() -> tuple[type[Exception], ...]:
    """What a request through the SDK may raise: an HTTP answer (its
    `status` and `reason`) or a transport error. Taken here so the rest of
    the driver never imports the SDK."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return (ApiException, HTTPError)


def status_of(error: BaseException) -> int | None:
    """The HTTP status of an error from api_errors(); None for a transport error."""
    status = getattr(error, "status", None)
    return status if isinstance(status, int) else None


def names_the_policy(status: int | None, body: str | bytes | None, name: str) -> bool:
    """Whether an error answer says that CheckpointPolicy `name` does not
    exist: a 404 whose body is a Status with reason NotFound and details
    naming it (the apiserver sends details.kind as the resource, not the
    Kind)."""
    if status != 404 or not body:
        return False
    try:
        found = json.loads(body)
    except ValueError:
        return False  # "404 page not found": a path the apiserver does not serve
    if not isinstance(found, dict) or not isinstance(found.get("details"), dict):
        return False
    details = found["details"]
    return (found.get("kind") == "Status" and found.get("reason") == "NotFound"
            and details.get("name") == name and details.get("kind") == PLURAL
            and details.get("group") == GROUP)


def apiserver_resolver(api: Any, version: str = VERSION) -> PolicyResolver:
    """A resolver over `api`, a kubernetes CustomObjectsApi, reading
    `version` of the CheckpointPolicy API: the policy's uid and the class
    its spec names."""

    def resolve(namespace: str, name: str) -> PolicyFound | None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            policy = api.get_namespaced_custom_object(
                GROUP, version, namespace, PLURAL, name, _request_timeout=10)
        except ApiException as err:
            if names_the_policy(err.status, err.body, name):
                return None
            unserved = (f" (not a NotFound naming the policy: is {GROUP}/{version} served?)"
                        if err.status == 404 else "")
            raise Refused("UNAVAILABLE", f"reading CheckpointPolicy {namespace}/{name} from "
                          f"the apiserver: HTTP {err.status} {err.reason}{unserved}") from err
        except (OSError, HTTPError) as err:  # no connection, a timeout
            raise Refused("UNAVAILABLE", f"reading CheckpointPolicy {namespace}/{name} from "
                          f"the apiserver: {err}") from err
        return PolicyFound(str(policy["metadata"]["uid"]), class_named(policy.get("spec")))

    return resolve


def apiserver_classes(api: Any) -> ClassLister:
    """A lister of every CheckpointClass over `api` (one LIST a call)."""

    def classes() -> dict[str, Mapping[str, Any]]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            found = api.list_cluster_custom_object(GROUP, CLASS_VERSION, CLASSES,
                                                   _request_timeout=10)
        except ApiException as err:
            raise Refused("UNAVAILABLE", f"listing CheckpointClasses from the apiserver: "
                          f"HTTP {err.status} {err.reason}") from err
        except (OSError, HTTPError) as err:
            raise Refused("UNAVAILABLE", f"listing CheckpointClasses from the apiserver: "
                          f"{err}") from err
        return {str(item["metadata"]["name"]): item.get("spec") or {}
                for item in found.get("items") or []}

    return classes
