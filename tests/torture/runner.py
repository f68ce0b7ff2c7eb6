"""Run the chosen categories against the chosen stores and report tried/failed counts."""

from __future__ import annotations

import contextlib
import importlib
import json
import random
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from tests.torture.core import CATEGORIES, Category, Options
from tests.torture.ops import Ctx
from tests.torture.stores import StoreKind
from tests.torture.worker import Worker

#: Categories that need no store of their own run once, on the first store given.
ONCE = {"badinput", "diskfull", "agreement"}
#: Categories that only make sense on an S3 server.
S3_ONLY = {"outages"}
#: Categories that speak S3 (its server's process, its credentials): not run
#: on the GCS server.
NOT_ON_GCS = {"outages", "canary"}
MODULES = {"badinput": "badinput", "canary": "canary", "corruption": "corruption",
           "diskfull": "diskfull", "hostile": "hostile", "kills": "kills", "leaks": "leaks",
           "outages": "outages", "writers": "writers", "agreement": "agreement"}


def sweep(opts: Options, log: Any = print) -> list[Category]:
    """Every (category, store) pair of `opts`, in CATEGORIES order; leaks last."""
    results: list[Category] = []
    Path(opts.scratch).mkdir(parents=True, exist_ok=True)  # --scratch may name a new dir
    scratch = Path(tempfile.mkdtemp(prefix="ckptdrain-torture-", dir=opts.scratch))
    worker = Worker()
    try:
        with contextlib.ExitStack() as stack:
            kinds = [StoreKind.start(name, scratch / name, stack) for name in opts.stores]
            ctx = Ctx(opts, worker, scratch)
            for name in CATEGORIES:
                if name not in opts.only:
                    continue
                module = importlib.import_module(f"tests.torture.{MODULES[name]}")
                for i, kind in enumerate(kinds):
                    if name in ONCE and i > 0:
                        continue
                    cat = Category(name, "-" if name in ONCE else kind.name)
                    if name in NOT_ON_GCS and kind.gcs is not None:
                        cat.skipped = "speaks S3"
                    elif name in S3_ONLY and not kind.is_s3:
                        cat.skipped = "needs an S3 server"
                    else:
                        opts.rng.seed(f"{opts.seed}-{name}-{kind.name}")
                        started = time.monotonic()
                        try:
                            module.run(ctx, kind, cat)
                        except Exception:  # a harness fault must be seen, not hidden
                            cat.fail("the category itself crashed:\n" + traceback.format_exc())
                        cat.seconds = time.monotonic() - started
                    results.append(cat)
                    log(line(cat))
    finally:
        worker.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def line(cat: Category) -> str:
    if cat.skipped:
        return f"{cat.name:<11} {cat.store:<10} skipped: {cat.skipped}"
    figures = ", ".join(f"{k} {v}" for k, v in cat.figures.items())
    return (f"{cat.name:<11} {cat.store:<10} tried {cat.tried:>5}  failed {cat.failed:>4}  "
            f"({cat.seconds:.0f} s){'  ' + figures if figures else ''}")


def report(results: list[Category], as_json: bool) -> str:
    if as_json:
        return json.dumps([r.__dict__ for r in results], indent=2, default=str)
    out = [line(r) for r in results]
    for r in results:
        for detail in r.failures:
            out.append(f"FAIL {r.name}/{r.store}: {detail}")
    return "\n".join(out)


def options(**kw: Any) -> Options:
    opts = Options(**kw)
    opts.rng = random.Random(opts.seed)
    return opts


__all__ = ["CATEGORIES", "line", "options", "report", "sweep"]
