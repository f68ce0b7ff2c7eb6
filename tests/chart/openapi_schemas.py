"""Strict JSON schemas for kubeconform, made from a real API server's OpenAPI v2.

kubeconform normally downloads its schemas from GitHub; here there is no
internet. The API server publishes the same definitions at /openapi/v2 (our
CRDs included once they are applied), so the tests write one standalone file
per kind in kubeconform's file layout and point `-schema-location` at it.

Strict like kubeconform's own `-strict` schemas: objects with declared
properties refuse unknown keys, so a mis-indented field fails.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: kubeconform's file layout (see its pkg/registry): lower-case kind, then
#: "-<first label of the group>" (none for core) and "-<version>".
SCHEMA_LOCATION = "{{ .ResourceKind }}{{ .KindSuffix }}.json"

_REF = re.compile(r"^#/definitions/(.+)$")
# The API server types these as plain strings in OpenAPI v2; manifests
# legitimately use numbers too (ports, cpu: 1).
_INT_OR_STRING = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
_QUANTITY = {"oneOf": [{"type": "string"}, {"type": "number"}]}
_LOOSE = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": _INT_OR_STRING,
    "io.k8s.apimachinery.pkg.api.resource.Quantity": _QUANTITY,
}


def file_name(kind: str, api_version: str) -> str:
    """kubeconform's name for the schema of `kind` in `api_version`."""
    group_version = api_version.split("/")
    suffix = "-" + group_version[0].split(".")[0].lower()
    if len(group_version) > 1:
        suffix += "-" + group_version[1].lower()
    return f"{kind.lower()}{suffix}.json"


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and (m := _REF.match(ref)):
            yield m.group(1)
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _closure(definitions: dict[str, Any], root: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen or name not in definitions:
            continue
        seen[name] = definitions[name]
        todo.extend(_refs(definitions[name]))
    return seen


def _strict(schema: Any) -> Any:
    """Refuse unknown keys where a schema declares its properties; allow null
    where the API server treats null as unset. Walks schema positions only
    (a property may itself be named "properties")."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out:
        required = set(out.get("required", []))
        properties = {}
        for name, prop in out["properties"].items():
            prop = _strict(prop)
            if name not in required and isinstance(prop.get("type"), str):
                prop["type"] = [prop["type"], "null"]
            properties[name] = prop
        out["properties"] = properties
        if ("additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = _strict(out[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = [_strict(v) for v in out[key]]
    if out.get("x-kubernetes-int-or-string") or out.get("format") == "int-or-string":
        out.pop("type", None)
        out.pop("format", None)
        out.update(copy.deepcopy(_INT_OR_STRING))
    return out


def write(openapi_v2: dict[str, Any], directory: Path) -> list[str]:
    """One standalone strict schema per kind and version; returns the names."""
    definitions = {name: _LOOSE.get(name, schema)
                   for name, schema in openapi_v2["definitions"].items()}
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in definitions.items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            api_version = (f"{gvk['group']}/{gvk['version']}" if gvk["group"]
                           else gvk["version"])
            needed = _closure(definitions, name)
            document = _strict(copy.deepcopy(schema))
            document["definitions"] = {k: _strict(copy.deepcopy(v)) for k, v in needed.items()}
            target = file_name(gvk["kind"], api_version)
            (directory / target).write_text(json.dumps(document))
            written.append(target)
    return written
