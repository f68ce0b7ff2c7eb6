"""Locking down the webhook (docs/install.md): webhook.networkPolicy renders a
NetworkPolicy that opens the webhook port to the listed peers only and
keeps the metrics and health ports open, on the ports the operator pods
really expose; webhook.clientCA mounts the bundle where the operator's
CKPTDRAIN_WEBHOOK_CLIENT_CA points. Both off by default, both conform
strictly to a real apiserver's schemas, and mistakes are refused naming
the value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.chart.openapi_schemas import SCHEMA_LOCATION
from tests.chart.support import REPO, Tools, documents, render
from tests.docs import blocks

pytestmark = pytest.mark.cluster  # helm, kubeconform and the apiserver of `make servers`

INSTALL = REPO / "docs" / "install.md"
SECTION = "## Locking down the webhook"
CONTROL_PLANE = ["--set", "webhook.networkPolicy.enabled=true",
                 "--set", "webhook.networkPolicy.from[0].ipBlock.cidr=172.16.0.0/28",
                 "--set", "webhook.networkPolicy.from[1].namespaceSelector.matchLabels"
                          ".kubernetes\\.io/metadata\\.name=kube-system"]


def _section_values() -> list[str]:
    """The values fragments of the docs section, in order."""
    text = INSTALL.read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    first, last = text[:start].count("\n") + 1, text[:end].count("\n") + 1
    return [b.text for b in blocks.parse(INSTALL)
            if first <= b.line <= last and b.kind == "fragment" and b.note == "values"]


def _container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(d for d in manifests if d["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _policies(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in manifests if d["kind"] == "NetworkPolicy"]


def test_nothing_is_locked_down_by_default(tools: Tools) -> None:
    manifests = documents(render(tools).stdout)
    assert _policies(manifests) == []
    container = _container(manifests)
    assert "CKPTDRAIN_WEBHOOK_CLIENT_CA" not in {e["name"] for e in container["env"]}
    assert "webhook-client-ca" not in {m["name"] for m in container["volumeMounts"]}


def test_the_webhook_port_is_open_to_the_listed_peers_only(tools: Tools) -> None:
    manifests = documents(render(tools, *CONTROL_PLANE).stdout)
    (policy,) = _policies(manifests)
    deployment = next(d for d in manifests if d["kind"] == "Deployment")
    # It selects the operator pods, and nothing but ingress is restricted.
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    exposed = {p["name"] for p in _container(manifests)["ports"]}
    rules = policy["spec"]["ingress"]
    by_port = {port["port"]: rule for rule in rules for port in rule["ports"]}
    # Every port the pods expose is named in a rule (a port left out would
    # be closed by the policy), and no rule names a port they do not expose.
    assert set(by_port) == exposed == {"webhook", "metrics", "health"}
    assert by_port["webhook"]["from"] == [
        {"ipBlock": {"cidr": "172.16.0.0/28"}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]
    # Scraping and probes: open to every source, as without the policy.
    assert "from" not in by_port["metrics"] and "from" not in by_port["health"]
    # The apiserver reaches the webhook through the Service's target port.
    service = next(d for d in manifests if d["kind"] == "Service"
                   and d["metadata"]["name"].endswith("-webhook"))
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["webhook"]


def test_the_client_ca_is_mounted_where_the_operator_reads_it(tools: Tools) -> None:
    for source, args in (("secret", ["--set", "webhook.clientCA.secret=apiserver-ca",
                                     "--set", "webhook.clientCA.key=bundle.pem"]),
                         ("configMap", ["--set", "webhook.clientCA.configMap=apiserver-ca"])):
        manifests = documents(render(tools, *args).stdout)
        container = _container(manifests)
        env = {e["name"]: e.get("value") for e in container["env"]}
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "webhook-client-ca"]
        assert "subPath" not in mount  # a renewed bundle must reach the file
        pod = next(d for d in manifests if d["kind"] == "Deployment")["spec"]["template"]
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "webhook-client-ca"]
        key = "bundle.pem" if source == "secret" else "ca.crt"
        if source == "secret":
            assert volume["secret"]["secretName"] == "apiserver-ca"
        else:
            assert volume["configMap"]["name"] == "apiserver-ca"
        (item,) = volume[source]["items"]
        assert item["key"] == key
        assert env["CKPTDRAIN_WEBHOOK_CLIENT_CA"] == f"{mount['mountPath']}/{item['path']}"


def test_values_of_a_release_older_than_the_lock_down_still_render(tools: Tools) -> None:
    """`helm upgrade --reuse-values` from a release made before these values
    existed: no webhook.clientCA or webhook.networkPolicy map at all."""
    manifests = documents(render(tools, "--set", "webhook.clientCA=null",
                                 "--set", "webhook.networkPolicy=null").stdout)
    assert _policies(manifests) == []
    assert "CKPTDRAIN_WEBHOOK_CLIENT_CA" not in {e["name"] for e in _container(manifests)["env"]}


def test_the_documented_values_render_what_the_page_says(tools: Tools, tmp_path: Path) -> None:
    # The control plane's range, the Konnectivity agents, the client CA.
    control_plane, konnectivity, client_ca = _section_values()
    values = tmp_path / "values.yaml"
    for network in (control_plane, konnectivity):
        values.write_text(network)
        (policy,) = _policies(documents(render(tools, "-f", str(values)).stdout))
        documented = yaml.safe_load(network)["webhook"]["networkPolicy"]["from"]
        assert policy["spec"]["ingress"][0]["from"] == documented
    # One peer, namespace and pod together: the agents of kube-system only,
    # not (as two peers would say) every pod of kube-system or every such pod.
    (agents,) = yaml.safe_load(konnectivity)["webhook"]["networkPolicy"]["from"]
    assert agents["namespaceSelector"]["matchLabels"] and agents["podSelector"]["matchLabels"]
    values.write_text(client_ca)
    env = {e["name"] for e in _container(documents(render(tools, "-f", str(values)).stdout))
           ["env"]}
    assert "CKPTDRAIN_WEBHOOK_CLIENT_CA" in env


def test_the_locked_down_render_conforms_strictly(tools: Tools, schema_dir: Path) -> None:
    manifests = render(tools, *CONTROL_PLANE, "--set", "webhook.clientCA.secret=ca").stdout
    kinds = [d["kind"] for d in documents(manifests) if d["kind"] == "NetworkPolicy"]
    assert kinds == ["NetworkPolicy"]
    result = tools.run("kubeconform", "-strict", "-summary", "-output", "json",
                       "-schema-location", str(schema_dir / SCHEMA_LOCATION),
                       "-skip", "Issuer,Certificate", "-", input=manifests, check=False)
    report = json.loads(result.stdout)
    problems = [r for r in report["resources"] if r["status"] not in ("statusValid",
                                                                     "statusSkipped")]
    assert result.returncode == 0 and not problems, json.dumps(problems, indent=2)


def test_the_peers_the_docs_suggest_are_accepted(tools: Tools) -> None:
    """An IPv6 range, an ipBlock with pod ranges excepted, and the
    konnectivity-agent pods of kube-system (namespace and pod selector in
    one peer): each renders as given."""
    peers = [{"ipBlock": {"cidr": "fd00:10:96::/112"}},
             {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.128.0/17"]}},
             {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
              "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}}}]
    manifests = documents(render(tools, "--set", "webhook.networkPolicy.enabled=true",
                                 "--set-json", f"webhook.networkPolicy.from={json.dumps(peers)}"
                                 ).stdout)
    (policy,) = _policies(manifests)
    assert policy["spec"]["ingress"][0]["from"] == peers


# (--set arguments, text the refusal must contain).
REFUSED = {
    "policy-without-peers": (["--set", "webhook.networkPolicy.enabled=true"],
                             "webhook.networkPolicy.from: expected at least one "
                             "NetworkPolicyPeer"),
    "peer-not-a-cidr": (["--set", "webhook.networkPolicy.from[0].ipBlock.cidr=10.0.0.1"],
                        "at '/webhook/networkPolicy/from/0/ipBlock/cidr'"),
    "peer-misspelt": (["--set", "webhook.networkPolicy.from[0].nsSelector.a=b"],
                      "at '/webhook/networkPolicy/from/0': additional properties "
                      "'nsSelector' not allowed"),
    "peer-empty": (["--set-json", "webhook.networkPolicy.from=[{}]"],
                   "at '/webhook/networkPolicy/from/0'"),
    # The API refuses a peer with an ipBlock and a selector: say it at render.
    "peer-ipblock-and-selector": (
        ["--set-json", 'webhook.networkPolicy.from=[{"ipBlock": {"cidr": "10.0.0.0/8"}, '
                       '"namespaceSelector": {"matchLabels": {"a": "b"}}}]'],
        "at '/webhook/networkPolicy/from/0'"),
    # An empty selector selects every namespace (or pod): the webhook open to all.
    "peer-every-namespace": (["--set-json", 'webhook.networkPolicy.from='
                                            '[{"namespaceSelector": {}}]'],
                             "at '/webhook/networkPolicy/from/0/namespaceSelector': minProperties"),
    "peer-every-pod": (["--set-json", 'webhook.networkPolicy.from=[{"podSelector": {}}]'],
                       "at '/webhook/networkPolicy/from/0/podSelector': minProperties"),
    "peer-no-labels": (["--set-json", 'webhook.networkPolicy.from='
                                      '[{"podSelector": {"matchLabels": {}}}]'],
                       "at '/webhook/networkPolicy/from/0/podSelector/matchLabels'"),
    "peer-octet-too-big": (["--set", "webhook.networkPolicy.from[0].ipBlock.cidr=300.0.0.0/8"],
                           "at '/webhook/networkPolicy/from/0/ipBlock/cidr'"),
    "peer-prefix-too-long": (["--set", "webhook.networkPolicy.from[0].ipBlock.cidr=10.0.0.0/33"],
                             "at '/webhook/networkPolicy/from/0/ipBlock/cidr'"),
    "peer-ipv6-prefix-too-long": (["--set",
                                   "webhook.networkPolicy.from[0].ipBlock.cidr=fd00::/129"],
                                  "at '/webhook/networkPolicy/from/0/ipBlock/cidr'"),
    "peer-not-an-address": (["--set", "webhook.networkPolicy.from[0].ipBlock.cidr=::::/8"],
                            "at '/webhook/networkPolicy/from/0/ipBlock/cidr'"),
    "peer-except-not-a-cidr": (["--set", "webhook.networkPolicy.from[0].ipBlock.cidr=10.0.0.0/8",
                                "--set", "webhook.networkPolicy.from[0].ipBlock.except[0]=10.1"],
                               "at '/webhook/networkPolicy/from/0/ipBlock/except/0'"),
    "ca-in-both": (["--set", "webhook.clientCA.secret=a", "--set",
                    "webhook.clientCA.configMap=b"],
                   "webhook.clientCA: expected a secret or a configMap"),
    # The cluster CA signs every kubelet's and every user's client certificate.
    "ca-cluster-root": (["--set", "webhook.clientCA.configMap=kube-root-ca.crt"],
                        "webhook.clientCA.configMap: kube-root-ca.crt"),
    "ca-bad-name": (["--set", "webhook.clientCA.secret=Apiserver_CA"],
                    "at '/webhook/clientCA/secret'"),
    "ca-misspelt": (["--set", "webhook.clientCA.secretName=a"],
                    "at '/webhook/clientCA': additional properties 'secretName' not allowed"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_mistake_is_refused_naming_the_value(tools: Tools, case: str) -> None:
    args, expected = REFUSED[case]
    result = render(tools, *args, check=False)
    assert result.returncode != 0 and expected in result.stderr, result.stderr
