"""Cloud identity reaches restore and the agent whatever order the mutating
webhooks run in, through the real apiserver's admission chain.

A platform identity webhook (what EKS runs for IRSA) is served here over TLS
and registered beside ours under a name that sorts before or after ours. It
applies the patch that webhook makes: the identity variables and the token
mount in the containers present but those the pod's
`eks.amazonaws.com/skip-containers` annotation names, the projected token
volume. Its "old"
flavour is what releases built on Kubernetes types older than native
sidecars did: it touched only the application containers and re-encoded the
init containers without `restartPolicy`. Our pod webhook carries
`reinvocationPolicy: IfNeeded` as the chart deploys it, so the apiserver
calls it again after a later webhook changed the pod."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from operator_process import WEBHOOK_NAME, OperatorProcess, repo_root

from ckptdrain.operator.admission import injection
from support import apiserver

ROLE = "arn:aws:iam::111122223333:role/ckptdrain"
TOKEN_DIR = "/var/run/secrets/eks.amazonaws.com/serviceaccount"
ORDER_LABEL = "ckptdrain-test/identity-webhook"


def _identity_patch(review_pod: dict[str, Any], flavour: str) -> list[dict[str, Any]]:
    """The platform webhook's JSONPatch for `review_pod`."""
    spec = copy.deepcopy(review_pod["spec"])
    env = [{"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"},
           {"name": "AWS_ROLE_ARN", "value": ROLE},
           {"name": "AWS_WEB_IDENTITY_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"}]
    mount = {"name": "aws-iam-token", "mountPath": TOKEN_DIR, "readOnly": True}
    touched = ["containers"] if flavour == "old" else ["initContainers", "containers"]
    skip = str(((review_pod.get("metadata") or {}).get("annotations") or {})
               .get("eks.amazonaws.com/skip-containers", "")).split(",")
    for key in touched:
        for c in spec.get(key) or []:
            if c["name"] in skip:
                continue
            have = {e["name"] for e in c.get("env") or []}
            c["env"] = (c.get("env") or []) + [e for e in env if e["name"] not in have]
            if all(m["mountPath"] != TOKEN_DIR for m in c.get("volumeMounts") or []):
                c["volumeMounts"] = (c.get("volumeMounts") or []) + [mount]
    if flavour == "old":
        for c in spec.get("initContainers") or []:
            c.pop("restartPolicy", None)
    volume = {"name": "aws-iam-token", "projected": {"sources": [{"serviceAccountToken": {
        "audience": "sts.amazonaws.com", "expirationSeconds": 86400, "path": "token"}}]}}
    volumes = spec.get("volumes") or []
    if all(v["name"] != "aws-iam-token" for v in volumes):
        spec["volumes"] = [*volumes, volume]
    return [{"op": "replace" if k in review_pod["spec"] else "add", "path": f"/spec/{k}",
             "value": spec[k]} for k in ("initContainers", "containers", "volumes") if k in spec]


