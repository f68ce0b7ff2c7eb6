"""The CSI driver's policy lookup against a real apiserver, as the driver's
own ServiceAccount with the rules of the ClusterRole docs/csi-driver.md
shows (`get` on checkpointpolicies, nothing else): the namespace is the
pod's, the name the tenant's, the answer the policy's UID."""

from __future__ import annotations

import json
import uuid

import pytest
from cluster_helpers import POLICIES, create, csi_driver_rules, get, policy
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ckptdrain.csi.policies import (
    GROUP,
    PLURAL,
    VERSION,
    apiserver_classes,
    apiserver_resolver,
    names_the_policy,
)
from ckptdrain.csi.requests import Refused
from ckptdrain.csi.volumes import PolicyFound
from support.apiserver import Cluster

# What the driver's ClusterRole grants, as the page documents it.
DRIVER_RULES = csi_driver_rules()

def make_policy(cluster: Cluster, namespace: str, name: str) -> str:
    made = create(cluster, namespace, policy(name))
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["metadata"]["uid"])


def test_the_lookup_gives_the_uid_of_the_pods_namespace_policy_only(
        cluster: Cluster, namespace: str, driver_api: client.CustomObjectsApi) -> None:
    # get on policies, list on classes (reclaim per class), and nothing more.
    assert [(rule["resources"], rule["verbs"]) for rule in DRIVER_RULES] == [
        (["checkpointpolicies"], ["get"]), (["checkpointclasses"], ["list"])]
    resolve = apiserver_resolver(driver_api)
    uid = make_policy(cluster, namespace, "ckpt")
    assert resolve(namespace, "ckpt") == PolicyFound(uid, None)
    assert isinstance(apiserver_classes(driver_api)(), dict)  # the list is allowed
    # The same name asked for from another namespace: not found there.
    other = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", other)
    try:
        assert resolve(other, "ckpt") is None
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
    assert resolve(namespace, "absent") is None
    # Deleted and created again under the same name: a new UID, so new node data.
    cluster.kubectl("delete", "-n", namespace, POLICIES, "ckpt")
    again = make_policy(cluster, namespace, "ckpt")
    assert again != uid
    assert resolve(namespace, "ckpt") == PolicyFound(again, None)
    assert again == get(cluster, namespace, POLICIES, "ckpt")["metadata"]["uid"]


def test_without_rbac_or_apiserver_the_pod_waits(cluster: Cluster, crds: None,
                                                 namespace: str) -> None:
    make_policy(cluster, namespace, "ckpt")
    # A ServiceAccount the driver's role is not bound to: forbidden, not "absent".
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    api = client.CustomObjectsApi(config.new_client_from_config(
        str(cluster.kubeconfig_for(namespace, "nobody"))))
    with pytest.raises(Refused) as refused:
        apiserver_resolver(api)(namespace, "ckpt")
    assert refused.value.code == "UNAVAILABLE" and "HTTP 403" in refused.value.message
    unreachable = client.Configuration()
    unreachable.host = "https://127.0.0.1:1"
    unreachable.retries = 0
    with pytest.raises(Refused) as refused:
        apiserver_resolver(client.CustomObjectsApi(client.ApiClient(unreachable)))(
            namespace, "ckpt")
    assert refused.value.code == "UNAVAILABLE"


def test_only_a_not_found_naming_the_policy_reads_as_absent(
        cluster: Cluster, namespace: str, driver_api: client.CustomObjectsApi) -> None:
    # What the apiserver sends for a policy that is not there: the fields
    # the resolver trusts, exactly.
    with pytest.raises(ApiException) as absent:
        driver_api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "absent")
    body = json.loads(absent.value.body)
    assert (absent.value.status, body["kind"], body["reason"], body["details"]) == \
        (404, "Status", "NotFound", {"name": "absent", "group": GROUP, "kind": PLURAL})
    assert names_the_policy(404, absent.value.body, "absent")
    assert not names_the_policy(404, absent.value.body, "ckpt")  # it names another
    # A version the CRD does not serve (a CRD upgrade that stopped serving
    # the driver's version; v1beta9 is no version of ours): a 404 for every
    # policy, present or not, that is no NotFound Status. The driver cannot tell.
    make_policy(cluster, namespace, "ckpt")
    with pytest.raises(ApiException) as unserved:
        driver_api.get_namespaced_custom_object(GROUP, "v1beta9", namespace, PLURAL, "ckpt")
    assert unserved.value.status == 404
    assert not names_the_policy(404, unserved.value.body, "ckpt")
    for name in ("ckpt", "absent"):
        with pytest.raises(Refused) as refused:
            apiserver_resolver(driver_api, version="v1beta9")(namespace, name)
        assert refused.value.code == "UNAVAILABLE", name
        assert "HTTP 404" in refused.value.message and "v1beta9 served?" in refused.value.message
    assert apiserver_resolver(driver_api)(namespace, "ckpt") is not None
