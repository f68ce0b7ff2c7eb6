"""Run benchmarks by name: `python -m benchmarks [NAME ...] [--] [ARGS]`.

Without a name, runs the transfer benchmark (throughput and rate-limit
accuracy of ckptdrain against s5cmd, boto3 and rclone on one loopback S3
server), which writes the figures docs/benchmarks.md quotes.
"""

from __future__ import annotations

import importlib
import sys

#: name -> module with main(argv) -> int
BENCHMARKS = {
    "transfer": "benchmarks.transfer",
    "agent_rss": "benchmarks.agent_rss",
    "capture": "benchmarks.capture",
    "save-capture": "benchmarks.save_capture",
    "operator_webhook": "benchmarks.operator_webhook",
    "scale": "benchmarks.scale.cli",
    "dcp": "benchmarks.dcp",
    "peer": "benchmarks.peer",
    "peer-flush": "benchmarks.peer_flush",
    "throttle": "benchmarks.throttle",
    "restore_in_pod": "benchmarks.restore_in_pod",
    "webhook_slow_clients": "benchmarks.webhook_slow_clients",
}


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        print("benchmarks:", ", ".join(BENCHMARKS))
        return 0
    # Names lead; everything after the first argument that is not one is the
    # benchmarks' own (an option's value may equal a name: `--tools peer`).
    count = next((i for i, a in enumerate(argv) if a not in BENCHMARKS), len(argv))
    names = argv[:count] or ["transfer"]
    rest = argv[count:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    code = 0
    for name in names:
        module = importlib.import_module(BENCHMARKS[name])
        code = max(code, int(module.main(rest) or 0))
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
