"""Rate-limit accuracy, measured on the wire: `ckptdrain push --rate` and
`rclone copy --bwlimit` upload through a counting TCP proxy in front of the
server (benchmarks/transfer.py runs it after the throughput rounds)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import CountingProxy, MiB, rate_stats

BIN = Path(sys.executable).parent


def rate_accuracy(server: Any, bucket: str, data: Path, work: Path, targets: list[int],
                  span: float, env_for: Callable[[str], dict[str, str]]) -> dict[str, Any]:
    """Per tool and target (MiB/s): the mean error and the worst 1 s window
    over `span` seconds after a 2 s settle. `env_for(endpoint)` is the
    tools' environment for that endpoint (the proxy's)."""
    host, port = server.endpoint_url.split("//")[1].split(":")
    proxy = CountingProxy(host, int(port))
    env = env_for(f"http://127.0.0.1:{proxy.port}")
    results: dict[str, Any] = {}
    try:
        for mib in targets:
            target = mib * MiB
            tools = {
                "ckptdrain": [str(BIN / "ckptdrain"), "push", str(data),
                              f"s3://{bucket}/rate-ckptdrain-{mib}", "--step", "1", "--rate",
                              f"{mib}MiB/s", "-q", "--journal", str(work / f"rate-{mib}.j")],
                "rclone": [str(BIN / "rclone"), "copy", str(data),
                           f"bench:{bucket}/rate-rclone-{mib}", "--bwlimit", f"{mib}M", "-q"],
            }
            for name, argv in tools.items():
                proxy.reset()
                proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                deadline = time.monotonic() + span + 15
                while time.monotonic() < deadline and proc.poll() is None:
                    if proxy.events and time.monotonic() > proxy.events[0][0] + 2 + span + 0.5:
                        break
                    time.sleep(0.2)
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                stats = rate_stats(proxy.reset(), target, span=span)
                server.delete_prefix(bucket, f"rate-{name}-{mib}/")
                results[f"{name}.{mib}MiB/s"] = {"target": target, **stats}
                print(f"  {name:9} {mib:3d} MiB/s: mean {stats['mean_error']:+.2%}, "
                      f"worst 1 s window {stats['worst_1s_excess']:+.2%} "
                      f"over {stats.get('seconds', 0):.0f} s", flush=True)
    finally:
        proxy.close()
    return results
