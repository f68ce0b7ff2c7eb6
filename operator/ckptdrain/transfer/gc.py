"""`ckptdrain gc URI`: what pushes and drains left in a store, listed or removed.

`push --replace`, a push killed for good, a drain whose node is gone: each
leaves data no manifest names and unfinished multipart uploads, billed and
shown by no `ls`. An agent's global retention removes its own writer's after
a grace period (transfer/prune.py); this is the same judgement for every
writer, by hand. By default it only lists (a dry run); `--delete` removes
what is older than the grace period. A key a current manifest names is never
touched, so a complete step never loses a byte.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ckptdrain import flags, keys, units
from ckptdrain.store.base import MultipartUpload, ObjectInfo


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri", metavar="URI")
    p.add_argument("--delete", action="store_true",
                   help="remove what is older than the grace period (default: only list)")
    p.add_argument("--grace", default="6h",
                   help="leave alone what is younger than this (default 6h, the agents' "
                   "retention): a push may still be writing it, a restore reading it")


def _row(info: ObjectInfo | MultipartUpload, now: float, removable: bool) -> dict[str, Any]:
    parsed = keys.parse_data_key(info.key)
    step, writer = parsed if parsed is not None else (None, None)
    if isinstance(info, ObjectInfo):
        kind, size, when = "data", info.size, info.modified
    else:
        kind, size, when = "upload", None, info.initiated
    return {"kind": kind, "key": info.key, "step": step, "writer": writer, "bytes": size,
            "age_seconds": None if when is None else max(0.0, now - when),
            "removable": removable}


def cmd_gc(args: argparse.Namespace) -> int:
    from ckptdrain.store import open_store
    from ckptdrain.transfer import prune

    grace = 0.0 if args.grace.strip() in ("0", "0s") else flags.duration("--grace", args.grace)
    store = open_store(args.uri, endpoint_url=args.endpoint_url, endpoint_field="--endpoint-url",
                       create=False)
    now = time.time()
    found = prune.find_leftovers(store, None, grace=grace, now=now)
    rows = ([_row(i, now, True) for i in found.objects]
            + [_row(u, now, True) for u in found.uploads]
            + [_row(i, now, False) for i in found.waiting]
            + [_row(u, now, False) for u in found.waiting_uploads])
    removed = 0
    if args.delete:
        removed = prune.remove(store, found)
        sweep = getattr(store, "sweep", None)
        if callable(sweep):  # the file store's own temp files
            removed += int(sweep(grace, now))
    ready = sum(i.size for i in found.objects)
    later = sum(i.size for i in found.waiting)
    if args.json:
        print(json.dumps({"uri": store.uri, "grace_seconds": grace, "deleted": args.delete,
                          "removed": removed, "removable_bytes": ready,
                          "waiting_bytes": later, "leftovers": rows}, indent=2))
        return 0
    if args.quiet:
        return 0
    if rows:
        print(f"{'KIND':<6}  {'STEP':>12}  {'WRITER':>6}  {'SIZE':>10}  {'AGE':>8}  STATE")
    for r in rows:
        size = "-" if r["bytes"] is None else units.format_bytes(r["bytes"])
        age = "-" if r["age_seconds"] is None else units.format_duration(r["age_seconds"])
        state = (("removed" if args.delete else "removable") if r["removable"]
                 else "in use or within --grace: left alone")
        print(f"{r['kind']:<6}  {r['step'] if r['step'] is not None else '-':>12}  "
              f"{r['writer'] if r['writer'] is not None else '-':>6}  {size:>10}  {age:>8}  "
              f"{state}")
    verb = "removed" if args.delete else "removable (run with --delete)"
    print(f"{store.uri}: {len(found.objects)} object(s) ({units.format_bytes(ready)}) and "
          f"{len(found.uploads)} unfinished upload(s) {verb}; {len(found.waiting)} object(s) "
          f"({units.format_bytes(later)}) and {len(found.waiting_uploads)} upload(s) left "
          f"alone: written, replaced or uploading within --grace {units.format_duration(grace)}")
    return 0
