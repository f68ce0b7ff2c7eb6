"""The upgrade from the released chart (0.1.0, v1alpha1 served alone) to this
one (v1beta1 served too) on the real apiserver: policies written at v1alpha1
under 0.1.0, some status written by the operator, `helm upgrade`, then every
object read at both versions, one written at v1beta1, and the operator still
reconciling the old objects and injecting a pod an old policy selects.

What runs where. The session's apiserver and its operator process (the
`operator` fixture: one replica, with its admission process serving the pod
and policy webhooks and /convert on 127.0.0.1). Helm installs and upgrades
the releases' objects on that apiserver, CRDs included, but no pod runs
here: the chart's Deployment never starts, and its Service has nothing
behind it. So the chart's webhooks are scoped to the release's own empty
namespace (operator.watchNamespace) and the session's operator admits the
tenant's objects, as the chart's replicas would. Two steps stand in for
what the chart's replicas do in a cluster, each named where it happens:
the 0.1.0 operator putting its CA in the CRD's conversion caBundle, and
the Service routing /convert to a replica (here the CRD names the admission
process by URL once upgraded, keeping the caBundle the upgrade left). The
same stands in for the Service of the release's policy webhooks once
upgraded, so that v1beta1 creates reach them as the chart registers them
(every version, unconverted).

The session's apiserver, not one of its own (the CI budget): however the
test ends, the release is uninstalled and the session's CRDs put back as
crds/ has them, Helm's marks removed, so the modules after this one see
what the `crds` fixture applied."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from cluster_helpers import INJECT, helm_binary, pod, policy, wait_for
from operator_process import WEBHOOK_NAME, OperatorProcess, repo_root
from tests.chart.support import adopt_crds

from ckptdrain.contract.policy_versions import convert
from support import apiserver
from support.apiserver import Cluster
from support.conversion_server import ConversionServer

ALPHA, BETA = "ckptdrain.io/v1alpha1", "ckptdrain.io/v1beta1"
CRD = "checkpointpolicies.ckptdrain.io"
RELEASED = repo_root() / "tests" / "fixtures" / "released" / "ckptdrain-0.1.0.tgz"
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z$")


def resource(version: str) -> str:
    return f"checkpointpolicies.{version.partition('/')[2]}.ckptdrain.io"


def read(cluster: Cluster, namespace: str, version: str, name: str) -> dict[str, Any]:
    got = cluster.kubectl("get", "-n", namespace, resource(version), name, "-o", "json")
    return dict(json.loads(got.stdout))


def same_moment(cluster: Cluster, namespace: str, name: str
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The object at v1alpha1 and at v1beta1, both of one resourceVersion
    (the operator may write its status between two reads)."""
    def both() -> tuple[dict[str, Any], dict[str, Any]] | None:
        alpha = read(cluster, namespace, ALPHA, name)
        beta = read(cluster, namespace, BETA, name)
        again = read(cluster, namespace, ALPHA, name)
        rv = {o["metadata"]["resourceVersion"] for o in (alpha, beta, again)}
        return (alpha, beta) if len(rv) == 1 else None
    return wait_for(both, timeout_s=30, what=f"{name} read twice at one resourceVersion")


def helm(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    ran = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True,
                         env=cluster.env(), timeout=300)
    assert ran.returncode == 0, f"helm {' '.join(args)}:\n{ran.stdout}\n{ran.stderr}"
    return ran


def crd(cluster: Cluster) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "crd", CRD, "-o", "json").stdout))


def served(cluster: Cluster) -> dict[str, tuple[bool, bool]]:
    return {v["name"]: (v["served"], v["storage"]) for v in crd(cluster)["spec"]["versions"]}


def patch_client_config(cluster: Cluster, client_config: dict[str, Any]) -> None:
    cluster.kubectl("patch", "crd", CRD, "--type=merge", "-p", json.dumps(
        {"spec": {"conversion": {"webhook": {"clientConfig": client_config}}}}))


def operators_ca(cluster: Cluster) -> str:
    """The CA the session's operator serves its webhooks under (it keeps it
    in the configurations it registers itself)."""
    hooks = json.loads(cluster.kubectl("get", "mutatingwebhookconfiguration", WEBHOOK_NAME,
                                       "-o", "json").stdout)["webhooks"]
    return str(hooks[0]["clientConfig"]["caBundle"])


