"""docs/checkpoint-classes.md's example does what the page says: the
class is the default, the policy naming no class gets it, its path is
under the class's root (and would be refused under the operator's own),
and the endpoint it leaves unset comes from the class's store. The
apiserver's dry run of the same objects is test_examples.py's. The
Tenancy example's class allows the namespace it shows and refuses
another, naming the label it lacks (tests/cluster/test_class_tenancy.py
applies it to a real apiserver with the operator running). The Store
identity example's policy, without a Secret, is admitted at the store its
class vouches for, and its pods' restore and agent get its namespace's
role. The Placement example's class puts its pods on the nodes the
chart's driver values shown beside it run on, and refuses a pod asking
for others, by nodeSelector or by the node affinity the page names
(tests/cluster/test_class_placement.py applies it to a real
apiserver with the operator running). The Node data example's classes
reclaim as the page says. The Bandwidth example's class caps its policies
as the page's figures say, and their status says it in the page's words.
The Google service account example's policy gets its namespace's account
in restore and the agent alone, and a namespace too long for the account
id is refused as the page says; the credentials Secret example's policy
gets the Secret shown beside it, its keys the ones the class names."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import jsonpatch
import pytest
import yaml
from tests.docs import blocks
from tests.docs.blocks import REPO
from tests.docs.conftest import (
    class_identity,
    classed_policy_problems,
    default_config,
    policy_problems,
    stored,
)

from ckptdrain.contract.env import Env
from ckptdrain.csi import class_reclaim
from ckptdrain.csi.collection import DELETE, RETAIN, Reclaim, effective
from ckptdrain.operator.admission import injection
from ckptdrain.operator.policy import allocation, class_catalogue, class_placement, classes
from ckptdrain.operator.policy import spec as operator_policy
from ckptdrain.operator.policy import status as policy_status
from ckptdrain.sizing import SizingInput

PAGE = REPO / "docs" / "checkpoint-classes.md"


def _objects(section: int = 0) -> list[dict[str, Any]]:
    """The objects of the page's `section`th YAML block: 0 the Example, 1 Store
    identity's, 2 Tenancy's, 3 Placement's, 4 Node data's, 5 Bandwidth's,
    6 Google service account's, 7 credentials Secret's."""
    found = [b for b in blocks.parse(PAGE) if b.lang == "yaml" and b.kind == ""]
    assert len(found) == 8, [b.line for b in found]
    return [d for d in yaml.safe_load_all(found[section].text) if d]


def _example() -> tuple[dict[str, Any], dict[str, Any]]:
    objects = _objects()
    [cls] = [o for o in objects if o["kind"] == "CheckpointClass"]
    [written] = [o for o in objects if o["kind"] == "CheckpointPolicy"]
    return cls, stored(written)


def test_the_example_policy_gets_the_default_class_and_its_store_settings() -> None:
    cls, policy = _example()
    assert cls["metadata"]["annotations"]["ckptdrain.io/is-default-class"] == "true"
    assert "checkpointClassName" not in policy["spec"]
    name, filled, problems = classed_policy_problems(
        policy["metadata"]["namespace"], policy["spec"], [cls], default_config(),
        policy["metadata"]["name"])
    assert (name, problems) == ("nvme-minio", [])
    assert filled["storage"]["endpoint"] == cls["spec"]["stores"][0]["endpoint"]
    assert filled["storage"]["addressingStyle"] == "path"
    # Without the class the operator's own root refuses the same path.
    assert any("localTier.path" in p for p in policy_problems(policy["spec"], default_config()))


def test_the_example_class_refuses_a_store_of_another_namespace() -> None:
    cls, policy = _example()
    other = copy.deepcopy(policy["spec"])
    other["storage"]["uri"] = "s3://checkpoints/ml-team-b/llama"
    _, _, problems = classed_policy_problems(policy["metadata"]["namespace"], other, [cls],
                                             default_config())
    assert problems and problems[0].startswith("spec.storage.uri:")
    assert "CheckpointClass nvme-minio" in problems[0]


def test_the_tenancy_class_allows_its_namespace_and_refuses_another() -> None:
    objects = _objects(2)
    [namespace] = [o for o in objects if o["kind"] == "Namespace"]
    [cls] = [o for o in objects if o["kind"] == "CheckpointClass"]
    _, written = _example()
    spec = {**copy.deepcopy(written["spec"]), "checkpointClassName": cls["metadata"]["name"]}
    spec["storage"]["uri"] = "s3://team-a-checkpoints/ml-team-a/llama"
    labels = namespace["metadata"]["labels"]
    _, _, problems = classed_policy_problems("ml-team-a", spec, [cls], default_config(),
                                             labels=labels)
    assert problems == []
    spec["storage"]["uri"] = "s3://team-a-checkpoints/ml-team-b/llama"
    _, _, problems = classed_policy_problems("ml-team-b", spec, [cls], default_config(),
                                             labels={"example.com/tenant": "team-b"})
    assert len(problems) == 1 and problems[0].startswith("spec.checkpointClassName:")
    assert "ml-team-b lacks example.com/tenant=team-a" in problems[0]


def test_the_identity_example_admits_a_policy_without_a_secret_and_gives_its_role() -> None:
    objects = _objects(1)
    [cls] = [o for o in objects if o["kind"] == "CheckpointClass"]
    [policy] = [stored(o) for o in objects if o["kind"] == "CheckpointPolicy"]
    namespace = policy["metadata"]["namespace"]
    assert "credentialsSecretRef" not in policy["spec"]["storage"]
    _, filled, problems = classed_policy_problems(namespace, policy["spec"], [cls],
                                                  default_config(), policy["metadata"]["name"])
    assert problems == []
    assert filled["storage"]["endpoint"] == cls["spec"]["stores"][0]["endpoint"]
    assert class_identity(namespace, policy["spec"], [cls]) == \
        "arn:aws:iam::111122223333:role/ckpt-ml-team-a"
    # The same class without ambientIdentity refuses it, naming the field.
    unvouched = copy.deepcopy(cls)
    del unvouched["spec"]["stores"][0]["ambientIdentity"]
    _, _, problems = classed_policy_problems(namespace, policy["spec"], [unvouched],
                                             default_config())
    assert len(problems) == 1 and problems[0].startswith("spec.storage.endpoint:")
    assert "spec.stores[].ambientIdentity" in problems[0]


def test_every_example_store_is_https_with_a_fully_qualified_name() -> None:
    # What the page tells platforms to vouch for: a short name resolves
    # through the tenant's own namespace first, http sends the token in clear.
    for section in range(4):
        for cls in (o for o in _objects(section) if o["kind"] == "CheckpointClass"):
            for store in cls["spec"].get("stores", []):
                endpoint = urlsplit(store["endpoint"])
                assert endpoint.scheme == "https", store
                assert (endpoint.hostname or "").endswith(".svc.cluster.local"), store
    page = " ".join(PAGE.read_text().split())
    assert "the chart's `agent.identities` role for the namespace" in page
    assert "fully qualified name" in page and "discouraged" in page


def test_the_placement_class_matches_the_driver_values_and_places_a_pod() -> None:
    [cls] = _objects(3)
    tier = cls["spec"]["nodeTier"]
    [values] = [yaml.safe_load(b.text) for b in blocks.parse(PAGE)
                if b.kind == "fragment" and b.note == "values"]
    # The same nodes; of the driver's tolerations only the pool's own,
    # each by key (the driver also stays on unreachable nodes; pods must not).
    assert values["csiDriver"]["nodeSelector"] == tier["nodeSelector"]
    assert all(t in values["csiDriver"]["tolerations"] for t in tier["tolerations"])
    assert len(tier["tolerations"]) < len(values["csiDriver"]["tolerations"])
    assert all(t.get("key") for t in tier["tolerations"])
    page = " ".join(PAGE.read_text().split())
    assert "a subset of what the driver tolerates, never a copy of `csiDriver.tolerations`" \
        in page
    [read] = classes.catalogue([cls]).values()
    assert isinstance(read, classes.CheckpointClass)
    assert class_placement.selector_additions({"nodeSelector": {"gpu": "h100"}},
                                              read.placement) == tier["nodeSelector"]
    assert class_placement.tolerations_to_add([], read.placement.tolerations) == \
        tier["tolerations"]
    [key] = tier["nodeSelector"]
    [conflict] = class_placement.conflicts({"nodeSelector": {key: "hdd"}}, read.placement,
                                           "nvme-pool")
    assert conflict.field == f"spec.nodeSelector.{key}"

    # The page's requirements a pod's own node affinity is refused for,
    # each alone in its term; one the class's nodes may meet is not.
    assert "`example.com/pool In [hdd]`, `NotIn [nvme]` or `DoesNotExist`" in page
    for requirement in ({"operator": "In", "values": ["hdd"]},
                        {"operator": "NotIn", "values": ["nvme"]}, {"operator": "DoesNotExist"},
                        {"operator": "Gt", "values": ["3"]}):
        [problem] = class_placement.conflicts(_affine({"key": key, **requirement}),
                                              read.placement, "nvme-pool")
        assert problem.field.endswith(".nodeSelectorTerms[0].matchExpressions[0]")
    assert class_placement.conflicts(_affine({"key": key, "operator": "In", "values": [
        "hdd", "nvme"]}), read.placement, "nvme-pool") == []


def _affine(requirement: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [requirement]}]}}}}


def test_the_node_data_classes_reclaim_as_the_page_says() -> None:
    """Research: Delete after an hour; production: Retain, its grace the
    driver's (the chart's csiDriver.reclaim)."""
    driver = Reclaim(DELETE, 600.0)
    read = {d["metadata"]["name"]: class_reclaim.from_class(d["metadata"]["name"], d["spec"])
            for d in _objects(4)}
    assert effective(read["research"], driver) == (Reclaim(DELETE, 3600.0), "class research")
    assert effective(read["production"], driver) == (Reclaim(RETAIN, 600.0), "class production")


def test_the_bandwidth_class_caps_its_policies_as_the_page_says() -> None:
    """Two batch policies wanting 30 GB/s each, another wanting 100 GB/s,
    a cluster cap of 100 GB/s: 20, 20 and 60, and batch's statuses give
    the page's message."""
    [cls] = _objects(5)
    catalogue = {cls["metadata"]["name"]: classes.read(cls)}
    bodies = {key: {"spec": {"checkpointClassName": "batch"}} for key in ("a", "b")}
    caps = class_catalogue.caps(bodies, catalogue)  # type: ignore[arg-type]

    def wanting(gbps: float) -> SizingInput:  # 10% overlap of a 15 min interval
        return SizingInput(checkpoint_bytes=gbps * 90e9, interval_s=900, overlap=0.1)

    joint = allocation.joint_sizing({"a": wanting(30), "b": wanting(30), "other": wanting(100)},
                                    100e9, classes=caps)  # type: ignore[arg-type]
    assert {k: s.allowed_bandwidth for k, (s, _) in joint.items()} == {
        "a": pytest.approx(20e9), "b": pytest.approx(20e9), "other": pytest.approx(60e9)}
    without = allocation.joint_sizing({"a": wanting(30), "b": wanting(30),
                                       "other": wanting(100)}, 100e9)
    assert without["other"][0].allowed_bandwidth == pytest.approx(40e9)
    sized, share = joint["a"]
    written = policy_status.for_sizing(sized, 1, datetime.now(UTC), cluster=share)
    [said] = [c for c in written["conditions"] if c["type"] == "BandwidthConstrained"]
    assert said["reason"] == "ClassCap"
    assert f"`{said['message']}`" in " ".join(PAGE.read_text().split())


