"""Where Kueue's settings and a policy's can fight: the pure checks
(settings.py, conflicts.py; policy/placement_fit.py) and the operator's thin edge
that reads Kueue's objects and says what it found (reads.py, report.py)."""
