"""Leaks, after the whole sweep: temp files and staging directories under every
file:// root, unfinished multipart uploads on every S3 bucket, and the bytes of
data objects no current manifest names (orphans: reported, since retention
removes them only after its grace period).

Invariant: after global retention's clean-up (run here as it runs once its
grace period has passed), no temp file, no staging directory, no unfinished
upload. What a kill leaves before then is counted ("before retention"): it
cannot be told from a slow live writer's state until the grace has passed. An
upload that a surviving journal names is work a rerun of the same command
resumes (reported as "resumable uploads"), not a leak.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from tests.torture.core import Category
from tests.torture.ops import Ctx
from tests.torture.stores import StoreKind

_UPLOAD_ID = re.compile(rb'"upload_id":\s*"([^"]+)"')


def journaled_uploads(scratch: Path) -> set[str]:
    """Upload ids named by any journal the sweep left (push's and the agent's)."""
    found: set[str] = set()
    for path in scratch.rglob("*journal*"):
        if path.is_file():
            found |= {m.decode() for m in _UPLOAD_ID.findall(path.read_bytes())}
    return found


def run(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    resumable = journaled_uploads(ctx.scratch)
    kept = 0
    if kind.server is None:
        root = kind.scratch / "stores"
        cat.figures["file:// temp files and staging dirs before retention"] = len(
            _temp_state(root, resumable)[0])
        _retention_pass(root)
        found = []
        for dirpath, dirs, names in os.walk(root):
            for name in [*dirs, *names]:
                if Path(dirpath).name == ".ckptdrain-multipart" and name in resumable:
                    kept += 1
                elif name.startswith(".ckptdrain-tmp") or (
                        Path(dirpath).name == ".ckptdrain-multipart"):
                    found.append(str((Path(dirpath) / name).relative_to(root)))
        cat.figures["file:// temp files and staging dirs"] = len(found)
        cat.check(not found, f"{len(found)} temp files / staging dirs left: {found[:8]}")
        objects = _walk(root)
    else:
        client = kind.client()
        uploads = []
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=kind.bucket):
            for upload in page.get("Uploads", []):
                if upload["UploadId"] in resumable:
                    kept += 1
                else:
                    uploads.append(upload["Key"])
        cat.figures["unfinished multipart uploads"] = len(uploads)
        cat.check(not uploads, f"{len(uploads)} unfinished multipart uploads: {uploads[:8]}")
        objects = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=kind.bucket):
            for item in page.get("Contents", []):
                objects[item["Key"]] = item["Size"]
    cat.figures["resumable uploads"] = kept
    cat.figures["orphan bytes"] = _orphans(objects, kind)


def _temp_state(root: Path, resumable: set[str]) -> tuple[list[str], int]:
    """Temp files and unowned staging dirs under `root`, and the journaled ones."""
    found, kept = [], 0
    for dirpath, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            if Path(dirpath).name == ".ckptdrain-multipart" and name in resumable:
                kept += 1
            elif name.startswith(".ckptdrain-tmp") or Path(dirpath).name == ".ckptdrain-multipart":
                found.append(str((Path(dirpath) / name).relative_to(root)))
    return found, kept


def _retention_pass(root: Path) -> None:
    """What global retention does once its grace period has passed, on every
    file:// store of the sweep: a killed writer's temp files and unfinished
    uploads cannot be told from a slow live one's until then (docs/cli.md), so
    the invariant is that retention leaves none, not that a kill leaves none."""
    from ckptdrain import keys
    from ckptdrain.store.local import LocalStore
    from ckptdrain.transfer.prune import prune_writer

    later = time.time() + 1
    for area in sorted(p for p in root.iterdir() if p.is_dir()):
        store = LocalStore(area)
        writers = {parsed[1] for info in store.list(keys.DATA)
                   if (parsed := keys.parse_data_key(info.key)) is not None}
        for upload in store.list_multipart_uploads(keys.DATA):
            parsed = keys.parse_data_key(upload.key)
            if parsed is not None:
                writers.add(parsed[1])
        for writer in sorted(writers):
            prune_writer(store, writer, keep=10**6, grace=0, now=later)
        store.sweep(0, now=later)


def _walk(root: Path) -> dict[str, int]:
    found = {}
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            path = Path(dirpath) / name
            found[str(path.relative_to(root))] = path.stat().st_size
    return found


def _orphans(objects: dict[str, int], kind: StoreKind) -> int:
    """Bytes of data objects that no manifest next to them names."""
    named: set[str] = set()
    for key in objects:
        head, sep, _ = key.partition("manifests/")
        if not sep or not key.endswith(".json"):
            continue
        try:
            doc = json.loads(_read(kind, key))
            step, writer = int(doc["step"]), int(doc["writer"])
            attempt = f"{doc['attempt']}/" if doc.get("attempt") else ""
            for entry in doc["files"]:
                named.add(f"{head}data/{step:020d}/{writer:05d}/{attempt}{entry['path']}")
        except (ValueError, KeyError, TypeError, OSError):
            continue
    return sum(size for key, size in objects.items()
               if "data/" in key and key not in named)


def _read(kind: StoreKind, key: str) -> bytes:
    if kind.server is None:
        return (kind.scratch / "stores" / key).read_bytes()
    return bytes(kind.client().get_object(Bucket=kind.bucket, Key=key)["Body"].read())