def _resolved_example(section: int, namespace: str | None = None
                      ) -> tuple[dict[str, Any], dict[str, Any], classes.Resolution]:
    objects = _objects(section)
    [cls] = [o for o in objects if o["kind"] == "CheckpointClass"]
    [policy] = [stored(o) for o in objects if o["kind"] == "CheckpointPolicy"]
    namespace = namespace or policy["metadata"]["namespace"]
    resolution = classes.resolve(namespace, policy["spec"], default_config(),
                                 classes.catalogue([cls]))
    return cls, policy, resolution


def test_the_google_example_gives_restore_and_the_agent_the_namespaces_account() -> None:
    _, policy, resolution = _resolved_example(6)
    assert resolution.resolved, resolution.problems
    namespace = policy["metadata"]["namespace"]
    parsed = operator_policy.parse(namespace, policy["metadata"]["name"], resolution.spec,
                                   resolution.config)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "w-0", "namespace": namespace, "labels": {"app": "llama"}},
           "spec": {"containers": [{"name": "trainer", "image": "t:1"}]}}
    patched = jsonpatch.apply_patch(copy.deepcopy(pod), injection.build_pod_patch(
        pod, parsed, resolution.config, default_rate=1e9, rank=0))
    given = {c["name"]: {e["name"]: e.get("value") for e in c.get("env") or []}
             for c in patched["spec"]["initContainers"] + patched["spec"]["containers"]}
    name = Env.GOOGLE_SERVICE_ACCOUNT.value
    assert {c for c, env in given.items() if name in env} == {injection.RESTORE,
                                                              injection.AGENT}
    # The account the page says, which docs/cloud/gke.md's bindings name.
    page = PAGE.read_text()
    assert f"`{given[injection.AGENT][name]}`" in page
    assert given[injection.AGENT][name] == "ckpt-ml-team-a@my-project.iam.gserviceaccount.com"


