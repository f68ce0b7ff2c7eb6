"""`ckptdrain push | pull | ls | verify`: the store's sub-commands, by hand.

cli.py builds their parsers; here is what each does once its flags are
parsed. The engines (transfer/drain.py, transfer/fetch.py, the catalog) and
the store adapters (botocore) are imported only inside the command that runs, so
importing this module costs `ckptdrain size` nothing. Errors leave as
errors.py exceptions; cli.main turns them into one line and an exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ckptdrain import flags, units
from ckptdrain.errors import IntegrityError, InvalidInput, NoCheckpoint, ObjectMissing


def _open(uri: str, endpoint_url: str | None) -> Any:
    from ckptdrain.store import open_store

    return open_store(uri, endpoint_url=endpoint_url, endpoint_field="--endpoint-url")


class _Bar:
    """A tqdm bar on a terminal, nothing otherwise; fed cumulative byte counts."""

    def __init__(self, args: argparse.Namespace, total: int, what: str) -> None:
        self.bar = None
        self.last = 0
        if not (args.quiet or args.json) and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=what, file=sys.stderr)

    def __call__(self, done: int) -> None:
        if self.bar is not None and done > self.last:
            self.bar.update(done - self.last)
            self.last = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _step_from_dir(src: Path) -> int:
    match = re.search(r"([0-9]+)$", src.name)
    if not match:
        raise InvalidInput("--step", "a step number (SRC_DIR's name does not end in one)",
                           src.name)
    return int(match[1])


def cmd_push(args: argparse.Namespace) -> int:
    from ckptdrain.ratelimit import TokenBucket
    from ckptdrain.transfer.drain import Drainer
    from ckptdrain.transfer.scan import build_manifest

    src = Path(args.src).absolute()
    step = _step_from_dir(src) if args.step is None else flags.step_number("--step", args.step)
    writers = units.parse_positive_int("--writers", args.writers)
    writer = flags.writer_id(args.writer)
    if writer >= writers:
        raise InvalidInput("--writer", f"a writer id in 0..{writers - 1}", args.writer)
    rate = None if args.rate is None else units.parse_rate("--rate", args.rate)
    part = flags.positive_bytes("--part-size", args.part_size)
    concurrency = units.parse_positive_int("--concurrency", args.concurrency)
    journal = Path(args.journal) if args.journal else src.parent / f".{src.name}.ckptdrain-journal"
    store = _open(args.uri, args.endpoint_url)
    _check_part_floor(part, args.part_size, store.min_part_size)
    manifest = build_manifest(src, step, writer, writers, created=time.time())
    drainer = Drainer(store, limiter=TokenBucket(rate), part_size=part, concurrency=concurrency)
    cancel = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: cancel.set())
    bar = _Bar(args, manifest.total_bytes, f"push step {step}")
    try:
        result = drainer.drain(src, manifest, journal_path=journal, cancel=cancel, progress=bar,
                               replace=args.replace)
    finally:
        bar.close()
    journal.unlink(missing_ok=True)
    if result.already_committed:
        _report(args, {**dataclasses.asdict(result), "uri": store.uri},
                f"step {step} writer {writer}/{writers} is already committed in "
                f"{store.uri} with the same content: nothing sent")
        return 0
    speed = result.sent_bytes / result.seconds if result.seconds > 0 else 0.0
    doc = {**dataclasses.asdict(result), "uri": store.uri, "bytes_per_second": speed}
    _report(args, doc, f"pushed step {step} writer {writer}/{writers} to {store.uri}: "
            f"{units.format_bytes(result.bytes)} in {units.format_duration(result.seconds)} "
            f"({units.format_rate(speed)}), {units.format_bytes(result.resumed_bytes)} resumed")
    return 0


#: Smallest --part-size push takes: below 1 MiB per-request overhead dominates
#: every upload and every later ranged read; a store may ask more (S3: 5 MiB).
MIN_PUSH_PART = 1 << 20


def _check_part_floor(part: int, seen: str, store_min: int) -> None:
    floor = max(MIN_PUSH_PART, store_min)
    if part < floor:
        why = ("the store's smallest part" if store_min > MIN_PUSH_PART
               else "smaller parts cost more in requests than they save")
        raise InvalidInput("--part-size", f"at least {-(-floor // MIN_PUSH_PART)}MiB ({why})",
                           seen)


def cmd_pull(args: argparse.Namespace) -> int:
    from ckptdrain.transfer.fetch import fetch

    step = None if args.step in (None, "latest") else _int("--step", args.step)
    writer = None if args.writer is None else flags.writer_id(args.writer)
    concurrency = (None if args.concurrency is None
                   else units.parse_positive_int("--concurrency", args.concurrency))
    part = None if args.part_size is None else flags.positive_bytes("--part-size", args.part_size)
    store = _open(args.uri, args.endpoint_url)
    bar = _Bar(args, 0, "pull")
    try:
        result = fetch(store, Path(args.dest), step=step, writer=writer,
                       concurrency=concurrency, part_size=part, progress=bar,
                       direct_io=args.direct_io)
    except ObjectMissing as err:
        if step is None:
            raise
        # A committed manifest names an object the store no longer has: the
        # step is damaged (exit 4), not the store unreachable (exit 3).
        raise IntegrityError(f"step {step}: data missing from the store: {err}") from None
    finally:
        bar.close()
    speed = result.bytes / result.seconds if result.seconds > 0 else 0.0
    doc = {**dataclasses.asdict(result), "dest": str(result.dest), "bytes_per_second": speed}
    for reason in result.skipped:
        print(f"ckptdrain: skipped {reason}", file=sys.stderr)
    _report(args, doc, f"pulled step {result.step} ({len(result.writers)} writer(s)) from "
            f"{result.source_uri} to {result.dest}: {units.format_bytes(result.bytes)} in "
            f"{units.format_duration(result.seconds)} ({units.format_rate(speed)})")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from ckptdrain.transfer.catalog import scan

    cat = scan(_open(args.uri, args.endpoint_url))
    rows = [{"step": c.step, "writers": c.writers, "bytes": c.total_bytes, "created": c.created,
             "complete": True, "reason": ""} for c in cat.complete]
    rows += [{"step": r.step, "writers": None, "bytes": None, "created": None,
              "complete": False, "reason": r.reason} for r in cat.rejected]
    rows.sort(key=lambda r: r["step"], reverse=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'STEP':>12}  {'WRITERS':>7}  {'SIZE':>10}  STATE")
    for r in rows:
        size = units.format_bytes(r["bytes"]) if r["bytes"] is not None else "-"
        state = "complete" if r["complete"] else f"incomplete: {r['reason']}"
        print(f"{r['step']:>12}  {r['writers'] or '-':>7}  {size:>10}  {state}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from ckptdrain.manifest import WriterManifest
    from ckptdrain.transfer.catalog import complete_steps, load_checkpoint
    from ckptdrain.transfer.fetch import verify_dir, verify_store

    step = None if args.step in (None, "latest") else _int("--step", args.step)
    writer = 0 if args.writer is None else flags.writer_id(args.writer)

    def newest(store: Any) -> int:
        found = complete_steps(store)
        if not found:
            raise NoCheckpoint(f"no complete checkpoint in {store.uri}")
        return found[0].step

    if "://" in args.target:
        store = _open(args.target, args.endpoint_url)
        step = newest(store) if step is None else step
        problems, what = verify_store(store, step), f"step {step} in {store.uri}"
    else:
        if args.manifest:
            manifest = WriterManifest.from_json(Path(args.manifest).read_bytes())
        elif args.against:
            store = _open(args.against, args.endpoint_url)
            ckpt = load_checkpoint(store, newest(store) if step is None else step)
            if writer >= len(ckpt.manifests):
                raise InvalidInput("--writer", f"a writer id in 0..{len(ckpt.manifests) - 1} "
                                   f"(step {ckpt.step} has {len(ckpt.manifests)})", writer)
            manifest = ckpt.manifests[writer]
        else:
            raise InvalidInput("--manifest", "a manifest file (or --against URI) to verify a DIR",
                               None)
        problems, what = verify_dir(Path(args.target), manifest), args.target
    _report(args, {"target": what, "ok": not problems, "problems": problems},
            "\n".join([f"{what}: {len(problems)} problem(s)", *problems]) if problems
            else f"{what}: every file matches its manifest")
    return IntegrityError.exit_code if problems else 0


def _int(field: str, value: str) -> int:
    if not re.fullmatch(r"[0-9]+", value):
        raise InvalidInput(field, "a step number or 'latest'", value)
    return int(value)


def _report(args: argparse.Namespace, doc: dict[str, Any], line: str) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    elif not args.quiet:
        print(line)
