"""Fixtures for the CheckpointPolicy CRD's conversion webhook through a real
apiserver: test_conversion_through_apiserver.py (what the apiserver converts)
and test_conversion_ca_keeper.py (the operator keeping the CRD's caBundle).

The CRD is crds/checkpointpolicies.yaml as shipped (v1alpha1 served,
v1beta1 stored). Its conversion clientConfig points at the admission
process (admission/process.py, the process each operator replica runs) by
URL (no Service here). Each module gets its own apiserver: these tests
change the CRD and stop the webhook, which would break other modules'
reads of the session's cluster."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import policy_crd_source
from conversion_objects import BETA, resource
from operator_process import repo_root

from support import apiserver
from support.apiserver import Cluster, free_port
from support.conversion_server import ConversionServer, converting_to


def policy_crd(url: str, ca_pem: bytes) -> dict[str, Any]:
    """crds/checkpointpolicies.yaml, converting through `url`."""
    return converting_to(policy_crd_source(), url, ca_pem)


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    apiserver.binaries_or_fail()
    with apiserver.running(tmp_path_factory.mktemp("conversion-apiserver")) as running:
        yield running


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("conversion-certs")
    ca = apiserver.make_ca(directory, "webhook-ca")
    cert, key = apiserver.make_cert(directory, "webhook", ca)
    other = apiserver.make_ca(directory, "other-ca")
    return {"ca": ca[0], "cert": cert, "key": key, "other_ca": other[0]}


@pytest.fixture(scope="module")
def server(own_cluster: Cluster, certificates: dict[str, Path]) -> Iterator[ConversionServer]:
    port = free_port()
    crd = policy_crd(f"https://127.0.0.1:{port}/convert", certificates["ca"].read_bytes())
    own_cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(crd))
    own_cluster.kubectl("apply", "--server-side", "-f",
                        str(repo_root() / "crds" / "checkpoints.yaml"))
    own_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    running = ConversionServer(own_cluster, certificates["cert"], certificates["key"], port)
    running.start()
    yield running
    running.stop()


@pytest.fixture
def namespace(own_cluster: Cluster, server: ConversionServer) -> Iterator[str]:
    name = f"conv-{time.monotonic_ns() % 10**8}"
    own_cluster.kubectl("create", "namespace", name)
    yield name
    # v1beta1 named: a cleanup never depends on the webhook.
    own_cluster.kubectl("delete", "-n", name, resource(BETA), "--all", "--wait=false",
                        check=False)
    own_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
