"""The IAM policies of docs/cloud/eks.md's "One identity per tenant" do what
the page says, for the keys ckptdrain really uses: the trust policy takes
the namespace's tokens with the configured audience and no other
namespace's; the permissions reach the prefix the webhook gives the
tenant's policies (<uri prefix>/<namespace>/<policy>/) and no other
tenant's. A small evaluator of the IAM subset the page uses (Allow
statements; StringEquals and StringLike; `*` and `?`; the
${aws:PrincipalTag/...} variable) stands in for AWS, which no test here
reaches. The key's permissions for SSE-KMS stop at the same prefix, and
Pod Identity's shared role keeps clusters apart as well as namespaces. The
page's trainerAccess fragment gives the trainer the namespace's role, and
the rollout it says to wait for is the chart's Deployment.
docs/cloud/gke.md's binding names the same prefix."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shlex
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

import jsonpatch
import pytest
import yaml
from tests.docs import blocks
from tests.docs.blocks import REPO
from tests.docs.conftest import config_from_env, default_config, render

from ckptdrain.operator.admission import injection, tenant_identity
from ckptdrain.operator.policy import class_identity
from ckptdrain.operator.policy import spec as operator_policy
from ckptdrain.operator.tenant_identities import WebIdentity
from ckptdrain.store import parse_store_uri

EKS = REPO / "docs" / "cloud" / "eks.md"
GKE = REPO / "docs" / "cloud" / "gke.md"
SECTION = "## One identity per tenant"
ISSUER = "oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE"
BUCKET, URI = "my-checkpoints", "s3://my-checkpoints/llm"
AGENT_ACTIONS = ("s3:PutObject", "s3:GetObject", "s3:DeleteObject",
                 "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts")


def _section_blocks(path: Any) -> list[blocks.Block]:
    text = path.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    first, last = text[:start].count("\n") + 1, text[:end].count("\n") + 1 if end > 0 else 10**9
    return [b for b in blocks.parse(path) if first <= b.line <= last]


def _block(note: str) -> dict[str, Any]:
    found = [b for b in _section_blocks(EKS) if b.kind == "fragment" and b.note == note]
    assert len(found) == 1, f"{EKS}: one block marked {note!r}, found {len(found)}"
    return dict(json.loads(found[0].text))


def _like(pattern: str, value: str) -> bool:
    """IAM's wildcards: `*` any run, `?` one character; nothing else special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.S) is not None


def _resolved(text: str, tags: Mapping[str, str]) -> str:
    return re.sub(r"\$\{aws:PrincipalTag/([^}]+)\}", lambda m: tags[m[1]], text)


def _listed(value: Any) -> list[str]:
    return value if isinstance(value, list) else [value]


def allowed(document: Mapping[str, Any], action: str, resource: str | None = None,
            context: Mapping[str, str] | None = None,
            tags: Mapping[str, str] | None = None) -> bool:
    """Whether some Allow statement grants `action` on `resource` with
    `context` (condition keys); the page uses no Deny."""
    context, tags = context or {}, tags or {}
    for statement in document["Statement"]:
        assert statement["Effect"] == "Allow", statement
        if not any(fnmatchcase(action, a) for a in _listed(statement["Action"])):
            continue
        if resource is not None and not any(
                _like(_resolved(r, tags), resource) for r in _listed(statement["Resource"])):
            continue
        conditions = statement.get("Condition", {})
        assert set(conditions) <= {"StringEquals", "StringLike"}, conditions
        if all(key in context and any(
                (_like(_resolved(p, tags), context[key]) if op == "StringLike"
                 else _resolved(p, tags) == context[key]) for p in _listed(wanted))
               for op, pairs in conditions.items() for key, wanted in pairs.items()):
            return True
    return False


def _values() -> dict[str, WebIdentity]:
    """What the page's values give the operator."""
    found = [b for b in _section_blocks(EKS) if b.kind == "fragment" and b.note == "values"]
    assert len(found) == 1
    raw = yaml.safe_load(found[0].text)["agent"]["identities"]
    return dict(config_from_env({"CKPTDRAIN_AGENT_IDENTITIES": json.dumps(raw)}).identities)


