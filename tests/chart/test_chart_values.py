"""The chart's values: its schema refuses what a user gets wrong (naming the
key and what it wanted), and each value reaches the rendered object it
governs, as the operator reads it. `helm template` only: no cluster needed
beyond the helm build of `make servers`."""

from __future__ import annotations

import pytest
from tests.chart.support import CLOUD_VALUES, Tools, documents, render

pytestmark = pytest.mark.cluster  # helm, built by `make servers`


# (--set arguments, text the refusal must contain). Each is a mistake a user
# makes: a wrong type, a misspelt key, a value outside its enum.
BAD_VALUES = {
    "wrong-type": (["--set", "webhook.port=https"],
                   "at '/webhook/port': got string, want integer"),
    "unknown-top-level-key": (["--set", "imagePullSecret=regcred"],
                              "additional properties 'imagePullSecret' not allowed"),
    "unknown-nested-key": (["--set", "certManager.enable=true"],
                           "at '/certManager': additional properties 'enable' not allowed"),
    "bad-enum": (["--set", "image.pullPolicy=Sometimes"],
                 "at '/image/pullPolicy': value must be one of"),
    "bad-cap-unit": (["--set", "bandwidth.clusterCap=100Gbit/s"],
                     "at '/bandwidth/clusterCap': '100Gbit/s' does not match pattern"),
    "zero-weight": (["--set", "bandwidth.weights.ml-a=0"],
                    "at '/bandwidth/weights/ml-a': minimum: got 0, want 1"),
    "prepare-not-a-boolean": (["--set-string", "localTier.prepare=no"],
                              "at '/localTier/prepare': got string, want boolean"),
    "root-as-allowed-root": (["--set", "localTier.allowedRoot=/"],
                             "at '/localTier/allowedRoot': '/' does not match pattern"),
    "negative-replicas": (["--set", "operator.replicas=-1"],
                          "at '/operator/replicas': minimum: got -1, want 0"),
    "bad-spread-policy": (["--set", "operator.topologySpread.whenUnsatisfiable=Sometimes"],
                          "at '/operator/topologySpread/whenUnsatisfiable': value must be one"),
    "bad-failure-policy": (["--set", "webhook.podFailurePolicy=Maybe"],
                           "at '/webhook/podFailurePolicy': value must be one of"),
    "bad-unselected-pods": (["--set", "webhook.unselectedPods=Warn"],
                            "at '/webhook/unselectedPods': value must be one of"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_values_schema_refuses(tools: Tools, case: str) -> None:
    args, needle = BAD_VALUES[case]
    result = render(tools, *args, check=False)
    assert result.returncode != 0, f"{case} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert needle in result.stderr, result.stderr


def test_values_schema_accepts_every_documented_key(tools: Tools) -> None:
    """values.yaml itself and the cloud examples pass; a schema that refused
    the defaults would make every install fail."""
    render(tools)
    for values in CLOUD_VALUES:
        render(tools, "-f", str(values))


def test_cert_manager_replaces_the_generated_certificate(tools: Tools) -> None:
    """With cert-manager, no private key is rendered into the release; the
    Certificate covers the webhook Service and cainjector fills both
    caBundles."""
    objects = documents(render(tools, "--set", "certManager.enabled=true").stdout)
    assert not [o for o in objects if o["kind"] == "Secret"]
    certificate = next(o for o in objects if o["kind"] == "Certificate")
    assert "ckptdrain-webhook.ckptdrain.svc" in certificate["spec"]["dnsNames"]
    for o in objects:
        if o["kind"].endswith("WebhookConfiguration"):
            assert o["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
                f"ckptdrain/{certificate['metadata']['name']}")
            assert all("caBundle" not in w["clientConfig"] for w in o["webhooks"])


@pytest.mark.parametrize("prepare", ["true", "false"])
def test_local_tier_prepare_reaches_the_operator(tools: Tools, prepare: str) -> None:
    """The opt-out of the root prepare container is passed to the operator as
    the exact string its config accepts."""
    objects = documents(render(tools, "--set", f"localTier.prepare={prepare}").stdout)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value")
           for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CKPTDRAIN_PREPARE_LOCAL_TIER"] == prepare


@pytest.mark.parametrize(("args", "mode"), [([], "Refuse"),
                                            (["--set", "webhook.unselectedPods=Flag"], "Flag")])
def test_unselected_pods_reach_the_operator(tools: Tools, args: list[str], mode: str) -> None:
    """What admission does with an opted-in pod no policy selects, as the
    operator's config reads it."""
    from ckptdrain.operator import config

    deployment = next(o for o in documents(render(tools, *args).stdout)
                      if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value")
           for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert config.from_env({"CKPTDRAIN_UNSELECTED_PODS":
                            env["CKPTDRAIN_UNSELECTED_PODS"]}).unselected_pods == mode


@pytest.mark.parametrize(("delay", "grace"), [(None, 35), ("0", None), ("12", 42)])
def test_a_stopping_replica_serves_admission_until_its_endpoint_is_gone(
        tools: Tools, delay: str | None, grace: int | None) -> None:
    """A preStop sleep of shutdownDelaySeconds (5 by default) before SIGTERM,
    inside a grace period that still leaves Kopf its 30 s to stop."""
    args = [] if delay is None else ["--set", f"operator.shutdownDelaySeconds={delay}"]
    deployment = next(o for o in documents(render(tools, *args).stdout)
                      if o["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    lifecycle = spec["containers"][0].get("lifecycle")
    assert spec.get("terminationGracePeriodSeconds") == grace
    if grace is None:
        assert lifecycle is None
    else:
        assert lifecycle == {"preStop": {"sleep": {"seconds": grace - 30}}}


# No --api-versions anywhere: the policies follow their values alone, as
# `helm template` renders them for Argo CD and Flux, knowing no cluster.
@pytest.mark.parametrize(("args", "present"), [
    ([], True),                                                            # the default
    (["--set", "agent.restrictPodPatches=auto"], True),                    # alias of true
    (["--set", "agent.restrictPodPatches=true"], True),
    (["--set", "agent.restrictPodPatches=false"], False),
])
def test_the_agent_pod_patch_policy_follows_its_value(tools: Tools, args: list[str],
                                                      present: bool) -> None:
    kinds = [o["kind"] for o in documents(render(tools, *args).stdout)
             if o["metadata"]["name"] == "ckptdrain-agent-pod-patch"]
    assert ("ValidatingAdmissionPolicy" in kinds) is present
    assert ("ValidatingAdmissionPolicyBinding" in kinds) is present


@pytest.mark.parametrize(("args", "present"), [
    ([], False),                                                           # no peer tier
    (["--set", "operator.peerTier=true"], True),                           # the default
    (["--set", "operator.peerTier=true", "--set", "operator.restrictSecretUpdates=auto"], True),
    (["--set", "operator.peerTier=true", "--set", "operator.restrictSecretUpdates=true"], True),
    (["--set", "operator.peerTier=true", "--set", "operator.restrictSecretUpdates=false"], False),
])
def test_the_operator_secret_update_policy_follows_its_values(tools: Tools, args: list[str],
                                                              present: bool) -> None:
    names = [o["metadata"]["name"] for o in documents(render(tools, *args).stdout)
             if o["kind"].startswith("ValidatingAdmissionPolicy")]
    # The policy and its binding.
    assert (names.count("ckptdrain-secret-update") == 2) is present, names


def test_a_wrong_restrict_pod_patches_value_is_refused(tools: Tools) -> None:
    result = render(tools, "--set", "agent.restrictPodPatches=maybe", check=False)
    assert result.returncode != 0 and "restrictPodPatches" in result.stderr