def test_the_google_example_refuses_a_namespace_too_long_for_an_account_id() -> None:
    objects = _objects(6)
    [cls] = [o for o in objects if o["kind"] == "CheckpointClass"]
    [policy] = [stored(o) for o in objects if o["kind"] == "CheckpointPolicy"]

    def resolved(namespace: str) -> classes.Resolution:
        spec = copy.deepcopy(policy["spec"])
        spec["storage"]["uri"] = f"gs://checkpoints/{namespace}/llama"
        return classes.resolve(namespace, spec, default_config(), classes.catalogue([cls]))

    fits = "ml-team-research-vision-a"  # ckpt- and 25: 30 characters, Google's most
    assert resolved(fits).resolved, resolved(fits).problems
    too_long = fits + "b"
    refused = resolved(too_long)
    assert refused.reason == classes.REFUSED
    [problem] = refused.problems
    assert problem.field == "spec.identity.googleServiceAccount"
    said = str(problem)
    assert f"namespace {too_long}" in said and "CheckpointClass gcs-per-namespace" in said
    assert f"ckpt-{too_long}@my-project.iam.gserviceaccount.com" in said
    assert "`RefusedByClass`" in PAGE.read_text()


def test_the_secret_example_fills_the_policy_with_the_secret_beside_it() -> None:
    objects = _objects(7)
    [secret] = [o for o in objects if o["kind"] == "Secret"]
    cls, policy, resolution = _resolved_example(7)
    assert resolution.resolved, resolution.problems
    assert "credentialsSecretRef" not in policy["spec"]["storage"]
    parsed = operator_policy.parse(policy["metadata"]["namespace"], "llama", resolution.spec,
                                   resolution.config)
    ref = parsed.credentials
    assert ref is not None and ref.name == secret["metadata"]["name"]
    assert secret["metadata"]["namespace"] == policy["metadata"]["namespace"]
    assert {ref.access_key_id_key, ref.secret_access_key_key} == set(secret["stringData"])
    assert ref.access_key_id_key == cls["spec"]["credentialsSecretRef"]["accessKeyIdKey"]
    # The policy's own Secret would win (the page's list, first item).
    own = copy.deepcopy(policy["spec"])
    own["storage"]["credentialsSecretRef"] = {"name": "own"}
    again = classes.resolve("ml-team-a", own, default_config(), classes.catalogue([cls]))
    assert again.spec["storage"]["credentialsSecretRef"] == {"name": "own"}
