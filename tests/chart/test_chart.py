"""The Helm chart: lint, strict schema conformance of what it renders and of
the documented examples, and a real install into a real kube-apiserver (its
values schema and what each value renders: test_chart_values.py). Needs
helm, kubeconform and the API server built by `make servers`; missing tools
fail with that hint, never skip."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from tests.chart.openapi_schemas import SCHEMA_LOCATION
from tests.chart.support import (
    CHART,
    CLOUD_VALUES,
    CRDS,
    EXAMPLES,
    Tools,
    adopt_crds,
    documents,
    render,
)
from tests.support.apiserver import Cluster
from tests.support.conversion_server import POLICY_CRD, converting_crds

pytestmark = pytest.mark.cluster

MANIFESTS = sorted(p for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("values-"))

# Value sets that switch templates on and off; each must lint and conform.
VARIANTS: dict[str, list[str]] = {
    "defaults": [],
    "agent-namespaces": ["--set", "agent.namespaces={ml-a,ml-b}",
                         "--set", "bandwidth.clusterCap=40GB/s"],
    "no-rbac-no-sa": ["--set", "rbac.create=false", "--set", "serviceAccount.create=false",
                      "--set", "serviceAccount.name=existing", "--set",
                      "agent.serviceAccount.create=false"],
    "watch-one-namespace": ["--set", "operator.watchNamespace=ml-a"],
    "one-replica-ignore-system-priority": [
        "--set", "operator.replicas=1", "--set", "webhook.podFailurePolicy=Ignore",
        "--set", "operator.priorityClassName=system-cluster-critical"],
    "cert-manager+servicemonitor": ["--set", "certManager.enabled=true",
                                    "--set", "metrics.serviceMonitor.enabled=true"],
    "monitoring": ["--set", "metrics.podMonitor.enabled=true",
                   "--set", "metrics.prometheusRule.enabled=true",
                   "--set", "metrics.dashboard.annotations.grafana_folder=ML"],
    "csi-node-tier": ["--set", "nodeTier.mode=csi"],
    "hostpath-node-tier": ["--set", "nodeTier.mode=hostPath"],
    "webhook-locked-down": ["--set", "webhook.networkPolicy.enabled=true",
                            "--set", "webhook.networkPolicy.from[0].ipBlock.cidr=10.0.0.0/28",
                            "--set", "webhook.clientCA.configMap=apiserver-client-ca"],
    "csi-node-tier+monitoring": ["--set", "nodeTier.mode=csi",
                                 "--set", "metrics.podMonitor.enabled=true",
                                 "--set", "metrics.prometheusRule.enabled=true"],
    **{p.stem: ["-f", str(p)] for p in CLOUD_VALUES},
}
# Kinds of other projects' CRDs, which the test API server does not serve.
# Skipped by name, never with -ignore-missing-schemas, so that a kind of ours
# or a core kind without a schema still fails.
FOREIGN_KINDS = "Issuer,Certificate,ServiceMonitor,PodMonitor,PrometheusRule"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_lint(tools: Tools, variant: str) -> None:
    result = tools.run("helm", "lint", "--strict", str(CHART), *VARIANTS[variant])
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_manifests_conform_strictly(tools: Tools, schema_dir: Path,
                                             variant: str) -> None:
    manifests = render(tools, "--include-crds", *VARIANTS[variant]).stdout
    result = tools.run("kubeconform", "-strict", "-summary", "-output", "json",
                       "-schema-location", str(schema_dir / SCHEMA_LOCATION),
                       "-skip", FOREIGN_KINDS, "-", input=manifests, check=False)
    report = json.loads(result.stdout)
    problems = [r for r in report["resources"] if r["status"] != "statusValid"
                and r["status"] != "statusSkipped"]
    assert result.returncode == 0 and not problems, json.dumps(report, indent=2)
    # Every object was checked against a schema, none passed unseen.
    foreign = sum(1 for d in documents(manifests) if d["kind"] in FOREIGN_KINDS.split(","))
    assert report["summary"]["valid"] == len(documents(manifests)) - foreign, report["summary"]


def test_conformance_check_catches_a_misplaced_field(tools: Tools, schema_dir: Path) -> None:
    """The strict schemas refuse what a real API server would drop: a field
    at the wrong indentation (here `imagePullPolicy` one level too high)."""
    manifests = documents(render(tools).stdout)
    deployment = next(d for d in manifests if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["imagePullPolicy"] = "Always"
    result = tools.run("kubeconform", "-strict", "-schema-location",
                       str(schema_dir / SCHEMA_LOCATION), "-", input=yaml.safe_dump(deployment),
                       check=False)
    assert result.returncode != 0 and "imagePullPolicy" in result.stdout, result.stdout


def test_examples_conform_and_are_accepted(tools: Tools, cluster: Cluster,
                                           schema_dir: Path) -> None:
    """The example policies and workloads validate strictly against the CRD
    and core schemas, and a real API server accepts them (CEL rules
    included) in a server-side dry run: v1beta1 policies converted to the
    stored v1alpha1 through the operator's /convert, as on a cluster."""
    assert any("policy" in p.name for p in MANIFESTS), f"no example policies in {EXAMPLES}"
    for manifest in MANIFESTS:
        result = tools.run("kubeconform", "-strict", "-summary",
                           "-schema-location", str(schema_dir / SCHEMA_LOCATION),
                           str(manifest), check=False)
        assert result.returncode == 0, f"{manifest.name}: {result.stdout}{result.stderr}"
    namespaces = {d["metadata"]["namespace"] for m in MANIFESTS for d in documents(m.read_text())}
    for ns in sorted(namespaces):
        cluster.kubectl("create", "namespace", ns)
    try:
        with converting_crds(cluster, [CRDS / POLICY_CRD]):
            for manifest in MANIFESTS:
                applied = cluster.kubectl("apply", "--dry-run=server", "-f", str(manifest),
                                          check=False)
                assert applied.returncode == 0, f"{manifest.name}: {applied.stderr}"
    finally:
        for ns in sorted(namespaces):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# Each example policy goes with the values of the cluster it is written for.
