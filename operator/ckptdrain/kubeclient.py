"""The one Kubernetes client set-up, shared by the operator and the node side.

It stands beside the pure core rather than in it: it is the only top-level
module that touches the `kubernetes` package, and it imports it only when
called, so importing it (or anything in the core) never loads the SDK.
"""

from __future__ import annotations

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


def watch_stream(list_call: Any, *args: Any, **kwargs: Any) -> Any:
    """(events, stop): a watch on what `list_call(*args)` lists, each event a
    dict with `type` and the raw `object`; `stop()` ends it."""
    from kubernetes import watch

    stream = watch.Watch()
    return stream.stream(list_call, *args, **kwargs), stream.stop