def _key_prefix(namespace: str, policy: str = "llama", uri: str = URI) -> str:
    """Where the webhook puts a policy's objects: the agent's store prefix."""
    spec = {"selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "7B"},
            "interval": "15m", "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
            "storage": {"uri": uri}}
    prefix = operator_policy.parse(namespace, policy, spec, default_config()).store_prefix()
    parsed = parse_store_uri(prefix)
    assert parsed.bucket == BUCKET
    return parsed.prefix + "/"


def _token(namespace: str, audience: str, account: str = "ckptdrain-agent") -> dict[str, str]:
    """The claims STS checks, as the apiserver writes them in a projected token."""
    return {f"{ISSUER}:sub": f"system:serviceaccount:{namespace}:{account}",
            f"{ISSUER}:aud": audience}


def test_the_trust_policy_takes_only_its_namespaces_tokens_with_the_audience() -> None:
    trust, identity = _block("trust policy of ckptdrain-team-a"), _values()["team-a"]
    action = "sts:AssumeRoleWithWebIdentity"
    assert trust["Statement"][0]["Principal"]["Federated"].endswith(f"oidc-provider/{ISSUER}")
    assert allowed(trust, action, context=_token("team-a", identity.audience))
    assert allowed(trust, action, context=_token("team-a", identity.audience, "default"))
    assert not allowed(trust, action, context=_token("team-b", identity.audience))
    assert not allowed(trust, action, context=_token("team-a-x", identity.audience))
    assert not allowed(trust, action, context=_token("team-a", "pods.eks.amazonaws.com"))
    # The role it trusts for is the one the values map team-a to.
    assert identity.role_arn.endswith(":role/ckptdrain-team-a")


POD_IDENTITY = "permissions of one role for every tenant, with Pod Identity"
#: The URI the page gives each cluster's policies with Pod Identity.
CLUSTER_URI = f"{URI}/prod-a"


def _section_text() -> str:
    text = EKS.read_text()
    start = text.index(SECTION)
    return text[start:text.find("\n## ", start + len(SECTION))]


@pytest.mark.parametrize("note,tags,uri,expected", [
    ("permissions of ckptdrain-team-a", None, URI, "llm/team-a/llama/"),
    (POD_IDENTITY, {"eks-cluster-name": "prod-a", "kubernetes-namespace": "team-a"},
     CLUSTER_URI, "llm/prod-a/team-a/llama/"),
])
def test_the_permissions_reach_the_tenants_prefix_only(
        note: str, tags: dict[str, str] | None, uri: str, expected: str) -> None:
    document = _block(note)
    own, other = _key_prefix("team-a", uri=uri), _key_prefix("team-b", uri=uri)
    assert own == expected
    for action in AGENT_ACTIONS:
        key = f"arn:aws:s3:::{BUCKET}/{own}steps/000100/shard-0"
        assert allowed(document, action, key, tags=tags), action
        assert not allowed(document, action, f"arn:aws:s3:::{BUCKET}/{other}steps/000100/"
                                             "shard-0", tags=tags), action
    # Another policy of the same tenant: the same role.
    gpt = _key_prefix("team-a", "gpt", uri)
    assert allowed(document, "s3:GetObject", f"arn:aws:s3:::{BUCKET}/{gpt}manifest.json",
                   tags=tags)
    bucket = f"arn:aws:s3:::{BUCKET}"
    assert allowed(document, "s3:ListBucket", bucket, {"s3:prefix": own + "steps/"}, tags)
    for prefix in (other, "llm/", "", "llm/team-a-x/llama/", "llm/prod-a/team-a-x/llama/"):
        assert not allowed(document, "s3:ListBucket", bucket, {"s3:prefix": prefix}, tags), prefix
    assert not allowed(document, "s3:ListBucketMultipartUploads", bucket, tags=tags)


