"""operator/heap.py: after a burst is freed, the trim gives its pages back,
so the operator's resident size follows what it keeps, not its peak."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ckptdrain.operator import heap

BURST = textwrap.dedent("""
    import json, sys
    from ckptdrain.operator import heap

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096

    kept = []
    burst = []
    for i in range(120_000):  # a burst of pod-like objects, a few of them kept
        obj = {"metadata": {"name": f"pod-{i}", "annotations": {"a": "x" * 200}},
               "spec": {"containers": [{"env": [{"name": str(j)} for j in range(8)]}]}}
        burst.append(obj)
        if i % 1000 == 0:
            kept.append({"name": f"pod-{i}"})
    peak = rss()
    del burst, obj
    freed = rss()
    assert heap.trim()
    print(json.dumps({"peak": peak, "freed": freed, "trimmed": rss(), "kept": len(kept)}))
""")


@pytest.mark.skipif(heap._libc() is None, reason="the C library is not glibc")
def test_a_freed_burst_goes_back_to_the_system_with_the_deployed_allocator() -> None:
    env = {**os.environ, "PYTHONMALLOC": "malloc"}
    out = subprocess.run([sys.executable, "-c", BURST], env=env, capture_output=True,
                         text=True, check=True).stdout
    import json
    got = json.loads(out)
    burst = got["peak"] - got["trimmed"]
    assert got["peak"] - got["freed"] < burst, "nothing for the trim to do: no test"
    assert burst > 100 * 2**20, got  # most of the burst's pages are back


def test_start_is_once_per_process() -> None:
    first = heap.start()
    assert heap.start() == first
    names = [t.name for t in __import__("threading").enumerate()]
    assert names.count("ckptdrain-heap-trim") == (1 if first else 0)


def test_a_trim_waits_for_a_quiet_moment_once_per_burst() -> None:
    q, cap = heap.QUIET_S, heap.MAX_WAIT_S
    # busy a moment ago: wait
    assert not heap.due(now=100.0, last_busy=100.0 - q / 2, last_trim=50.0, busy_at_trim=40.0)
    # quiet since, and busy since the last trim: trim
    assert heap.due(now=100.0, last_busy=100.0 - q, last_trim=50.0, busy_at_trim=40.0)
    # quiet, but nothing happened since the last trim: nothing to give back
    assert not heap.due(now=100.0, last_busy=90.0, last_trim=95.0, busy_at_trim=90.0)
    # never quiet: still trimmed now and then
    assert heap.due(now=100.0 + cap, last_busy=100.0 + cap, last_trim=100.0, busy_at_trim=99.0)
