"""docs/api.md, generated from the CRDs in crds/: every field of each kind,
its type, default, who sets it and its description, the rules the apiserver
enforces (x-kubernetes-validations) and the status the operator writes. A
kind with several versions is written out in its preferred served one (the
highest served by Kubernetes' version priority, what to write); each other
version, served or defined for the next release, follows with the fields
and rules it states differently.

    python -m tests.docs.api_reference     # or: make api-docs

Who sets a CheckpointPolicy field, the platform team or the tenant, is
decided once, in `OWNERS` below; tests/docs/test_api_reference.py fails
when a field has no entry there (a new field forces the decision) and when
docs/api.md is not what this module writes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from tests.docs.crd_versions import defined_only, listed, versions
from tests.docs.schema_cells import cell, code, default_cell, table, type_of

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"
OUTPUT = REPO / "docs" / "api.md"
GROUP = "ckptdrain.io"
#: The kind people write first; the others follow in file order.
FIRST = "CheckpointPolicy"
REGENERATE = "make api-docs (python -m tests.docs.api_reference)"

PLATFORM, TENANT = "platform", "tenant"
#: Who sets each CheckpointPolicy spec field: the platform team (the node
#: tier, placement, the store's endpoint, identity and encryption, caps,
#: injected resources) or the tenant (the model, intervals, overlap, the
#: selector, retention, restore). A key ending in ".*" covers every field
#: below it; any other key covers that field alone.
OWNERS: dict[str, str] = {
    "spec.selector": TENANT, "spec.selector.*": TENANT,
    # Picked by the tenant among the platform's classes, as a PVC names a
    # StorageClass; what the class decides is the platform's.
    "spec.checkpointClassName": TENANT,
    "spec.model": TENANT, "spec.model.*": TENANT,
    "spec.interval": TENANT, "spec.mtti": TENANT, "spec.localWriteTime": TENANT,
    "spec.globalEvery": TENANT, "spec.overlap": TENANT,
    "spec.writers": TENANT, "spec.readers": TENANT,
    "spec.identity": TENANT, "spec.identity.*": TENANT,
    "spec.localTier": PLATFORM,
    "spec.localTier.path": PLATFORM,
    "spec.localTier.keep": TENANT,
    "spec.localTier.capacity": PLATFORM,
    # A memory-backed emptyDir in the tenant's own pod, counted in its memory.
    "spec.localTier.memory": TENANT, "spec.localTier.memory.*": TENANT,
    "spec.peerTier": PLATFORM,
    "spec.peerTier.enabled": PLATFORM,
    "spec.peerTier.keep": TENANT,
    "spec.peerTier.capacity": PLATFORM,
    "spec.storage": PLATFORM,
    # The bucket and its access are the platform's; the tenant's prefix
    # follows from the policy's namespace and name.
    "spec.storage.uri": PLATFORM,
    "spec.storage.endpoint": PLATFORM, "spec.storage.region": PLATFORM,
    "spec.storage.keep": TENANT,
    "spec.storage.encryption": PLATFORM, "spec.storage.encryption.*": PLATFORM,
    "spec.storage.caBundle": PLATFORM, "spec.storage.caBundle.*": PLATFORM,
    "spec.storage.addressingStyle": PLATFORM,
    "spec.storage.coldStorage": PLATFORM, "spec.storage.coldStorage.*": PLATFORM,
    "spec.storage.credentialsSecretRef": PLATFORM,
    # The namespace's role reaches the tenant's own prefix alone: whether
    # its trainer may use it is the tenant's call.
    "spec.storage.trainerAccess": TENANT,
    "spec.storage.credentialsSecretRef.*": PLATFORM,
    "spec.caps": PLATFORM, "spec.caps.*": PLATFORM,
    "spec.triggers": TENANT, "spec.triggers.*": TENANT,
    "spec.restore": TENANT, "spec.restore.*": TENANT,
    "spec.drain": PLATFORM, "spec.drain.*": PLATFORM,
    "spec.placement": PLATFORM, "spec.placement.*": PLATFORM,
    "spec.resources": PLATFORM, "spec.resources.*": PLATFORM,
    "spec.gracePolicy": TENANT,
    "spec.relocation": TENANT, "spec.relocation.*": TENANT,
}


@dataclass(frozen=True)
class Field:
    path: str  # e.g. spec.storage.uri, spec.placement.tolerations[].key
    schema: Mapping[str, Any]
    required: bool
    parent: str  # the object it belongs to, e.g. spec.storage ("" for the root's)


@dataclass(frozen=True)
class Rule:
    target: str  # the field a refusal names: declared_on plus the rule's fieldPath
    declared_on: str  # the field the rule is declared on, its `self` ("" for the object)
    rule: str
    message: str  # for a table cell (a messageExpression as code)


def fields(schema: Mapping[str, Any], prefix: str) -> Iterator[Field]:
    """Every field below `schema`, depth first in the CRD's order: list items
    as `path[]`, map values as `path.<key>`."""
    required = set(schema.get("required") or [])
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        yield Field(path, sub, name in required, prefix)
        yield from _below(sub, path)


def _below(schema: Mapping[str, Any], path: str) -> Iterator[Field]:
    if schema.get("type") == "array" and isinstance(schema.get("items"), Mapping):
        items = schema["items"]
        if items.get("properties"):
            yield from fields(items, f"{path}[]")
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping) and extra.get("properties"):
        yield from fields(extra, f"{path}.<key>")
    if schema.get("properties"):
        yield from fields(schema, path)


def rules(schema: Mapping[str, Any], path: str = "") -> Iterator[Rule]:
    """Every x-kubernetes-validations rule, with the field it is declared on."""
    for r in schema.get("x-kubernetes-validations") or []:
        message = (cell(r["message"]) if r.get("message")
                   else "computed: " + code(r.get("messageExpression", "")))
        yield Rule(path + (r.get("fieldPath") or ""), path, r["rule"], message)
    for name, sub in (schema.get("properties") or {}).items():
        yield from rules(sub, f"{path}.{name}" if path else name)
    for key, suffix in (("items", "[]"), ("additionalProperties", ".<key>")):
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            yield from rules(sub, path + suffix)


def owner(path: str, owners: Mapping[str, str] = OWNERS) -> str | None:
    """Who sets a spec field: its own entry, or the nearest ancestor's ".*"."""
    if path in owners:
        return owners[path]
    parts = re.sub(r"\[\]", "", path).split(".")
    for n in range(len(parts) - 1, 0, -1):
        found = owners.get(".".join(parts[:n]) + ".*")
        if found is not None:
            return found
    return None


