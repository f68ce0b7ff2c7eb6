"""`python -m benchmarks.scale …`, the same as `python -m benchmarks scale …`."""

import sys

from benchmarks.scale.cli import main

raise SystemExit(main(sys.argv[1:]))
