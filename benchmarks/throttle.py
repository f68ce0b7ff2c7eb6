"""A drain into a store that throttles: shared AIMD back-off vs per-request retries.

    .venv/bin/python -m benchmarks throttle [--files 96] [--size 256KiB]
                                            [--limit 2] [--concurrency 8] [--rounds 3]

A real MinIO behind tests/support/s3proxy.py, which answers 503 SlowDown to
every request beyond `--limit` in flight (a prefix over its request rate).
The same checkpoint (`--files` files of `--size`) is drained with
`--concurrency` workers, alternating:

- shared: ckptdrain's gate (store/s3_throttle.py): one AIMD window and
  back-off for the whole process;
- per-request: the gate opened wide and botocore's standard retries (10
  attempts, per-request exponential back-off with jitter) doing the work, as
  the drain did before.

Reported per mode, median over rounds: requests that met a full server (503s),
requests forwarded, seconds. Fewer 503s for the same work is the point: each
one is a request the store had to refuse.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from botocore.config import Config

from ckptdrain import units
from ckptdrain.congestion import CongestionSettings
from ckptdrain.store.s3 import S3Store
from ckptdrain.store.s3_throttle import ThrottleGate
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest


def _store(server: object, bucket: str, url: str, mode: str) -> S3Store:
    if mode == "shared":
        gate, attempts = ThrottleGate(), 10
    else:  # a gate that never narrows or pauses, one try: botocore retries instead
        gate = ThrottleGate(CongestionSettings(max_window=4096, min_window=4096,
                                               backoff=1e-6, max_backoff=1e-6, cooldown=0))
        attempts = 1
    store = S3Store(bucket, mode, endpoint_url=url, region=server.region,  # type: ignore[attr-defined]
                    access_key=server.access_key, secret_key=server.secret_key,  # type: ignore[attr-defined]
                    gate=gate, max_attempts=attempts)
    if mode != "shared":
        config = store._client.meta.config.merge(Config(
            retries={"mode": "standard", "total_max_attempts": 10}))
        import boto3
        store._client = boto3.session.Session(
            aws_access_key_id=server.access_key,  # type: ignore[attr-defined]
            aws_secret_access_key=server.secret_key,  # type: ignore[attr-defined]
            region_name=server.region).client(  # type: ignore[attr-defined]
                "s3", endpoint_url=url, config=config)
    return store


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks throttle")
    ap.add_argument("--files", type=int, default=96)
    ap.add_argument("--size", default="256KiB")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.s3proxy import S3FaultProxy
    from tests.support.s3servers import start_minio

    size = units.parse_bytes("--size", args.size)
    results: dict[str, list[dict[str, float]]] = {"shared": [], "per-request": []}
    with tempfile.TemporaryDirectory() as tmp, start_minio(Path(tmp)) as server:
        src = Path(tmp) / "step-1"
        src.mkdir()
        block = b"x" * size
        for i in range(args.files):
            (src / f"f{i:04d}.bin").write_bytes(block[:-8] + i.to_bytes(8, "big"))
        bucket = server.create_bucket()
        for r in range(args.rounds):
            for mode in ("shared", "per-request") if r % 2 == 0 else ("per-request", "shared"):
                with S3FaultProxy(server.endpoint_url) as proxy:
                    proxy.max_in_flight = args.limit
                    store = _store(server, bucket, proxy.url, mode)
                    manifest = build_manifest(src, 1 + r, 0, 1, created=time.time())
                    started = time.monotonic()
                    Drainer(store, part_size=5 << 20, concurrency=args.concurrency).drain(
                        src, manifest, journal_path=Path(tmp) / f"j-{mode}-{r}")
                    results[mode].append({"seconds": time.monotonic() - started,
                                          "throttled": proxy.throttled,
                                          "forwarded": proxy.forwarded})
    summary = {mode: {k: statistics.median(run[k] for run in runs) for k in runs[0]}
               for mode, runs in results.items()}
    print(json.dumps({"args": vars(args), "rounds": results, "median": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
