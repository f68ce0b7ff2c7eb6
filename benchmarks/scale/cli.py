"""`python -m benchmarks scale --writers 500,1000,5000 --policies 10,100,1000
--rounds 3`: every size of the grid (writers × policies, a policy needing at
least one writer) on its own fresh apiserver and operator; the figures as a
markdown table on stdout and as JSON and markdown files under --out."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.scale import report
from benchmarks.scale.run import Size, run


def _sizes(text: str, field: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"{field}: expected comma-separated whole numbers >= 1, got {text!r}")
    return sorted(set(values))


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks scale", description=__doc__)
    p.add_argument("--writers", type=lambda t: _sizes(t, "--writers"), default=[100, 500])
    p.add_argument("--policies", type=lambda t: _sizes(t, "--policies"), default=[10])
    p.add_argument("--rounds", type=int, default=3, help="checkpoint rounds per size")
    p.add_argument("--rate", type=float, default=50.0, help="pod creations per second")
    p.add_argument("--probe-pods", type=int, default=50,
                   help="pods of the job that arrives once every writer is present")
    p.add_argument("--tick", type=float, default=0.5,
                   help="seconds standing in for each 5 s pending-bytes period")
    p.add_argument("--ticks", type=int, default=None,
                   help="pending-bytes periods per drain (default: as many 5 s periods as "
                   "one shard's drain lasts at its share, 22 for the 405B example)")
    p.add_argument("--threads", type=int, default=32, help="hollow agents' API calls in flight")
    p.add_argument("--admission", default="process", choices=("process", "operator", "both"),
                   help="where admission runs: its own process (as deployed), the "
                   "operator's event loop (CKPTDRAIN_WEBHOOK_PROCESS=false), or each size "
                   "once in each, one after the other")
    p.add_argument("--out", type=Path, default=Path("scale-results"))
    args = p.parse_args(argv)
    for name in ("rounds", "probe_pods", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected a whole number >= 1")
    if args.ticks is not None and args.ticks < 1:
        p.error("--ticks: expected a whole number >= 1")
    if args.rate <= 0 or args.tick <= 0:
        p.error("--rate and --tick: expected positive numbers")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    results = []
    args.out.mkdir(parents=True, exist_ok=True)
    for policies in args.policies:
        for writers in args.writers:
            if policies > writers:
                continue
            for in_process in {"process": [True], "operator": [False],
                               "both": [False, True]}[args.admission]:
                size = Size(writers, policies, rounds=args.rounds, rate=args.rate,
                            probe_pods=args.probe_pods, tick_s=args.tick, ticks=args.ticks,
                            threads=args.threads, webhook_process=in_process)
                started = time.monotonic()
                with tempfile.TemporaryDirectory(prefix="ckptdrain-scale-") as work:
                    result = run(size, Path(work), log=lambda m: print(m, file=sys.stderr))
                result["wall_s"] = round(time.monotonic() - started, 1)
                results.append(result)
                # Written after every size, so a long grid stopped midway keeps what it
                # measured.
                (args.out / "scale.json").write_text(json.dumps(
                    {"results": results, "growth": report.growth(results)}, indent=2))
                (args.out / "scale.md").write_text(report.markdown(results))
    if not results:
        print("no size to run: every --policies value exceeds every --writers value",
              file=sys.stderr)
        return 2
    print(report.markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
