"""Schema pieces as Markdown table cells for docs/api.md: one line each,
pipes escaped, a field's type with what narrows it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml


def cell(text: object) -> str:
    """Text for a table cell: one line, pipes escaped, tags kept as text."""
    one = " ".join(str(text).split())
    return one.replace("|", "\\|").replace("<", "\\<")


def code(text: object) -> str:
    return "`" + " ".join(str(text).split()).replace("|", "\\|") + "`"


def type_of(schema: Mapping[str, Any]) -> str:
    """The type with what narrows it (format, enum, pattern, bounds), for a
    table cell: one line, pipes escaped."""
    if schema.get("x-kubernetes-int-or-string"):
        kind = "integer or string"
    elif schema.get("type") == "array":
        items = schema.get("items") or {}
        kind = f"array of {items.get('type', 'any')}"
    elif schema.get("type") == "object" and isinstance(schema.get("additionalProperties"),
                                                       Mapping):
        kind = f"map of {schema['additionalProperties'].get('type', 'any')}"
    elif schema.get("x-kubernetes-preserve-unknown-fields"):
        kind = "free-form object"
    else:
        kind = str(schema.get("type", "any"))
    bits = [kind]
    if "format" in schema:
        bits.append(f"format {schema['format']}")
    if "enum" in schema:
        # The empty string shown as the YAML a user writes for it.
        bits.append("one of " + ", ".join(code(v) if v != "" else '`""`'
                                          for v in schema["enum"]))
    if "minimum" in schema:
        op = ">" if schema.get("exclusiveMinimum") else "≥"
        bits.append(f"{op} {schema['minimum']}")
    if "maximum" in schema:
        op = "<" if schema.get("exclusiveMaximum") else "≤"
        bits.append(f"{op} {schema['maximum']}")
    for key, words in (("minLength", "at least {} character"),
                       ("maxLength", "at most {} character"),
                       ("maxItems", "at most {} item")):
        if key in schema:
            bits.append(words.format(schema[key]) + ("" if schema[key] == 1 else "s"))
    items = schema.get("items") if isinstance(schema.get("items"), Mapping) else {}
    if "maxLength" in items:
        bits.append(f"items at most {items['maxLength']} characters")
    if "pattern" in schema:
        bits.append("pattern " + code(schema["pattern"]))
    if schema.get("nullable"):
        bits.append("nullable")
    return "; ".join(bits)


def default_cell(schema: Mapping[str, Any]) -> str:
    if "default" not in schema:
        return ""
    return code(yaml.safe_dump(schema["default"], default_flow_style=True).strip()
                 .removesuffix("...").strip())


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]
