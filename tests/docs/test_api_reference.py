"""docs/api.md is what tests/docs/api_reference.py writes from crds/, and
every CheckpointPolicy spec field has an owner (platform or tenant) there."""

from __future__ import annotations

import copy
from typing import Any

from tests.docs import api_reference as api
from tests.docs.blocks import REPO


def _policy_crd() -> dict[str, Any]:
    return copy.deepcopy(api.load()[0])


def test_docs_api_md_is_current() -> None:
    want = api.render(api.load())
    have = api.OUTPUT.read_text() if api.OUTPUT.exists() else ""
    assert have == want, (f"docs/api.md differs from the CRDs in crds/; regenerate it with "
                          f"{api.REGENERATE}")


def test_every_policy_field_has_an_owner() -> None:
    crd = _policy_crd()
    assert crd["spec"]["names"]["kind"] == "CheckpointPolicy"
    assert api.unowned(crd) == [], (
        "CheckpointPolicy fields with no owner: add each to OWNERS in "
        "tests/docs/api_reference.py (platform or tenant)")
    assert api.stale(crd) == [], "OWNERS entries that name no field of the CRD"


def test_a_new_field_without_an_owner_is_named() -> None:
    crd = _policy_crd()
    spec = api._spec(crd)
    spec["properties"]["brandNew"] = {"type": "string"}
    spec["properties"]["storage"]["properties"]["newKnob"] = {"type": "integer"}
    # Below a ".*" entry a field is covered: its subtree was decided whole.
    spec["properties"]["caps"]["properties"]["newCap"] = {"type": "string"}
    assert api.unowned(crd) == ["spec.storage.newKnob", "spec.brandNew"]
    assert "**unowned**" in api.render([crd])


def test_a_renamed_field_leaves_a_stale_owner_entry() -> None:
    crd = _policy_crd()
    for version in crd["spec"]["versions"]:
        spec = api._spec(crd, version["name"])
        spec["properties"]["overlapRatio"] = spec["properties"].pop("overlap")
    assert "spec.overlap" in api.stale(crd)
    assert "spec.overlapRatio" in api.unowned(crd)


def test_status_fields_are_listed_as_the_crd_has_them() -> None:
    """Fields added to the status appear without a change here."""
    crd = _policy_crd()
    status = api._schema(crd)["properties"]["status"]
    status["properties"]["somethingNew"] = {
        "type": "object", "description": "A field added later.",
        "properties": {"count": {"type": "integer", "minimum": 0}}}
    text = api.render([crd])
    assert "| `status.somethingNew` | object | A field added later. |" in text
    assert "| `status.somethingNew.count` | integer; ≥ 0 |  |" in text


def test_the_reference_shows_types_defaults_owners_and_rules() -> None:
    text = api.OUTPUT.read_text()
    v1beta1, v1alpha1 = text.split("### ckptdrain.io/v1alpha1")
    assert ("| `spec.overlap` | string; at most 256 characters; pattern "
            "`^([0-9]+(\\.[0-9]+)?)%$` | `10%` | tenant |") in v1beta1
    assert ("| `spec.overlap` | string; at most 256 characters; pattern "
            "`^([0-9]+(\\.[0-9]*)?\\|\\.[0-9]+)%?$` | `10%` | tenant |") in v1alpha1
    assert "| `spec.caps.bandwidth` | integer or string; ≥ 0; pattern" in v1beta1
    assert "| `spec.localTier.path` (required within `spec.localTier`) | string;" in text
    assert "| `spec.selector` (required) | object" in text
    assert ("| `spec.placement.nodeAffinity.matchExpressions[].key` (required within "
            "`spec.placement.nodeAffinity.matchExpressions[]`) |") in text
    assert "| platform | Node-local (NVMe) directory" in text
    assert "spec.identity: set exactly one of rankLabel or rankAnnotation" in text
    # A rule's `self` is where it is declared, not the field its refusal names.
    assert ("| `spec.storage.encryption.kmsKeyId` | `spec.storage.encryption` | "
            "`!has(self.kmsKeyId) || self.type == 'SSE-KMS'` |").replace("||", "\\|\\|") in text
    # The phases the operator's phase() can answer, most urgent first.
    from ckptdrain.operator.policy.status import PHASES
    assert "Phases: " + ", ".join(f"`{p}`" for p in PHASES) + "." in text
    kinds = [line for line in text.splitlines() if line.startswith("## ")]
    assert kinds == ["## CheckpointPolicy", "## CheckpointClass", "## Checkpoint",
                     "## CheckpointShare"]
    # The class is the platform team's to write, the records the operator's.
    assert "Written by the platform team" in text.split("## CheckpointClass")[1].split(
        "## Checkpoint\n")[0]


def test_the_reference_is_linked() -> None:
    assert "`docs/api.md`" in (REPO / "README.md").read_text()
    assert "(api.md)" in (REPO / "docs" / "operator.md").read_text()


def test_the_preferred_and_stored_version_is_documented_first_the_older_after() -> None:
    """Both versions are served: v1beta1, the preferred (what kubectl shows
    and what to write) and stored, comes first; v1alpha1 follows with the
    spellings it has of its own."""
    crd = _policy_crd()
    text = api.render([crd])
    head, older = text.split("### ckptdrain.io/v1alpha1")
    assert ("`ckptdrain.io/v1beta1` (write this, stored), namespaced; `kubectl get "
            "checkpointpolicies` (short: `ckpol`); also served: `ckptdrain.io/v1alpha1`, "
            "below.") in head
    assert "`ckptdrain.io/v1alpha1` is served too" in older
    for f in api.fields(api._spec(crd, "v1beta1"), "spec"):
        assert f"| `{f.path}`" in head, f.path
    # Each version's own spellings, each once, under its heading.
    assert "| `spec.model.parameters` | integer or string;" in head
    assert "| `spec.model.parameters` | string; at most 256 characters;" in older
    assert "| `status.goodput.heldSince` | string; format date-time; nullable |" in head
    assert "spec.model: set parameters (e.g. 405G)" in head
    assert "| `spec.storage.uri`" not in older  # the same in both: documented once


def test_a_version_defined_but_not_served_follows_as_staged() -> None:
    """How 0.1.0 documented v1beta1 before serving it: the generator still
    says so for a version defined ahead of its release."""
    crd = _policy_crd()
    alpha, beta = sorted(crd["spec"]["versions"], key=lambda v: v["name"])
    beta["served"] = beta["storage"] = False
    alpha["storage"] = True
    head, staged = api.render([crd]).split("### ckptdrain.io/v1beta1")
    assert ("`ckptdrain.io/v1alpha1` (write this, stored), namespaced; `kubectl get "
            "checkpointpolicies` (short: `ckpol`); defined, served from the next release: "
            "`ckptdrain.io/v1beta1`, below.") in head
    assert "`ckptdrain.io/v1beta1` is defined, served from the next release" in staged


def test_a_change_to_v1alpha1_alone_shows_in_its_section() -> None:
    crd = _policy_crd()
    storage = api._spec(crd, "v1alpha1")["properties"]["storage"]
    storage["properties"]["keep"]["default"] = 4
    storage["x-kubernetes-validations"].append({"rule": "self.keep > 1",
                                                "message": "spec.storage.keep: above 1"})
    head, older = api.render([crd]).split("### ckptdrain.io/v1alpha1")
    assert "| `spec.storage.keep` | integer; ≥ 1 | `4` | tenant |" in older
    assert "spec.storage.keep: above 1" in older
    # ...and v1beta1, unchanged, keeps its own above.
    assert "| `spec.storage.keep` | integer; ≥ 1 | `3` | tenant |" in head