POLICY_VALUES = {"policy-eks-s3.yaml": "values-eks.yaml",
                 "policy-gke-gcs.yaml": "values-gke.yaml",
                 "policy-onprem-minio.yaml": "values-onprem.yaml"}


@pytest.mark.parametrize("policy_file", sorted(POLICY_VALUES))
def test_example_policy_passes_the_operators_checks(tools: Tools, policy_file: str) -> None:
    """The operator configured by the chart (its env on the Deployment, read
    by ckptdrain.operator.config) accepts the example policy: the env names
    match and the allowed root in the values covers the policy's path."""
    from ckptdrain.contract import policy_versions
    from ckptdrain.operator import config
    from ckptdrain.operator.policy import spec as policy

    values = EXAMPLES / POLICY_VALUES[policy_file]
    deployment = next(d for d in documents(render(tools, "-f", str(values)).stdout)
                      if d["kind"] == "Deployment")
    env = {e["name"]: e["value"] for e in
           deployment["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    # The certificate files exist only inside the pod.
    env = {k: v for k, v in env.items() if not k.startswith("CKPTDRAIN_WEBHOOK_")}
    cfg = config.from_env(env)
    assert cfg.allowed_root == yaml.safe_load(values.read_text())["localTier"]["allowedRoot"]
    # Written at v1beta1; the operator reads what etcd stores, v1alpha1.
    written = yaml.safe_load((EXAMPLES / policy_file).read_text())
    spec = policy_versions.convert(written, "ckptdrain.io/v1alpha1")["spec"]
    assert policy.validate(spec, cfg) == []


def test_install_into_real_apiserver(tools: Tools, cluster: Cluster) -> None:
    """Every rendered object is accepted by a real API server, both webhook
    configurations point at the operator's webhook Service with the CA that
    signed its certificate, and an upgrade keeps that CA."""
    env = cluster.env()
    version = json.loads(cluster.kubectl("get", "--raw", "/version").stdout)["gitVersion"]
    assert not version.startswith("v0.0.0"), (
        f"the test kube-apiserver reports version {version}: Helm then refuses the chart's "
        "kubeVersion constraint. e2e/cluster/build-k8s.sh must stamp the version with "
        "-ldflags '-X k8s.io/component-base/version.gitVersion=<v1.X.Y> "
        "-X k8s.io/component-base/version.gitMajor=1 "
        "-X k8s.io/component-base/version.gitMinor=<X>'")
    chart, namespace = CHART, "ckptdrain-system"
    for ns in ("ml-a", "ml-b", namespace):
        cluster.kubectl("create", "namespace", ns)
    # The default mode's CSI driver is privileged, so the release namespace
    # enforces "privileged" (docs/install.md); it warns at "restricted", so
    # that anything else of the release that would not pass it shows.
    cluster.kubectl("label", "namespace", namespace,
                    "pod-security.kubernetes.io/enforce=privileged",
                    "pod-security.kubernetes.io/warn=restricted")
    helm_args = ["--namespace", namespace, "--set", "agent.namespaces={ml-a,ml-b}",
                 "--set", "bandwidth.clusterCap=40GB/s", "--set", "bandwidth.weights.ml-a=3"]
    # The fixture applied the CRDs by hand: adopt them, as docs/install.md
    # tells an existing installation to do before its first upgrade.
    adopt_crds(cluster, "ckptdrain", namespace)
    installed = tools.run("helm", "install", "ckptdrain", str(chart), *helm_args, env=env)
    # The driver is the one privileged piece: the operator runs at "restricted".
    warned = [line for line in installed.stderr.splitlines() if "PodSecurity" in line]
    named = {name for line in warned
             for name in re.findall(r'container \\?"([^"\\]+)\\?"', line)}
    assert len(warned) == 1 and named == {"csi-node"}, installed.stderr
    assert 'ckptdrain.io/inject: "true"' in installed.stdout  # NOTES tell what to do next
    # ... and what to delete before the operator (its conversion webhook).
    assert "kubectl delete checkpointpolicies.v1alpha1.ckptdrain.io --all -A" in installed.stdout
    try:
        manifest = tools.run("helm", "get", "manifest", "ckptdrain", "-n", namespace,
                             env=env).stdout
        objects = documents(manifest)
        kinds = {o["kind"] for o in objects}
        assert {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                "RoleBinding", "Secret", "MutatingWebhookConfiguration",
                "ValidatingWebhookConfiguration", "ClusterKopfPeering",
                "PodDisruptionBudget", "PriorityClass", "Role", "CustomResourceDefinition",
                # restrictPodPatches: true by default
                "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                # nodeTier.mode: csi by default
                "CSIDriver", "DaemonSet"} <= kinds
        for o in objects:  # each one is really there, as sent
            ns = o["metadata"].get("namespace")
            where = ["-n", ns] if ns else []
            cluster.kubectl("get", o["kind"], o["metadata"]["name"], *where)

        service = next(o for o in objects if o["kind"] == "Service"
                       and o["spec"]["ports"][0]["name"] == "https-webhook")

        def webhooks() -> list[dict]:
            found = []
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
                config = json.loads(cluster.kubectl("get", kind, "ckptdrain", "-o",
                                                    "json").stdout)
                found.extend(config["webhooks"])
            return found

        # Nothing certificate-related is rendered: the operator makes the CA
        # and the caBundle at its first start (test_chart_lifecycle.py).
        for hook in webhooks():
            ref = hook["clientConfig"]["service"]
            assert (ref["name"], ref["namespace"], ref.get("port")) == (
                service["metadata"]["name"], namespace, 443), hook["name"]
            assert "caBundle" not in hook["clientConfig"], hook["name"]
        pods_hook = next(h for h in webhooks() if h["name"] == "pods.mutate.ckptdrain.io")
        assert pods_hook["failurePolicy"] == "Fail"
        assert pods_hook["objectSelector"] == {"matchLabels": {"ckptdrain.io/inject": "true"}}
        excluded = pods_hook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert namespace in excluded and "kube-system" in excluded

        # The agent's identity exists where training pods run.
        for ns in ("ml-a", "ml-b"):
            cluster.kubectl("get", "serviceaccount", "ckptdrain-agent", "-n", ns)
            cluster.kubectl("get", "rolebinding", "ckptdrain-agent", "-n", ns)
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        env_vars = {e["name"]: e.get("value") for e in
                    deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env_vars["CKPTDRAIN_CLUSTER_BANDWIDTH"] == "40GB/s"
        assert env_vars["CKPTDRAIN_BANDWIDTH_WEIGHTS"] == "ml-a=3"
        assert env_vars["CKPTDRAIN_ALLOWED_ROOT"] == "/mnt/ckptdrain"

        # Least privilege, as the API server's authorizer sees it.
        operator = f"system:serviceaccount:{namespace}:ckptdrain"
        agent = "system:serviceaccount:ml-a:ckptdrain-agent"
        for who, verb, what, ns, allowed in [
            (operator, "patch", "checkpointpolicies.ckptdrain.io/status", "ml-a", True),
            (operator, "update", "checkpointpolicies.ckptdrain.io", "ml-a", False),
            (operator, "delete", "checkpoints.ckptdrain.io", "ml-a", True),
            (operator, "patch", "pods", "ml-a", False),
            (operator, "list", "pods", "ml-a", True),
            (operator, "patch", "checkpointshares.ckptdrain.io", "ml-a", True),
            (operator, "list", "checkpointshares.ckptdrain.io", "ml-a", False),
            (agent, "watch", "checkpointshares.ckptdrain.io", "ml-a", True),
            (agent, "patch", "checkpointshares.ckptdrain.io", "ml-a", False),
            (agent, "watch", "checkpointshares.ckptdrain.io", "ml-b", False),
            (operator, "create", "pods", "ml-a", False),
            (operator, "get", "secrets", namespace, False),
            (operator, "get", "secrets", "ml-a", False),
            (operator, "create", "secrets", namespace, False),
            # The operator alone makes and writes records; agents write
            # their progress on their own pods and touch no record.
            (operator, "create", "checkpoints.ckptdrain.io", "ml-a", True),
            (operator, "patch", "checkpoints.ckptdrain.io/status", "ml-a", True),
            (agent, "create", "checkpoints.ckptdrain.io", "ml-a", False),
            (agent, "patch", "checkpoints.ckptdrain.io/status", "ml-a", False),
            (agent, "patch", "checkpoints.ckptdrain.io", "ml-a", False),
            (agent, "patch", "pods", "ml-a", True),
            (agent, "get", "secrets", "ml-a", False),
            (agent, "delete", "pods", "ml-a", False),
        ]:
            resource, _, sub = what.partition("/")
            answer = cluster.kubectl("auth", "can-i", verb, resource, f"--subresource={sub}",
                                     "-n", ns, "--as", who, check=False).stdout.strip()
            assert answer == ("yes" if allowed else "no"), (who, verb, what, ns, answer)

        # The one Secret it keeps its certificate in, and nothing more.
        for verb, name, allowed in [("get", "ckptdrain-webhook-cert", True),
                                    ("update", "ckptdrain-webhook-cert", True),
                                    ("get", "other", False), ("delete",
                                                              "ckptdrain-webhook-cert", False)]:
            answer = cluster.kubectl("auth", "can-i", verb, f"secrets/{name}", "-n", namespace,
                                     "--as", operator, check=False).stdout.strip()
            assert answer == ("yes" if allowed else "no"), (verb, name, answer)
    finally:
        tools.run("helm", "uninstall", "ckptdrain", "-n", namespace, env=env, check=False)
    # CRDs stay: deleting them would delete every policy and checkpoint record.
    cluster.kubectl("get", "crd", "checkpointpolicies.ckptdrain.io")


def _operator_rules(text: str) -> list[dict]:
    """Every rule granted to the operator's roles (not the agent's)."""
    return [rule for o in documents(text) if o["kind"] in ("Role", "ClusterRole")
            and "agent" not in o["metadata"]["name"] for rule in o.get("rules") or []]


def _grants(rules: list[dict], resource: str) -> set[str]:
    return {verb for r in rules if "" in r.get("apiGroups", []) and resource in r["resources"]
            and not r.get("resourceNames") for verb in r["verbs"]}


@pytest.mark.parametrize("watch", [[], ["--set", "operator.watchNamespace=ml-a"]])
def test_the_peer_tier_rules_are_exactly_what_it_needs(tools: Tools, watch: list[str]) -> None:
    text = render(tools, *watch, "--set", "operator.peerTier=true").stdout
    ca_roles = [o for o in documents(text) if o["kind"] == "Role"
                and o["metadata"]["name"].endswith("-peer-ca")]
    rules = [r for r in _operator_rules(text)
             if not any(r in o["rules"] for o in ca_roles)]
    # Create and replace whole, never read: the operator can read no
    # workload's Secret (a PUT answers with what it wrote).
    assert _grants(rules, "secrets") == {"create", "update"}
    # The policies' CAs, in a namespace of their own (the chart makes it) only.
    assert len(ca_roles) == 1 and ca_roles[0]["metadata"]["namespace"] == "ckptdrain-peer-ca"
    assert _grants(ca_roles[0]["rules"], "secrets") == {"get", "list", "create", "update",
                                                        "delete"}
    env = {e["name"]: e.get("value") for o in documents(text) if o["kind"] == "Deployment"
           for e in o["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CKPTDRAIN_PEER_CA_NAMESPACE"] == "ckptdrain-peer-ca"
    namespaces = [o for o in documents(text) if o["kind"] == "Namespace"]
    assert [n["metadata"]["name"] for n in namespaces] == ["ckptdrain-peer-ca"]
    assert namespaces[0]["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # A namespace of the user's: used as it is, not made.
    own = render(tools, *watch, "--set", "operator.peerTier=true",
                 "--set", "operator.peerCANamespace=keys").stdout
    assert not [o for o in documents(own) if o["kind"] == "Namespace"]
    assert [o["metadata"]["namespace"] for o in documents(own) if o["kind"] == "Role"
            and o["metadata"]["name"].endswith("-peer-ca")] == ["keys"]
    assert _grants(rules, "configmaps") == {"get", "create", "patch"}
    assert _grants(rules, "nodes") == {"get"}
    off = _operator_rules(render(tools, *watch).stdout)  # off by default
    assert _grants(off, "secrets") == _grants(off, "configmaps") == _grants(off, "nodes") \
        == set()
