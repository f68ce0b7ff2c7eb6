"""Checkpoint recency on the workload: the newest step surviving each
failure domain, published on the object that owns the training pods (and on
Kueue's Workload), for schedulers and people deciding what a preemption costs."""
