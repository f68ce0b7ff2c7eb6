"""Leaks, after the whole sweep: temp files and staging directories under every
file:// root, unfinished multipart uploads on every S3 bucket and GCS area
(there, also parts stored for an upload whose marker is gone), and the bytes
of data objects no current manifest names (orphans).

Invariant: after global retention's clean-up (run here on every store area of
the sweep, file:// and S3, as it runs once its grace period has passed), no
temp file, no staging directory, no unfinished upload and no orphaned data.
What a kill leaves before then is counted ("before retention"): it cannot be
told from a slow live writer's state until the grace has passed. An upload
that a surviving journal names is work a rerun of the same command resumes
(reported as "resumable uploads"), not a leak. Data beside a manifest that
does not verify is kept on purpose (retention never judges a step it cannot
read) and reported apart, as "bytes beside a damaged manifest".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from tests.torture.core import Category
from tests.torture.ops import Ctx
from tests.torture.stores import StoreKind

from ckptdrain import keys
from ckptdrain.errors import ObjectMissing
from ckptdrain.store import open_store
from ckptdrain.store.base import Store
from ckptdrain.store.gcs_multipart import UPLOADS as GCS_UPLOADS
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.prune import prune_writer

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
    if kind.is_file:
        cat.figures["file:// temp files and staging dirs before retention"] = len(
            _temp_state(kind.scratch / "stores", resumable)[0])
    leaked, damaged, sample = 0, 0, []
    with _credentials(kind):
        areas = _areas(kind)
        for label, store in areas:
            try:
                _retention_pass(store)
            except Exception as err:
                cat.fail(f"retention on area {label}: {type(err).__name__}: {err}"[:400])
        for label, store in areas:
            area_leaked, area_damaged, keys_ = _orphans(store)
            leaked += area_leaked
            damaged += area_damaged
            sample += [f"{label}/{k}" for k in keys_[:4]]
    cat.figures["store areas swept by retention"] = len(areas)
    if kind.gcs is not None:
        uploads, stray = [], 0
        for label, store in areas:
            live = set()
            for upload in store.list_multipart_uploads(""):
                live.add(upload.upload_id)
                if upload.upload_id in resumable:
                    kept += 1
                else:
                    uploads.append(f"{label}/{upload.key}")
            parts = f"{label}/{GCS_UPLOADS}/part/"
            for name, size in kind.gcs_list(parts).items():
                upload_id = name[len(parts):].split("/", 1)[0]
                if upload_id not in live:  # no marker: nothing can resume or abort it
                    stray += size
        cat.figures["unfinished multipart uploads"] = len(uploads)
        cat.figures["bytes of parts no upload names"] = stray
        cat.check(not uploads, f"{len(uploads)} unfinished multipart uploads: {uploads[:8]}")
        cat.check(stray == 0, f"{stray} bytes of parts of uploads that are gone")
    elif kind.is_file:
        found, kept = _temp_state(kind.scratch / "stores", resumable)
        cat.figures["file:// temp files and staging dirs"] = len(found)
        cat.check(not found, f"{len(found)} temp files / staging dirs left: {found[:8]}")
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
    cat.figures["resumable uploads"] = kept
    cat.figures["orphan bytes"] = leaked
    cat.figures["bytes beside a damaged manifest"] = damaged
    cat.check(leaked == 0, f"{leaked} bytes of data no manifest names after retention: "
                           f"{sample[:8]}")


@contextlib.contextmanager
def _credentials(kind: StoreKind) -> Iterator[None]:
    """The S3 server's credentials in this process's environment, as the CLI
    and the agent get them, for the retention pass's in-process stores."""
    if kind.server is None:
        yield
        return
    s = kind.server
    env = {"AWS_ACCESS_KEY_ID": s.access_key, "AWS_SECRET_ACCESS_KEY": s.secret_key,
           "AWS_REGION": s.region}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _areas(kind: StoreKind) -> list[tuple[str, Store]]:
    """Every store area the sweep made: a directory under the file:// root,
    a top-level prefix (objects or unfinished uploads) in the S3 bucket."""
    if kind.gcs is not None:
        tags = sorted({name.split("/", 1)[0] for name in kind.gcs_list("") if "/" in name})
        return [(tag, open_store(f"gs://{kind.bucket}/{tag}", endpoint_url=kind.gcs.endpoint_url))
                for tag in tags]
    if kind.server is None:
        root = kind.scratch / "stores"
        return [(p.name, LocalStore(p)) for p in sorted(root.iterdir()) if p.is_dir()]
    client, tags = kind.client(), set()
    for op in ("list_objects_v2", "list_multipart_uploads"):
        for page in client.get_paginator(op).paginate(Bucket=kind.bucket, Delimiter="/"):
            tags |= {p["Prefix"].rstrip("/") for p in page.get("CommonPrefixes", [])}
    return [(tag, open_store(f"s3://{kind.bucket}/{tag}", endpoint_url=kind.server.endpoint_url))
            for tag in sorted(tags)]


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


def _retention_pass(store: Store) -> None:
    """What global retention does once its grace period has passed: a killed
    writer's temp files and unfinished uploads cannot be told from a slow live
    one's until then (docs/cli.md), so the invariant is that retention leaves
    none, not that a kill leaves none."""
    later = time.time() + 1
    writers = {parsed[1] for info in store.list(keys.DATA)
               if (parsed := keys.parse_data_key(info.key)) is not None}
    for upload in store.list_multipart_uploads(keys.DATA):
        parsed = keys.parse_data_key(upload.key)
        if parsed is not None:
            writers.add(parsed[1])
    for writer in sorted(writers):
        prune_writer(store, writer, keep=10**6, grace=0, now=later)
    sweep = getattr(store, "sweep", None)
    if callable(sweep):
        sweep(0, now=later)


def _orphans(store: Store) -> tuple[int, int, list[str]]:
    """(bytes of data no valid manifest names, bytes beside a manifest that
    does not parse or names another step, keys of the first kind). Judged
    here from the manifests themselves, not by retention's own code."""
    named: dict[tuple[int, int], set[str] | None] = {}
    leaked, damaged, found = 0, 0, []
    for info in store.list(keys.DATA):
        parsed = keys.parse_data_key(info.key)
        if parsed is not None and parsed not in named:
            named[parsed] = _named(store, *parsed)
        current = named.get(parsed) if parsed is not None else set()
        if current is None:
            damaged += info.size
        elif info.key not in current:
            leaked += info.size
            found.append(info.key)
    return leaked, damaged, found


def _spread(writer: int) -> str:
    """docs/store-layout.md's spread prefix, computed here rather than by keys.py."""
    return hashlib.sha256(f"{writer:05d}".encode()).hexdigest()[:2]


def _named(store: Store, step: int, writer: int) -> set[str] | None:
    try:
        doc = json.loads(store.get_bytes(keys.manifest_key(step, writer)))
        if (int(doc["step"]), int(doc["writer"])) != (step, writer):
            return None
        attempt = doc.get("attempt") or ""
        base = f"{keys.DATA}{step:020d}/{writer:05d}/"
        if attempt.startswith("s"):  # the spread layout: two hex digits of the writer's hash
            base = f"{keys.DATA}{_spread(writer)}/{step:020d}/{writer:05d}/"
        attempt_dir = f"{attempt}/" if attempt else ""
        return {f"{base}{attempt_dir}{entry['path']}" for entry in doc["files"]}
    except ObjectMissing:
        return set()
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
