"""Benchmarks: `python -m benchmarks` (see docs/benchmarks.md). Timings live here, not in tests."""
