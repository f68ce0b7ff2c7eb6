"""Fixtures for the documentation tests: the operator's own policy checks
(imported here only, so that a move of the module is one line to fix), the
chart rendered with a page's helm arguments, and one real kube-apiserver
with our CRDs for server-side dry runs, converting CheckpointPolicies
through the operator's own /convert as an installed operator does."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import yaml
from tests.chart.support import CHART, CRDS, TOOLS
from tests.support import apiserver
from tests.support.conversion_server import converting_crds

# The one import of the operator's policy module in this suite.
from ckptdrain.contract import policy_versions
from ckptdrain.operator import config as operator_config
from ckptdrain.operator.admission import tenant_identity
from ckptdrain.operator.policy import classes as operator_classes
from ckptdrain.operator.policy import spec as operator_policy


def policy_problems(spec: Mapping[str, Any], cfg: operator_config.OperatorConfig,
                    name: str = "") -> list[str]:
    """What the operator's admission would say about `spec`: [] when valid."""
    return [str(e) for e in operator_policy.validate(spec, cfg, name)]


def stored(policy: Mapping[str, Any]) -> dict[str, Any]:
    """A CheckpointPolicy of either version as etcd stores it and the
    operator reads it (v1alpha1), made by the converter /convert runs."""
    return policy_versions.convert(dict(policy), "ckptdrain.io/v1alpha1")


def v1beta1_policy_problems(spec: Mapping[str, Any], cfg: operator_config.OperatorConfig,
                            name: str = "") -> list[str]:
    """What the operator would say about `spec` written at v1beta1: converted
    to the stored v1alpha1 by the converter /convert runs, then judged. A
    value in v1alpha1's spelling only (`405B`, `2TB`, `1d`) is a problem
    too: it does not read back as written at v1beta1."""
    written = {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointPolicy",
               "metadata": {"name": name or "example"}, "spec": dict(spec)}
    stored = policy_versions.to_v1alpha1(written)
    read_back = policy_versions.to_v1beta1(stored)["spec"]
    if read_back != written["spec"]:
        changed = sorted(k for k in {*read_back, *written["spec"]}
                         if read_back.get(k) != written["spec"].get(k))
        return [f"spec.{', spec.'.join(changed)}: expected v1beta1 spellings "
                f"(docs/api-versions.md), read back as {[read_back.get(k) for k in changed]}"]
    return policy_problems(stored["spec"], cfg, name)


def classed_policy_problems(namespace: str, spec: Mapping[str, Any],
                            class_bodies: list[dict[str, Any]],
                            cfg: operator_config.OperatorConfig,
                            name: str = "", labels: Mapping[str, str] | None = None,
                            ) -> tuple[str, dict[str, Any], list[str]]:
    """What the operator's admission would say about `spec`, created under
    the CheckpointClasses `class_bodies` in a namespace with `labels`: the
    class it gets ("" for none; the default one for the namespace where it
    names none), the spec with its class's store settings filled in, and
    the problems."""
    labels = dict(labels or {})
    catalogue = operator_classes.catalogue(class_bodies)
    default = operator_classes.default_choice(catalogue, labels).cls
    if default is not None and not spec.get("checkpointClassName"):
        spec = {**spec, "checkpointClassName": default.name}  # bound at creation
    resolution = operator_classes.resolve(namespace, spec, cfg, catalogue, lambda: labels)
    problems = [str(e) for e in resolution.problems]
    if not problems:
        problems = [str(e) for e in operator_policy.validate(resolution.spec,
                                                             resolution.config, name)]
    return resolution.class_name, dict(resolution.spec), problems


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    return operator_policy.selector_matches(selector, labels)


def class_identity(namespace: str, spec: Mapping[str, Any],
                   class_bodies: list[dict[str, Any]]) -> str | None:
    """The role restore and the agent of the policy's pods assume under
    its class (None: the pods' own identity)."""
    resolution = operator_classes.resolve(namespace, spec, default_config(),
                                          operator_classes.catalogue(class_bodies))
    parsed = operator_policy.parse(namespace, "example", resolution.spec, resolution.config)
    identity = tenant_identity.chosen(parsed, resolution.config.identities)
    return None if identity is None else identity.role_arn


def default_config() -> operator_config.OperatorConfig:
    """The operator's configuration under the chart's default values."""
    return operator_config.OperatorConfig()


def config_from_env(env: Mapping[str, str]) -> operator_config.OperatorConfig:
    return operator_config.from_env(env)


def helm() -> str:
    path = TOOLS / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(f"helm is missing ({path}). Build it once with `make servers` (it runs "
                    "e2e/deps/helm-tools.sh).", pytrace=False)
    return str(path)


def render(args: list[str], release: str = "ckptdrain") -> list[dict[str, Any]]:
    """`helm template` of the chart with a page's arguments (values files and
    --set), as `helm install` would render them; a refusal fails the test
    with helm's own message."""
    result = subprocess.run([helm(), "template", release, str(CHART), "--namespace",
                             "ckptdrain", *args], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        pytest.fail(f"helm template {' '.join(args)} failed:\n{result.stderr}", pytrace=False)
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.fixture(scope="module")
def cluster() -> Iterator[apiserver.Cluster]:
    """A real etcd + kube-apiserver with our CRDs applied and established. The
    examples are v1beta1 and v1alpha1 is stored: the apiserver converts each
    one through the admission process's /convert, as users' are."""
    apiserver.binaries_or_fail()
    with apiserver.running() as running, converting_crds(running, sorted(CRDS.glob("*.yaml"))):
        yield running