def admissions(operator: OperatorProcess, webhook: str) -> int:
    """How many reviews the session's admission process answered at
    `webhook` ("policy-class", "policy"), every outcome, as its metrics
    count them."""
    total = 0.0
    for line in operator.metrics().splitlines():
        if line.startswith("ckptdrain_webhook_seconds_count{") and \
                f'webhook="{webhook}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def route_release_policy_webhooks(cluster: Cluster, release: str, url: str, ca: str) -> None:
    """What the Service does in a cluster for the release's policy webhooks:
    reach a replica's admission, here the session's, by URL, the path the
    chart names. Their rules (`apiVersions: ["*"]`) are left as the chart
    renders them, so v1beta1 requests come at v1beta1."""
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        name = next(item["metadata"]["name"] for item in json.loads(cluster.kubectl(
            "get", kind, "-l", "app.kubernetes.io/instance=up", "-o", "json").stdout)["items"]
            if item["metadata"]["annotations"].get("meta.helm.sh/release-namespace") == release)
        hooks = json.loads(cluster.kubectl("get", kind, name, "-o", "json").stdout)["webhooks"]
        ops = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig", "value": {
                   "url": url + hook["clientConfig"]["service"]["path"], "caBundle": ca}}
               for i, hook in enumerate(hooks) if hook["name"].startswith("checkpointpolicies.")]
        assert ops, f"{kind} {name}: no policy webhook"
        assert all(r["apiVersions"] == ["*"] for i, hook in enumerate(hooks)
                   if hook["name"].startswith("checkpointpolicies.") for r in hook["rules"])
        cluster.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(ops))


def as_shipped(cluster: Cluster) -> None:
    """The CRD's conversion naming the Service crds/ names, not the
    session's URL: what an installed cluster has before `helm install`
    (Helm's patch would set a Service beside the URL, which is invalid)."""
    source = next(d for d in yaml.safe_load_all(
        (repo_root() / "crds" / "checkpointpolicies.yaml").read_text()) if d)
    patch_client_config(cluster, {"url": None, "caBundle": None,
                                  **source["spec"]["conversion"]["webhook"]["clientConfig"]})


#: The CRDs the `crds` fixture applies for the session, as crds/ ships them.
SESSION_CRDS = ("checkpointpolicies", "checkpoints", "checkpointshares", "checkpointclasses")
#: What kubectl's client-side apply (the `crds` fixture's) keeps on each CRD.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def put_back_session_crds(cluster: Cluster, conversion: ConversionServer) -> None:
    """The session's CRDs as crds/ has them, converting through the
    session's server (conftest.py session_conversion), whatever the releases
    left: applied server-side with --force-conflicts (Helm owns their fields
    now), Helm's labels and annotations (release ownership, resource policy)
    stripped, so no later `helm install` takes them for another release's,
    and the served flags of this release checked."""
    source = conversion.converting(next(d for d in yaml.safe_load_all(
        (repo_root() / "crds" / "checkpointpolicies.yaml").read_text()) if d))
    session = source["spec"]["conversion"]["webhook"]["clientConfig"]
    # A merge patch first: server-side apply keeps fields the file lacks
    # (the Service a release set), and a URL beside a Service is invalid.
    patch_client_config(cluster, {"service": None, **session})
    for name in SESSION_CRDS:
        path = repo_root() / "crds" / f"{name}.yaml"
        doc = source if name == "checkpointpolicies" else next(
            d for d in yaml.safe_load_all(path.read_text()) if d)
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                        input=json.dumps(doc))
        meta = next(d for d in yaml.safe_load_all(path.read_text()) if d)["metadata"]
        live = json.loads(cluster.kubectl("get", "crd", meta["name"], "-o", "json").stdout)
        for verb, field, kept in (("label", "labels", ()), ("annotate", "annotations",
                                                            (LAST_APPLIED,))):
            extra = [f"{key}-" for key in live["metadata"].get(field) or {}
                     if key not in (meta.get(field) or {}) and key not in kept]
            if extra:
                cluster.kubectl(verb, "crd", meta["name"], *extra)
    apiserver.wait_established(cluster, *(f"{name}.ckptdrain.io" for name in SESSION_CRDS))
    for name in SESSION_CRDS:
        live_meta = json.loads(cluster.kubectl("get", "crd", f"{name}.ckptdrain.io", "-o",
                                               "json").stdout)["metadata"]
        helm_marks = [key for field in ("labels", "annotations")
                      for key in live_meta.get(field) or {} if "helm" in key.lower()
                      or (key == "app.kubernetes.io/managed-by")]
        assert helm_marks == [], (name, helm_marks)
    assert served(cluster) == {"v1alpha1": (True, False), "v1beta1": (True, True)}
    assert crd(cluster)["spec"]["conversion"]["webhook"]["clientConfig"] == session


