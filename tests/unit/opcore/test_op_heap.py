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