class _Handler(BaseHTTPRequestHandler):
    calls: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        flavour = self.path.split("?")[0].strip("/")
        request = review["request"]
        type(self).calls.append(flavour)
        ops = _identity_patch(request["object"], flavour)
        answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "response": {"uid": request["uid"], "allowed": True, "patchType": "JSONPatch",
                               "patch": base64.b64encode(json.dumps(ops).encode()).decode()}}
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def platform_webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(url, caBundle) of the platform identity webhook served on loopback."""
    directory: Path = tmp_path_factory.mktemp("platform-webhook")
    ca = apiserver.make_ca(directory)
    cert, key = apiserver.make_cert(directory, "webhook", ca)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield (f"https://127.0.0.1:{server.server_address[1]}",
           base64.b64encode(ca[0].read_bytes()).decode())
    server.shutdown()


def _chart_reinvocation() -> str:
    """What the chart deploys for our pod webhook."""
    text = (repo_root() / "charts/ckptdrain/templates/webhooks.yaml").read_text()
    found = [line.split(":", 1)[1].strip() for line in text.splitlines()
             if line.strip().startswith("reinvocationPolicy:")]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def reinvoked_like_the_chart(cluster: apiserver.Cluster,
                             operator: OperatorProcess) -> Iterator[Callable[[], None]]:
    """Our managed pod webhook with the chart's reinvocationPolicy; the
    returned check re-applies it should the operator have rewritten it."""
    def ensure() -> None:
        config = json.loads(cluster.kubectl("get", "mutatingwebhookconfiguration",
                                            WEBHOOK_NAME, "-o", "json").stdout)
        ops = [{"op": "add", "path": f"/webhooks/{i}/reinvocationPolicy",
                "value": _chart_reinvocation()}
               for i, hook in enumerate(config["webhooks"])
               if hook.get("reinvocationPolicy") != _chart_reinvocation()]
        if ops:
            cluster.kubectl("patch", "mutatingwebhookconfiguration", WEBHOOK_NAME,
                            "--type=json", "-p", json.dumps(ops))
    ensure()
    yield ensure
    config = json.loads(cluster.kubectl("get", "mutatingwebhookconfiguration",
                                        WEBHOOK_NAME, "-o", "json").stdout)
    cluster.kubectl("patch", "mutatingwebhookconfiguration", WEBHOOK_NAME, "--type=json",
                    "-p", json.dumps([{"op": "replace", "path": f"/webhooks/{i}/reinvocationPolicy",
                                       "value": "Never"}
                                      for i in range(len(config["webhooks"]))]), check=False)


def _register(cluster: apiserver.Cluster, name: str, url: str, ca_bundle: str,
              namespace: str, flavour: str) -> None:
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "pod-identity-webhook.amazonaws.com", "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"{url}/{flavour}", "caBundle": ca_bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"]}],
            "objectSelector": {"matchLabels": {ORDER_LABEL: name}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": "Fail", "sideEffects": "None", "reinvocationPolicy": "Never",
            "timeoutSeconds": 10}]}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(config))


@pytest.mark.parametrize(("name", "flavour"), [
    ("aaa-pod-identity-webhook", "current"),  # sorts before ours: runs first
    ("zzz-pod-identity-webhook", "current"),  # after ours: mutates our containers too
    ("zzz-pod-identity-webhook", "old"),      # after ours, skips them, drops restartPolicy
])
def test_identity_reaches_restore_and_agent_in_either_order(
        cluster: apiserver.Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], platform_webhook: tuple[str, str],
        reinvoked_like_the_chart: Callable[[], None], name: str, flavour: str) -> None:
    assert (name < WEBHOOK_NAME) == name.startswith("aaa")
    url, ca_bundle = platform_webhook
    _register(cluster, name, url, ca_bundle, namespace, flavour)
    try:
        cluster.kubectl("create", "serviceaccount", "trainer", "-n", namespace)
        apply(policy("irsa", writers=1, storage={"uri": "s3://ckpt-bucket/runs"}))
        wait_for(lambda: (get(cluster, namespace, POLICIES, "irsa").get("status") or {})
                 .get("phase"), what="policy sized")
        reinvoked_like_the_chart()
        calls_before = len(_Handler.calls)
        made = cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                               input=json.dumps(pod("w", {"app": "irsa", ORDER_LABEL: name,
                                                          **INJECT},
                                                    serviceAccountName="trainer",
                                                    terminationGracePeriodSeconds=600)),
                               check=False)
        assert made.returncode == 0, made.stderr
        assert _Handler.calls[calls_before:] == [flavour]
        stored = get(cluster, namespace, "pod", "w")
        found = {c["name"]: c for c in stored["spec"]["initContainers"]}
        for ours in (injection.RESTORE, injection.AGENT):
            env = {e["name"]: e.get("value") for e in found[ours]["env"]}
            assert env["AWS_ROLE_ARN"] == ROLE, (ours, env)
            assert env["AWS_WEB_IDENTITY_TOKEN_FILE"] == f"{TOKEN_DIR}/token"
            mounts = {m["mountPath"]: m["name"] for m in found[ours]["volumeMounts"]}
            assert mounts[TOKEN_DIR] == "aws-iam-token"
            assert [e["name"] for e in found[ours]["env"]].count("AWS_ROLE_ARN") == 1
        # The root prepare step never gets it, whichever ran first.
        assert "AWS_ROLE_ARN" not in {e["name"] for e in found[injection.PREPARE].get("env", [])}
        assert found[injection.AGENT]["restartPolicy"] == "Always"
        assert "restartPolicy" not in found[injection.RESTORE]
        assert [v["name"] for v in stored["spec"]["volumes"]].count("aws-iam-token") == 1
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", name, check=False)
