"""The control-plane scale harness: a real etcd + kube-apiserver, the real
operator as a subprocess, pods created through its real admission webhook,
and hollow agents (one process playing every writer through the node side's
own Kubernetes code) driving checkpoint rounds. `python -m benchmarks scale
--writers 500,1000 --policies 10,100 --rounds 3`; docs/scale.md says what
each figure means.

    cli.py        flags, the grid of sizes, the report files
    cluster.py    apiserver + CRDs + operator; apiserver metrics; /proc of the operator
    admission.py  pods through the webhook at a rate, with their latencies
    hollow.py     the hollow agents: records, pending bytes, leases, restores
    shares.py     one pod watch: when each share changed, and their sum
    run.py        one size, end to end: the figures
    report.py     the table, the growth exponents, JSON
"""

import sys
from pathlib import Path

# The harness starts its servers with the tests' own helpers (tests/support,
# tests/cluster), so a size runs on exactly the parts the tests trust.
_ROOT = Path(__file__).resolve().parents[2]
for _path in (_ROOT / "tests", _ROOT / "tests" / "cluster"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
