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
import hashlib
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ckptdrain import flags, keys, units
from ckptdrain.errors import (
    BucketMissing,
    IntegrityError,
    InvalidInput,
    NoCheckpoint,
    ObjectMissing,
)

#: More requests in flight than this only queue at the store and cost memory.
MAX_CONCURRENCY = 256


def _concurrency(value: object) -> int:
    n = units.parse_positive_int("--concurrency", value)
    if n > MAX_CONCURRENCY:
        raise InvalidInput("--concurrency", f"a whole number from 1 to {MAX_CONCURRENCY}", value)
    return n


def _open(uri: str, endpoint_url: str | None, *, create: bool = False) -> Any:
    """The store URI names. A file:// directory that does not exist is an
    error (exit 3) unless `create`: a mistyped path must not read as an empty
    store, nor quietly become one."""
    from ckptdrain.store import open_store

    return open_store(uri, endpoint_url=endpoint_url, endpoint_field="--endpoint-url",
                      create=create)


class _Bar:
    """A tqdm bar on a terminal, nothing otherwise; fed cumulative byte counts."""

    def __init__(self, args: argparse.Namespace, total: int, what: str) -> None:
        self.bar = None
        self.last = 0
        if not (args.quiet or args.json) and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=what, file=sys.stderr)

    def total(self, size: int) -> None:
        """A new total (pull learns it from the manifests): restarts the bar,
        so its rate and ETA are of this checkpoint."""
        if self.bar is not None:
            self.bar.reset(total=size)
            self.last = 0

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
    rate = None if args.rate is None else flags.rate("--rate", args.rate)
    part = flags.positive_bytes("--part-size", args.part_size)
    concurrency = _concurrency(args.concurrency)
    try:
        store = _open(args.uri, args.endpoint_url, create=args.create)
    except BucketMissing as err:
        if not args.uri.startswith("file:"):
            raise
        raise BucketMissing(f"{err} (check the path; push --create creates it)") from None
    journal = Path(args.journal) if args.journal else default_journal(src, store.uri)
    if not os.access(journal.parent, os.W_OK):
        raise InvalidInput("--journal", f"a writable place for the resume journal ("
                           f"{journal.parent} is not writable: pass --journal PATH)",
                           str(journal))
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
    except OSError as err:  # the journal's disk, or a file:// store's
        raise _naming(err, f"{journal} or {store.uri}") from None
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


def default_journal(src: Path, uri: str) -> Path:
    """Beside SRC_DIR, one per destination: a push of the same directory to
    another store keeps its own resume state instead of taking this one's."""
    dest = hashlib.sha256(uri.encode()).hexdigest()[:12]
    return src.parent / f".{src.name}.{dest}.ckptdrain-journal"


def _naming(err: OSError, where: Path | str) -> OSError:
    """`err` naming a path: a write that fails for lack of space, quota or a
    read-only mount often has no file name of its own."""
    if err.filename is None:
        err.filename = str(where)
    return err


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

    step = _step_arg(args.step)
    writer = None if args.writer is None else flags.writer_id(args.writer)
    concurrency = None if args.concurrency is None else _concurrency(args.concurrency)
    part = None if args.part_size is None else flags.positive_bytes("--part-size", args.part_size)
    store = _open(args.uri, args.endpoint_url)
    if step is not None:
        _must_hold(store, step)
    bar = _Bar(args, 0, "pull")
    try:
        result = fetch(store, Path(args.dest), step=step, writer=writer,
                       concurrency=concurrency, part_size=part, progress=bar,
                       direct_io=args.direct_io, on_total=bar.total)
    except OSError as err:
        raise _naming(err, Path(args.dest)) from None
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
    step = _step_arg(args.step)
    writer = None if args.writer is None else flags.writer_id(args.writer)
    if args.all and (step is not None or "://" not in args.target):
        raise InvalidInput("--all", "a store URI and no --step (every complete step)",
                           args.target if step is None else f"--step {args.step}")
    if "://" in args.target:
        store = _open(args.target, args.endpoint_url)
        if args.all:
            return _verify_all(args, store)
        step = _newest(store) if step is None else _must_hold(store, step)
        from ckptdrain.transfer.fetch import verify_store

        problems, what = verify_store(store, step), f"step {step} in {store.uri}"
    else:
        problems, what = _verify_dir(args, step, writer), args.target
    _report(args, {"target": what, "ok": not problems, "problems": problems},
            "\n".join([f"{what}: {len(problems)} problem(s)", *problems]) if problems
            else f"{what}: every file matches its manifest")
    return IntegrityError.exit_code if problems else 0


