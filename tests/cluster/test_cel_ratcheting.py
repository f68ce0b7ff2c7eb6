"""The CheckpointPolicy CRD's rules against policies stored before them (or
while the webhook was down), on a real apiserver: such a policy keeps taking
every write that leaves the judged field alone (a label, its status, a spec
edit elsewhere, its finalizer's removal, so it can be deleted), and the rule
holds again for a write that changes that field. Each test stores its
violators under the CRD without its rules, then serves the CRD again."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from cluster_helpers import POLICIES, policy
from operator_process import WEBHOOK_NAME, OperatorProcess, repo_root

from support.apiserver import Cluster
from support.conversion_server import ConversionServer

CRD = repo_root() / "crds" / "checkpointpolicies.yaml"
FINALIZER = "example.com/hold"
RESERVED = "cluster-scale.ckptdrain.io"
LONG_NAME = "a" * 64


def _without_rules(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_rules(v) for k, v in node.items()
                if k != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [_without_rules(v) for v in node]
    return node


def _dry_run(cluster: Cluster, body: dict[str, Any]) -> Any:
    """A create, in a namespace where no test stores a policy (so the name is
    free and only validation can refuse it)."""
    return cluster.kubectl("create", "--dry-run=server", "-n", "default", "-f", "-",
                           input=json.dumps(body), check=False)


def _until(served: Any, what: str) -> None:
    """A CRD change is served a moment after it is stored: wait for it."""
    deadline = time.monotonic() + 30
    while not served():
        assert time.monotonic() < deadline, f"the apiserver never served {what}"
        time.sleep(0.2)


def _violator(name: str, **spec: Any) -> dict[str, Any]:
    body = policy("ratchet", **spec)
    body["metadata"]["name"] = name
    body["metadata"]["finalizers"] = [FINALIZER]
    return body


@pytest.fixture
def stored(cluster: Cluster, session_conversion: ConversionServer, operator: OperatorProcess,
           namespace: str) -> Iterator[Any]:
    """Stores the given bodies under the rule-free CRD; the CRD with its rules
    is served again (and a fresh `probe` refused) when the test body runs.
    No webhook judges anything meanwhile: the session operator is stopped and
    its webhook configurations (which outlive it and fail closed) deleted, as
    an outage of admission would; its restart registers them again."""
    operator.stop()
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        cluster.kubectl("delete", kind, WEBHOOK_NAME, "--ignore-not-found")
    def store(probe: dict[str, Any], *bodies: dict[str, Any]) -> None:
        # Converting as the session's CRD does (v1alpha1 writes need it).
        shipped = session_conversion.converting(yaml.safe_load(CRD.read_text()))
        ruleless = _without_rules(shipped)
        try:
            cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                            input=json.dumps(ruleless))
            _until(lambda: _dry_run(cluster, probe).returncode == 0,
                   "the CRD without its rules")
            for body in bodies:
                made = cluster.kubectl("create", "-n", namespace, "-f", "-",
                                       input=json.dumps(body), check=False)
                assert made.returncode == 0, made.stderr
        finally:
            cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                            input=json.dumps(shipped))
        _until(lambda: _dry_run(cluster, probe).returncode != 0,
               "the CRD with its rules")
    try:
        yield store
    finally:
        # kubectl patch takes no --all: release each one by name.
        # By bare name at v1alpha1 (`-o name` drops the version).
        left = cluster.kubectl("get", "-n", namespace, POLICIES, "-o",
                               "jsonpath={.items[*].metadata.name}", check=False)
        for name in left.stdout.split():
            cluster.kubectl("patch", "-n", namespace, POLICIES, name, "--type=json", "-p",
                            '[{"op": "remove", "path": "/metadata/finalizers"}]',
                            check=False)
        operator.start()


def _write(cluster: Cluster, namespace: str, name: str, *args: str) -> Any:
    return cluster.kubectl(*args[:1], "-n", namespace, POLICIES, name, *args[1:],
                           check=False)


def _takes_every_write(cluster: Cluster, namespace: str, name: str) -> None:
    writes = {
        "a label": ("label", "team=a"),
        "an annotation": ("annotate", "example.com/note=x"),
        "its status": ("patch", "--subresource=status", "--type=merge",
                       "-p", '{"status": {"phase": "Invalid"}}'),
        "another spec field": ("patch", "--type=merge", "-p", '{"spec": {"interval": "20m"}}'),
    }
    for what, args in writes.items():
        done = _write(cluster, namespace, name, *args)
        assert done.returncode == 0, f"{name}, {what}: {done.stderr}"


def _can_be_deleted(cluster: Cluster, namespace: str, name: str) -> None:
    cluster.kubectl("delete", "-n", namespace, POLICIES, name, "--wait=false")
    released = _write(cluster, namespace, name, "patch", "--type=json",
                      "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')
    assert released.returncode == 0, f"{name}: {released.stderr}"
    gone = _write(cluster, namespace, name, "get", "--ignore-not-found", "-o", "name")
    assert gone.stdout.strip() == "", f"{name} is still there"


def test_a_policy_stored_with_a_refused_name_takes_every_write(
        cluster: Cluster, namespace: str, stored: Any) -> None:
    """The root rules judge metadata.name, which no write changes: they judge
    a create (and the peer tier being turned on), never a stored policy."""
    reserved = _violator(RESERVED)
    long_peer = _violator(LONG_NAME, peerTier={"enabled": True})
    long_plain = _violator("b" * 64)
    stored(_violator(RESERVED), reserved, long_peer, long_plain)

    for name in (RESERVED, LONG_NAME):
        _takes_every_write(cluster, namespace, name)
    # The rules still hold where a write could break them.
    again = _dry_run(cluster, _violator("c" * 64, peerTier={"enabled": True}))
    assert again.returncode != 0 and "at most 63 characters" in again.stderr, again.stderr
    fresh = _dry_run(cluster, _violator(RESERVED))
    assert fresh.returncode != 0 and "cluster scale channel" in fresh.stderr, fresh.stderr
    turned_on = _write(cluster, namespace, "b" * 64, "patch", "--type=merge",
                       "-p", '{"spec": {"peerTier": {"enabled": true}}}')
    assert turned_on.returncode != 0 and "at most 63 characters" in turned_on.stderr, \
        turned_on.stderr
    for name in (RESERVED, LONG_NAME):
        _can_be_deleted(cluster, namespace, name)


def test_a_stored_policy_stays_valid_while_its_field_is_unchanged(
        cluster: Cluster, namespace: str, stored: Any) -> None:
    """Ratcheting of a rule on an item: a policy stored before it takes every
    write that leaves the item alone; the rule holds again once the item
    changes."""
    bad = {"matchExpressions": [{"key": "team", "operator": "In", "values": []}]}
    stored_bad = _violator("stored", selector=bad)
    stored(_violator("probe", selector=bad), stored_bad)

    _takes_every_write(cluster, namespace, "stored")
    changed = _write(cluster, namespace, "stored", "patch", "--type=merge", "-p", json.dumps(
        {"spec": {"selector": {"matchExpressions": [
            {"key": "team", "operator": "NotIn", "values": []}]}}}))
    assert changed.returncode != 0 and "at least one value" in changed.stderr, changed.stderr
    _can_be_deleted(cluster, namespace, "stored")
