"""JSONPatch (RFC 6902) as the webhook writes it: the ops' type, a key as a
pointer segment, and an append that adds a list where the pod has none.
Pure."""

from __future__ import annotations

from typing import Any

JSONPatch = list[dict[str, Any]]


def pointer(key: str) -> str:
    """`key` as one segment of a JSON pointer (RFC 6901: ~ and / escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def append(ops: JSONPatch, path: str, existing: list[Any] | None, items: list[Any]) -> None:
    """Ops adding `items` to the list at `path` (`existing`: the pod's, None
    when it has none: then the whole list is added)."""
    if not items:
        return
    if existing is None:
        ops.append({"op": "add", "path": path, "value": items})
    else:
        ops.extend({"op": "add", "path": f"{path}/-", "value": item} for item in items)
