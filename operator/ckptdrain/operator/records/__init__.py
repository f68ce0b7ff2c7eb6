"""Checkpoint records and what follows from them: the writers' claims folded into a
record, retention and the recovery point (aggregate.py, pure), the pass that writes
them (sync.py), which checkpoint each restored pod started from (restores.py), and the
watchdog that makes a stalled drain impossible to miss (watchdog.py).

May import: the operator's base, apiserver/ and policy/.
"""
