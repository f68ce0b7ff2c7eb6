"""`python -m tests.torture [--store file|seaweedfs|minio|gcs|all] [--kills N] ...`

Exit 0 when every category passed, 1 when any failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.torture.core import CATEGORIES
from tests.torture.runner import options, report, sweep

from ckptdrain import units

STORES = ("file", "seaweedfs", "minio", "gcs")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.torture", description=__doc__)
    p.add_argument("--store", default="all",
                   help="file, seaweedfs, minio, gcs, a comma list, or all (default)")
    p.add_argument("--kills", type=int, default=100, help="SIGKILLs per store (default 100)")
    p.add_argument("--manifests", type=int, default=500,
                   help="fuzzed manifests per store (default 500)")
    p.add_argument("--outages", type=int, default=3,
                   help="rounds of each outage scenario per S3 store (default 3)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of each corruption kind and writer race (default 3)")
    p.add_argument("--agreements", type=int, default=200,
                   help="randomized restore-agreement trials on a real apiserver (default 200)")
    p.add_argument("--size", default="32MiB", help="bytes per pushed checkpoint (default 32MiB)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=",".join(CATEGORIES),
                   help="comma list of categories (default: all): " + ",".join(CATEGORIES))
    p.add_argument("--scratch", default="/tmp", help="where temporary files go")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    args = p.parse_args(argv)
    stores = STORES if args.store == "all" else tuple(args.store.split(","))
    only = tuple(args.only.split(","))
    bad = [s for s in stores if s not in STORES] + [c for c in only if c not in CATEGORIES]
    if bad:
        p.error(f"unknown store or category: {', '.join(bad)}")
    opts = options(stores=list(stores), kills=args.kills, manifests=args.manifests,
                   outages=args.outages, rounds=args.rounds,
                   agreements=args.agreements,
                   size=int(units.parse_bytes("--size", args.size)), seed=args.seed,
                   only=only, scratch=Path(args.scratch))
    results = sweep(opts, log=lambda text: print(text, file=sys.stderr, flush=True))
    print(report(results, args.json))
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