def _spec_paths(crd: Mapping[str, Any]) -> list[str]:
    """The spec fields of every version, each once, the preferred version's first."""
    found = [f.path for v in listed(crd) for f in fields(_spec(crd, v["name"]), "spec")]
    return list(dict.fromkeys(found))


def unowned(crd: Mapping[str, Any], owners: Mapping[str, str] = OWNERS) -> list[str]:
    """The spec fields of a CheckpointPolicy CRD with no entry in `owners`."""
    return [path for path in _spec_paths(crd) if owner(path, owners) is None]


def stale(crd: Mapping[str, Any], owners: Mapping[str, str] = OWNERS) -> list[str]:
    """Entries of `owners` that name no field of any version (renamed or removed)."""
    paths = {re.sub(r"\[\]", "", path) for path in _spec_paths(crd)}
    return [k for k in owners if k.removesuffix(".*") not in paths]


def _version(crd: Mapping[str, Any], name: str | None) -> Mapping[str, Any]:
    if name is None:
        return versions(crd)[0]
    return next(v for v in crd["spec"]["versions"] if v["name"] == name)


def _spec(crd: Mapping[str, Any], version: str | None = None) -> Mapping[str, Any]:
    return _schema(crd, version)["properties"]["spec"]


def _schema(crd: Mapping[str, Any], version: str | None = None) -> Mapping[str, Any]:
    """The schema of `version` (default: the preferred one)."""
    return _version(crd, version)["schema"]["openAPIV3Schema"]


def _path_cell(f: Field) -> str:
    """The path, and whether it is required: of the object itself (a field of
    spec or status), or only once its parent object is given."""
    if not f.required:
        return code(f.path)
    if "." not in f.parent and not f.parent.endswith("[]"):
        return code(f.path) + " (required)"
    return code(f.path) + f" (required within {code(f.parent)})"


