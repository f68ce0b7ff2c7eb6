"""The one Kubernetes client set-up, shared by the operator and the node side.

It stands beside the pure core rather than in it: it is the only top-level
module that touches the `kubernetes` package, and it imports it only when
called, so importing it (or anything in the core) never loads the SDK.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any


def api_client(pool_size: int | None = None, retries: Any = None) -> Any:
    """A `kubernetes.client.ApiClient`: in-cluster credentials when running in a
    pod, else the kubeconfig. `pool_size` bounds concurrent connections;
    `retries` (a urllib3 Retry) replaces urllib3's default of three, each
    with the whole timeout again."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    if retries is not None:
        configuration.retries = retries
    return client.ApiClient(configuration)


def core_api() -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client())


def custom_objects_api() -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api_client())


def node_core_api() -> Any:
    """CoreV1Api for the node side's calls: the SDK-free client in a pod
    (kube_rest.py: restore pays no SDK start-up), else the SDK's."""
    from ckptdrain import kube_rest

    found = kube_rest.InCluster.from_env()
    return kube_rest.CoreV1(found) if found is not None else core_api()


def node_custom_objects_api() -> Any:
    """CustomObjectsApi for the node side's calls, as `node_core_api`."""
    from ckptdrain import kube_rest

    found = kube_rest.InCluster.from_env()
    return kube_rest.CustomObjects(found) if found is not None else custom_objects_api()


def watch_stream(list_call: Any, *args: Any, **kwargs: Any) -> Any:
    """(events, stop): a watch on what `list_call(*args)` lists, each event a
    dict with `type` and the raw `object`; `stop()` ends it."""
    from kubernetes import watch

    stream = watch.Watch()
    return stream.stream(list_call, *args, **kwargs), stream.stop


def check_reachable(timeout: float = 5.0) -> None:
    """Raise CkptdrainError, one line, unless a cluster is configured (in a
    pod, or a kubeconfig) and its API server answers `/version` within
    `timeout` seconds: a long-running controller started without either would
    otherwise fail later, in a loop of tracebacks."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from ckptdrain.errors import CkptdrainError

    named = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    missing = [p for p in named if not os.path.isfile(p)]
    if missing and len(missing) == len(named) and "KUBERNETES_SERVICE_HOST" not in os.environ:
        raise CkptdrainError(f"kubeconfig {', '.join(missing)} does not exist")
    try:
        base = api_client(retries=0)
    except (ConfigException, OSError, TypeError, ValueError, yaml.YAMLError) as err:
        # A kubeconfig that is not YAML, or YAML of the wrong shape, is no config.
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CkptdrainError(f"no Kubernetes cluster configured: not in a pod, and no usable "
                             f"kubeconfig ({first}); pass --kubeconfig or set KUBECONFIG") from None
    host = base.configuration.host
    try:
        client.VersionApi(base).get_code(_request_timeout=timeout)
    except ApiException as err:
        if err.status not in (401, 403):  # an answer: reachable, the credentials are Kopf's
            raise CkptdrainError(f"the API server at {host} answered {err.status} "
                                 f"{err.reason}") from None
    except (HTTPError, OSError) as err:
        said = re.search(r"\[Errno -?[0-9]+\] ([^'\")]+)", str(err))
        why = said[1] if said else f"no answer within {timeout:g}s"
        raise CkptdrainError(f"cannot reach the API server at {host}: {why}") from None


def api_status(error: BaseException) -> int | None:
    """The HTTP status of the apiserver's answer `error` carries; None when it
    is no answer at all (a refused or timed-out connection)."""
    from ckptdrain.kube_rest import ApiError

    if isinstance(error, ApiError):
        return error.status
    # Only an SDK already loaded can have raised its exception: asking must not
    # load it (restore's SDK-free path, kube_rest.py).
    exceptions = sys.modules.get("kubernetes.client.exceptions")
    if exceptions is not None and isinstance(error, exceptions.ApiException):
        return int(error.status)
    return None