def test_pod_identitys_shared_role_keeps_a_same_named_namespace_of_another_cluster_out(
        ) -> None:
    document, bucket = _block(POD_IDENTITY), f"arn:aws:s3:::{BUCKET}"
    assert f"`storage.uri` ending in its name (`{CLUSTER_URI}`)" in " ".join(
        _section_text().split())
    prod_a = _key_prefix("team-a", uri=CLUSTER_URI)
    elsewhere = {"eks-cluster-name": "prod-b", "kubernetes-namespace": "team-a"}
    home = {"eks-cluster-name": "prod-a", "kubernetes-namespace": "team-a"}
    key = f"{bucket}/{prod_a}steps/000100/shard-0"
    assert allowed(document, "s3:GetObject", key, tags=home)
    for action in AGENT_ACTIONS:
        assert not allowed(document, action, key, tags=elsewhere), action
    assert not allowed(document, "s3:ListBucket", bucket, {"s3:prefix": prod_a}, elsewhere)
    # The other cluster's own team-a, under its own name.
    prod_b = _key_prefix("team-a", uri=f"{URI}/prod-b")
    assert allowed(document, "s3:PutObject", f"{bucket}/{prod_b}steps/1/shard-0",
                   tags=elsewhere)


def test_the_key_for_sse_kms_is_scoped_to_the_tenants_objects() -> None:
    document = _block("key permissions of ckptdrain-team-a, for SSE-KMS")
    key_arn = document["Statement"][0]["Resource"]
    assert re.fullmatch(r"arn:aws:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]+", key_arn)
    context = "kms:EncryptionContext:aws:s3:arn"
    own, other = _key_prefix("team-a"), _key_prefix("team-b")
    for action in ("kms:GenerateDataKey", "kms:Decrypt"):
        assert allowed(document, action, key_arn,
                       {context: f"arn:aws:s3:::{BUCKET}/{own}steps/000100/shard-0"}), action
        assert not allowed(document, action, key_arn,
                           {context: f"arn:aws:s3:::{BUCKET}/{other}steps/000100/shard-0"})
        # With S3 Bucket Keys the context is the bucket: no tenant's, as the page says.
        assert not allowed(document, action, key_arn, {context: f"arn:aws:s3:::{BUCKET}"})
        assert not allowed(document, action, key_arn)  # no context, no key