def _api_version(crd: Mapping[str, Any], version: Mapping[str, Any]) -> str:
    """`group/version`, and with several versions which one to write and
    which one the apiserver stores."""
    notes = [note for note, yes in (("write this", version is versions(crd)[0]),
                                    ("stored", version.get("storage"))) if yes]
    return f"`{crd['spec']['group']}/{version['name']}`" + (
        f" ({', '.join(notes)})" if len(listed(crd)) > 1 and notes else "")


def _kind_header(crd: Mapping[str, Any]) -> list[str]:
    names, (version, *others) = crd["spec"]["names"], versions(crd)
    short = ", ".join(code(s) for s in names.get("shortNames") or [])
    staged = defined_only(crd)
    also = ("; also served: " + ", ".join(_api_version(crd, v) for v in others) +
            ", below" if others else "") + (
        "; defined, served from the next release: " +
        ", ".join(_api_version(crd, v) for v in staged) + ", below" if staged else "")
    lines = [f"## {names['kind']}", "",
             f"{_api_version(crd, version)}, {crd['spec']['scope'].lower()}; "
             f"`kubectl get {names['plural']}`" + (f" (short: {short})" if short else "") +
             also + ".", ""]
    description = _schema(crd).get("description")
    if description:
        lines += [cell(description), ""]
    return lines


def _rules_section(crd: Mapping[str, Any]) -> list[str]:
    found = list(rules(_schema(crd)))
    if not found:
        return []
    return ["### Rules the apiserver enforces", "",
            "Checked by the apiserver itself (CEL), also while the operator's webhook is "
            "down; a refusal names the field and shows the message. In a rule, `self` is "
            "the value of the field it is declared on; `oldSelf`, where a rule uses it, the "
            "stored object (none on a create). A policy stored before a rule keeps taking "
            "updates that leave the field the rule is declared on unchanged (ratcheting); "
            "the rules declared on the object itself judge only what a write can change "
            "(a create; turning the peer tier on), never a stored policy's name.",
            "",
            *_rules_table(found)]


def _rules_table(found: list[Rule]) -> list[str]:
    return table(["Field", "Declared on (`self`)", "Rule", "Message"],
                  [[code(r.target or "(the object)"), code(r.declared_on or "(the object)"),
                    code(r.rule), r.message] for r in found])


def _status_section(crd: Mapping[str, Any]) -> list[str]:
    status = _schema(crd)["properties"].get("status")
    if not status:
        return []
    rows = [[_path_cell(f), type_of(f.schema), cell(f.schema.get("description", ""))]
            for f in fields(status, "status")]
    lines = ["### Status (written by the operator)", "",
             *table(["Field", "Type", "Description"], rows)]
    phase = (status.get("properties") or {}).get("phase") or {}
    if phase.get("enum"):
        lines += ["Phases: " + ", ".join(code(p) for p in phase["enum"]) + ".", ""]
    if "conditions" in (status.get("properties") or {}):
        lines += ["Conditions follow metav1.Condition; their types and reasons: "
                  "[operator.md](operator.md#policy-status).", ""]
    return lines


def _columns(crd: Mapping[str, Any]) -> list[str]:
    columns = _version(crd, None).get("additionalPrinterColumns") or []
    if not columns:
        return []
    return ["`kubectl get` columns: " + ", ".join(
        f"{c['name']} ({code(c['jsonPath'])})" for c in columns) + ".", ""]


def policy_section(crd: Mapping[str, Any]) -> list[str]:
    spec = _spec(crd)
    rows = [[_path_cell(f), type_of(f.schema), default_cell(f.schema),
             owner(f.path) or "**unowned**", cell(f.schema.get("description", ""))]
            for f in fields(spec, "spec")]
    return [*_kind_header(crd), *_columns(crd), "### Spec", "",
            "Set by: **platform** — the platform team's decision (node tier, placement, the "
            "store's endpoint, identity and encryption, caps, injected resources); "
            "**tenant** — what the team running the job asks for (model, intervals, "
            "overlap, selector, retention, restore).", "",
            *table(["Field", "Type", "Default", "Set by", "Description"], rows),
            *_rules_section(crd), *_status_section(crd),
            *[line for v in listed(crd)[1:] for line in _older_section(crd, v["name"])]]


