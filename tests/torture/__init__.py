"""The torture suite: kills, outages, corruption, hostile manifests, bad input,
secrets, full disks, concurrent writers and leaks, against real stores.

    python -m tests.torture --store all --kills 100 --manifests 500

Each category counts what it tried and what failed; docs/reliability.md says
what each one does and which invariants it checks.
"""