@pytest.fixture
def release(cluster: Cluster, session_conversion: ConversionServer,
            operator: OperatorProcess) -> Iterator[str]:
    """A namespace for the release; afterwards, however the test ended
    (between install and upgrade too), the release uninstalled and the
    session's CRDs as crds/ has them (put_back_session_crds), so the modules
    after this one see what the `crds` fixture applied."""
    namespace = f"up-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        yield namespace
    finally:
        try:
            subprocess.run([str(helm_binary()), "uninstall", "up", "-n", namespace],
                           capture_output=True, env=cluster.env(), timeout=300)
            put_back_session_crds(cluster, session_conversion)
            if operator.proc is None:  # stopped by a test that ended early
                operator.start()
        finally:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


UNITS = {"model": {"parameters": "405B"}, "mtti": "1d", "overlap": "0.1",
         "localWriteTime": "30"}


def test_objects_written_under_0_1_0_read_and_work_after_the_upgrade(
        cluster: Cluster, operator: OperatorProcess, release: str, namespace: str) -> None:
    # The chart's webhooks for the release's own, empty namespace alone:
    # nothing answers behind its Service here. One replica, so no Kopf
    # peering, whose CRDs the session's apiserver does not have.
    values = ["--set", f"operator.watchNamespace={release}", "--set", "operator.replicas=1",
              "--set", "operator.peering=false", "--skip-crds"]
    # The CA the 0.1.0 operator keeps in the CRD, below.
    ca = operators_ca(cluster)
    # The session's operator reads v1beta1, which 0.1.0 does not serve: it
    # cannot stand for the 0.1.0 operator, so none runs until the upgrade,
    # and its webhook configurations (which fail closed) go with it.
    operator.stop()
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        cluster.kubectl("delete", kind, WEBHOOK_NAME, "--ignore-not-found")
    as_shipped(cluster)
    adopt_crds(cluster, "up", release)
    helm(cluster, "install", "up", str(RELEASED), "-n", release, *values)
    assert served(cluster) == {"v1alpha1": (True, True), "v1beta1": (False, False)}

    # Under 0.1.0: a policy in human units, and one with a status as the
    # 0.1.0 operator wrote it (goodput times, Unix seconds at v1alpha1),
    # written here.
    def create(body: dict[str, Any]) -> None:
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))
    create(policy("units", **UNITS))
    create(policy("llama", model={"checkpointBytes": "5.67TB"}, writers=1))
    now = float(int(time.time()))
    cluster.kubectl("patch", "-n", namespace, resource(ALPHA), "llama", "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"goodput": {
                        "heldSince": now - 100}}}))
    written = {name: read(cluster, namespace, ALPHA, name)["spec"]
               for name in ("units", "llama")}
    assert written["units"]["mtti"] == "1d" and written["units"]["overlap"] == "0.1"

    # What the 0.1.0 operator does in a cluster: keep its CA in the CRD's
    # conversion webhook, which names the release's Service.
    patch_client_config(cluster, {"caBundle": ca})

    helm(cluster, "upgrade", "up", str(repo_root() / "charts" / "ckptdrain"), "-n", release,
         *values)
    assert served(cluster) == {"v1alpha1": (True, False), "v1beta1": (True, True)}
    upgraded = crd(cluster)["spec"]["conversion"]["webhook"]["clientConfig"]
    assert upgraded["caBundle"] == ca  # Helm's merge leaves the operator's CA
    assert upgraded["service"]["namespace"] == release and upgraded["service"]["path"] == (
        "/convert")
    # v1alpha1 reads of objects still stored at v1alpha1 need no conversion.
    assert read(cluster, namespace, ALPHA, "units")["spec"] == written["units"]

    # The upgraded operator starts (its webhooks registered again, with the
    # CA it serves now), and the Service reaches a replica's /convert.
    operator.start()
    port = operator.env["CKPTDRAIN_WEBHOOK_PORT"]
    ca = operators_ca(cluster)
    patch_client_config(cluster, {"service": None, "caBundle": ca,
                                  "url": f"https://127.0.0.1:{port}/convert"})
    wait_for(lambda: cluster.kubectl("get", "-n", namespace, resource(BETA), "units",
                                     check=False).returncode == 0,
             what="the apiserver to convert through the operator's /convert")

    # Every object at v1beta1: the converter's values, exactly. At v1alpha1
    # the values written, in v1beta1's spellings once the operator wrote the
    # object at v1beta1 (its status, its migration): 1d reads 24h.
    for name in ("units", "llama"):
        alpha, beta = same_moment(cluster, namespace, name)
        assert beta["apiVersion"] == BETA
        assert convert({**alpha, "spec": written[name]}, BETA)["spec"] == beta["spec"]
        expected = convert(copy.deepcopy(alpha), BETA)
        assert (beta["spec"], beta.get("status")) == (expected["spec"], expected.get("status"))
        assert beta["metadata"]["uid"] == alpha["metadata"]["uid"]
    units = read(cluster, namespace, BETA, "units")["spec"]
    assert (units["model"]["parameters"], units["mtti"], units["overlap"],
            units["localWriteTime"]) == ("405G", "24h", "10%", "30s")
    llama = read(cluster, namespace, BETA, "llama")
    assert llama["spec"]["model"]["checkpointBytes"] == "5.67T"
    held = llama["status"]["goodput"]["heldSince"]
    assert RFC3339_UTC.match(held), held
    assert datetime.fromisoformat(held) == datetime.fromtimestamp(now - 100, UTC)

    # Lists at each version, and kubectl's default (the preferred, v1beta1).
    for version, what in ((ALPHA, resource(ALPHA)), (BETA, resource(BETA)), (BETA, "ckpol")):
        items = json.loads(cluster.kubectl("get", "-n", namespace, what, "-o", "json")
                           .stdout)["items"]
        assert sorted((i["metadata"]["name"], i["apiVersion"]) for i in items) == [
            ("llama", version), ("units", version)], what

    # A write at v1beta1 reads back at v1alpha1 as written, and the operator
    # (reading v1beta1, patching its status there) reconciles it.
    generation = read(cluster, namespace, ALPHA, "units")["metadata"]["generation"]
    cluster.kubectl("patch", "-n", namespace, resource(BETA), "units", "--type=merge",
                    "-p", json.dumps({"spec": {"interval": "30m", "mtti": "36h"}}))
    alpha, beta = same_moment(cluster, namespace, "units")
    assert (alpha["spec"]["interval"], alpha["spec"]["mtti"]) == ("30m", "36h")
    assert alpha["spec"] == convert(copy.deepcopy(beta), ALPHA)["spec"]
    # Written whole at v1beta1: the same value, in v1beta1's spelling, which
    # v1alpha1 reads too (docs/api-versions.md, "How objects convert").
    assert alpha["spec"]["model"]["parameters"] == "405G"
    status = wait_for(lambda: (s := read(cluster, namespace, ALPHA, "units")["status"])
                      .get("observedGeneration") == generation + 1 and s,
                      what="the operator to reconcile the v1beta1 write")
    assert status["requiredBandwidthBytes"] == 31_500_000_000  # 5.67 TB in 30 m at 10%
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["observedGeneration"]) == ("True", generation + 1)

    # The release's policy webhooks, registered for every version, given
    # v1beta1 requests as they come: one in v1beta1's spellings admitted
    # (the class mutation and validation both answer it), one outside the
    # allowed root refused naming the field. The session's own webhooks
    # (v1alpha1 rules, matchPolicy Equivalent) answer too; the count of
    # class mutations shows the release's were asked as well.
    route_release_policy_webhooks(cluster, release, f"https://127.0.0.1:{port}", ca)
    beta = {"apiVersion": BETA, "kind": "CheckpointPolicy", "metadata": {"name": "beta"},
            "spec": {**convert(policy("beta"), BETA)["spec"],
                     "model": {"parameters": "70G", "bytesPerParameter": "12.5"},
                     "interval": "1h30m", "overlap": "12.5%",
                     "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2,
                                   "capacity": 8_000_000_000_000}}}
    asked = admissions(operator, "policy-class")
    made = cluster.kubectl("create", "-n", release, "-f", "-", "-o", "json",
                           input=json.dumps(beta), check=False)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["spec"]["localTier"]["capacity"] == 8_000_000_000_000
    wait_for(lambda: admissions(operator, "policy-class") - asked == 2,
             what="both class mutations (the release's and the session's) counted")
    outside = copy.deepcopy(beta)
    outside["metadata"]["name"] = "outside"
    outside["spec"]["selector"] = {"matchLabels": {"app": "outside"}}
    outside["spec"]["localTier"]["path"] = "/etc/ckpt"
    refused = cluster.kubectl("create", "-n", release, "-f", "-", input=json.dumps(outside),
                              check=False)
    assert refused.returncode != 0
    assert "localTier.path" in refused.stderr and "/etc/ckpt" in refused.stderr, refused.stderr
    assert [i["metadata"]["name"] for i in json.loads(cluster.kubectl(
        "get", "-n", release, resource(BETA), "-o", "json").stdout)["items"]] == ["beta"]
    cluster.kubectl("delete", "-n", release, resource(BETA), "beta", "--wait=false")

    # A pod an old policy selects is still injected.
    made = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", input=json.dumps(
        pod("u-0", {"app": "units", **INJECT}, 0, terminationGracePeriodSeconds=3600)))
    names = [c["name"] for c in json.loads(made.stdout)["spec"].get("initContainers", [])]
    assert "ckptdrain-agent" in names, names

    # Clean up while /convert still answers: objects once written at v1beta1
    # need it for every write.
    cluster.kubectl("delete", "-n", namespace, f"pods,{resource(ALPHA)}", "--all",
                    "--wait=false")