def _shallow(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a field's own row shows: its schema less the fields below it and
    its rules (those have rows of their own)."""
    return {k: v for k, v in (schema or {}).items()
            if k not in ("properties", "x-kubernetes-validations")}


def _older_section(crd: Mapping[str, Any], name: str) -> list[str]:
    """Version `name` where it differs from the preferred one: its fields'
    rows and its rules that are not the preferred version's."""
    preferred, own = _schema(crd), _schema(crd, name)
    theirs, mine = ({f.path: f for part in ("spec", "status")
                     for f in fields(schema["properties"].get(part) or {}, part)}
                    for schema in (preferred, own))
    rows = [[_path_cell(f), type_of(f.schema), default_cell(f.schema),
             (owner(f.path) or "**unowned**") if f.path.startswith("spec.") else "",
             cell(f.schema.get("description", ""))]
            for path, f in mine.items()
            if path not in theirs or _shallow(f.schema) != _shallow(theirs[path].schema)]
    kept = {(r.target, r.rule, r.message) for r in rules(preferred)}
    changed = [r for r in rules(own) if (r.target, r.rule, r.message) not in kept]
    version = _version(crd, name)
    top = _api_version(crd, version)
    status = ("is served too" if version.get("served") else
              "is defined, served from the next release (write the version above now)")
    lines = [f"### {crd['spec']['group']}/{name}", "",
             f"{top} {status}: every field above, under the same path with the same "
             "owner, and every rule, except these, which it states in its own way.", "",
             *table(["Field", "Type", "Default", "Set by", "Description"], rows)]
    absent = [path for path in theirs if path not in mine]
    if absent:
        lines += [f"Not in {top}: " + ", ".join(code(p) for p in absent) + ".", ""]
    if changed:
        lines += [f"Rules as {top} states them:", "", *_rules_table(changed)]
    return lines


#: Kinds besides CheckpointPolicy that people write, and who: every other
#: kind the operator writes alone.
WRITTEN_BY = {"CheckpointClass": "Written by the platform team (every field is the "
              "platform's; a policy picks a class by spec.checkpointClassName); the "
              "operator only reads it. [checkpoint-classes.md](checkpoint-classes.md)"}


def operator_section(crd: Mapping[str, Any]) -> list[str]:
    """A kind the operator writes alone, or the platform team
    (WRITTEN_BY): its fields, briefly."""
    spec = _schema(crd)["properties"].get("spec") or {}
    rows = [[_path_cell(f), type_of(f.schema), cell(f.schema.get("description", ""))]
            for f in fields(spec, "spec")]
    who = WRITTEN_BY.get(crd["spec"]["names"]["kind"],
                         "Written by the operator alone; read it, do not write it.")
    return [*_kind_header(crd), who, "",
            *_columns(crd), "### Spec", "", *table(["Field", "Type", "Description"], rows),
            *_rules_section(crd), *_status_section(crd)]


def load(directory: Path = CRDS) -> list[dict[str, Any]]:
    """The ckptdrain.io CRDs in `directory`, CheckpointPolicy first."""
    found = [d for p in sorted(directory.glob("*.yaml")) for d in yaml.safe_load_all(
        p.read_text()) if d and d.get("kind") == "CustomResourceDefinition"
        and d["spec"]["group"] == GROUP]
    return sorted(found, key=lambda d: d["spec"]["names"]["kind"] != FIRST)


def render(crds: list[dict[str, Any]]) -> str:
    lines = ["# API reference", "",
             "<!-- Generated from crds/*.yaml by " + REGENERATE + "; do not edit. -->", "",
             "Every field of the ckptdrain.io resources, from the CRDs in `crds/` (the one "
             "source the chart installs). What the fields mean in practice: "
             "[operator.md](operator.md); how the pods are changed: "
             "[pod-contract.md](pod-contract.md).", "",
             "Versions: v1beta1 (served, write this, stored from 0.3.0) and v1alpha1 "
             "(served, converted), what differs and how objects convert: "
             "[api-versions.md](api-versions.md).", ""]
    for crd in crds:
        kind = crd["spec"]["names"]["kind"]
        lines += policy_section(crd) if kind == FIRST else operator_section(crd)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    OUTPUT.write_text(render(load()))
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