def _verify_dir(args: argparse.Namespace, step: int | None, writer: int | None) -> list[str]:
    """Problems of a directory on disk: against one manifest, or as `pull`
    lays out a step of several writers (each under DIR/<writer>/)."""
    from ckptdrain.manifest import WriterManifest
    from ckptdrain.transfer.catalog import load_checkpoint
    from ckptdrain.transfer.fetch import verify_dir

    target = Path(args.target)
    if not target.is_dir():
        raise InvalidInput("DIR", "an existing directory to verify",
                           f"{args.target} ({'not a directory' if target.exists() else 'missing'})")
    if args.manifest:
        return verify_dir(target, WriterManifest.from_json(Path(args.manifest).read_bytes()))
    if not args.against:
        raise InvalidInput("--manifest", "a manifest file (or --against URI) to verify a DIR",
                           None)
    store = _open(args.against, args.endpoint_url)
    ckpt = load_checkpoint(store, _newest(store) if step is None else _must_hold(store, step))
    if writer is not None:
        if writer >= ckpt.writers:
            raise InvalidInput("--writer", f"a writer id in 0..{ckpt.writers - 1} "
                               f"(step {ckpt.step} has {ckpt.writers})", writer)
        return verify_dir(target, ckpt.manifests[writer])
    if ckpt.writers == 1:
        return verify_dir(target, ckpt.manifests[0])
    if not (target / "0").is_dir():
        raise InvalidInput("--writer", f"which writer's files {args.target} holds (step "
                           f"{ckpt.step} has {ckpt.writers} writers; a whole pull puts each "
                           "under DIR/<writer>/)", None)
    return [f"{m.writer}/{problem}" for m in ckpt.manifests
            for problem in verify_dir(target / str(m.writer), m)]


def _verify_all(args: argparse.Namespace, store: Any) -> int:
    """Every complete step of the store; incomplete ones are listed, not failed:
    a push may still be writing them (`ls` says why each is incomplete)."""
    from ckptdrain.transfer.catalog import scan
    from ckptdrain.transfer.fetch import verify_store

    catalog = scan(store)
    if not catalog.complete:
        raise NoCheckpoint(f"no complete checkpoint in {store.uri}")
    steps = [{"step": c.step, "problems": verify_store(store, c.step)} for c in catalog.complete]
    bad = [s for s in steps if s["problems"]]
    lines = [f"step {s['step']}: {p}" for s in bad for p in s["problems"]]
    lines.append(f"{store.uri}: {len(steps) - len(bad)} of {len(steps)} complete step(s) "
                 f"verified" + (f", {len(bad)} with problems" if bad else "")
                 + (f"; {len(catalog.rejected)} incomplete step(s) not checked"
                    if catalog.rejected else ""))
    _report(args, {"target": store.uri, "ok": not bad, "steps": steps,
                   "incomplete": [r.step for r in catalog.rejected]}, "\n".join(lines))
    return IntegrityError.exit_code if bad else 0


def _newest(store: Any) -> int:
    from ckptdrain.transfer.catalog import complete_steps

    found = complete_steps(store)
    if not found:
        raise NoCheckpoint(f"no complete checkpoint in {store.uri}")
    return found[0].step


def _must_hold(store: Any, step: int) -> int:
    """`step` when the store has at least one manifest of it, else NoCheckpoint
    (exit 5): a step never pushed is not found, not corrupt."""
    if next(iter(store.list(keys.step_manifests_prefix(step))), None) is not None:
        return step
    from ckptdrain.transfer.catalog import candidate_steps

    there = candidate_steps(store)
    held = (f"its newest: {', '.join(str(s) for s in there[:5])}" if there
            else "it holds no checkpoint")
    raise NoCheckpoint(f"step {step} is not in {store.uri} ({held})")


def _step_arg(value: str | None) -> int | None:
    """--step: None for 'latest' (or not given), else a step number."""
    if value is None or value.strip() == "latest":
        return None
    return flags.step_number("--step", value, latest=True)


def _report(args: argparse.Namespace, doc: dict[str, Any], line: str) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    elif not args.quiet:
        print(line)