def test_the_trainer_access_fragment_gives_the_trainer_the_namespaces_role() -> None:
    found = [b for b in _section_blocks(EKS) if b.kind == "fragment" and b.note == "policy"]
    assert len(found) == 1
    spec = {"selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "7B"},
            "interval": "15m", "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
            "storage": {"uri": URI, **yaml.safe_load(found[0].text)["storage"]}}
    cfg = dataclasses.replace(default_config(), identities=tuple(_values().items()))
    pod = {"metadata": {"name": "w", "namespace": "team-a", "labels": {"app": "t"}},
           "spec": {"containers": [{"name": "trainer", "image": "t:1"}]}}
    for namespace, expected in (("team-a", _values()["team-a"].role_arn), ("team-x", None)):
        p = operator_policy.parse(namespace, "llama", spec, cfg)
        assert p.trainer_access
        out = jsonpatch.apply_patch(copy.deepcopy(pod), injection.build_pod_patch(
            pod, p, cfg, default_rate=1e9))
        trainer = out["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in trainer.get("env") or []}
        assert env.get("AWS_ROLE_ARN") == expected, namespace
        assert (tenant_identity.mount() in trainer["volumeMounts"]) == (expected is not None)


def test_the_rollout_to_wait_for_is_the_charts_deployment() -> None:
    text = " ".join(_section_text().split())
    named = re.search(r"`kubectl rollout status deployment/([a-z0-9-]+) -n ([a-z0-9-]+)`", text)
    assert named, "the page names the rollout to wait for"
    deployments = [d for d in render([]) if d["kind"] == "Deployment"]
    assert [d["metadata"]["name"] for d in deployments] == [named[1]]
    assert "-n ckptdrain" in (REPO / "docs" / "install.md").read_text()
    assert named[2] == "ckptdrain"


def test_the_gke_binding_names_the_namespace_and_its_prefix() -> None:
    block = next(b for b in _section_blocks(GKE) if "add-iam-policy-binding" in b.text)
    words = shlex.split(block.text.replace("\\\n", " "))
    member = next(w.split("=", 1)[1] for w in words if w.startswith("--member="))
    condition = next(w.split("=", 1)[1] for w in words if w.startswith("--condition="))
    assert re.fullmatch(r"principalSet://iam\.googleapis\.com/projects/PROJECT_NUMBER/locations/"
                        r"global/workloadIdentityPools/my-project\.svc\.id\.goog/namespace/"
                        r"team-a", member)
    spec = {"selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "7B"},
            "interval": "15m", "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
            "storage": {"uri": "gs://my-gcs-bucket/checkpoints"}}
    prefix = parse_store_uri(operator_policy.parse(
        "team-a", "llama", spec, default_config()).store_prefix()).prefix
    named = re.search(r'startsWith\("projects/_/buckets/([^/]+)/objects/([^"]*)"\)', condition)
    assert named and named[1] == "my-gcs-bucket" and named[2] == "checkpoints/team-a/"
    assert (prefix + "/").startswith(named[2])


GSA_SECTION = "## One Google service account per tenant"


def test_the_gke_account_bindings_name_the_classs_account_for_the_namespace() -> None:
    text = GKE.read_text()
    start = text.index(GSA_SECTION)
    first, last = text[:start].count("\n") + 1, text[:text.find("\n## ", start + 1)].count("\n")
    [block] = [b for b in blocks.parse(GKE) if first <= b.line <= last and b.lang == "sh"]
    commands = [shlex.split(line) for line in block.text.replace("\\\n", " ").splitlines()
                if line.strip()]
    # The account the class of docs/checkpoint-classes.md makes for team-a.
    page = (REPO / "docs" / "checkpoint-classes.md").read_text()
    template = re.search(r"googleServiceAccount: (\S+)", page)
    assert template
    account, problem = class_identity.google_for_namespace(template[1], "team-a", "example")
    assert problem is None and account is not None
    create, minting, bucket = commands
    assert create[:4] == ["gcloud", "iam", "service-accounts", "create"]
    assert f"{create[4]}@my-project.iam.gserviceaccount.com" == account
    options = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in minting if "=" in w}
    assert minting[4] == account
    assert options["--role"] == "roles/iam.serviceAccountTokenCreator"
    assert options["--member"].endswith("/my-project.svc.id.goog/namespace/team-a")
    options = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in bucket if "=" in w}
    assert options["--member"] == f"serviceAccount:{account}"
    spec = {"selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "7B"},
            "interval": "15m", "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
            "storage": {"uri": "gs://my-gcs-bucket/checkpoints"}}
    prefix = parse_store_uri(operator_policy.parse(
        "team-a", "llama", spec, default_config()).store_prefix()).prefix
    named = re.search(r'startsWith\("projects/_/buckets/([^/]+)/objects/([^"]*)"\)',
                      options["--condition"])
    assert named and named[1] == "my-gcs-bucket" and (prefix + "/").startswith(named[2])
    assert named[2] == "checkpoints/team-a/"
    # What the page says a refused exchange reports is what gcs_auth says.
    assert "roles/iam.serviceAccountTokenCreator" in text[start:]
    # ... and the scope IAM Credentials asks of the pod's own token.
    assert "cloud-platform" in text[start:] and "access scopes" in text[start:]


def test_gke_token_creator_is_granted_only_to_the_tenants_own_principal() -> None:
    # TokenCreator on a tenant's account lets its holder mint that tenant's
    # tokens: the page must say the holder belongs to that namespace alone.
    text = GKE.read_text()
    paragraph = text[text.index("**Warning:** whoever holds"):].split("\n\n")[0]
    assert "roles/iam.serviceAccountTokenCreator" in paragraph
    assert "principalSet" in paragraph and "no other" in paragraph
