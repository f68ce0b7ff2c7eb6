"""Storage version migration of the CheckpointPolicy CRD (plan.py: pure;
run.py: the leader's thread that does it)."""
