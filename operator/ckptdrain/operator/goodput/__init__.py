"""Runtime goodput, the cluster side of ckptdrain/goodput.py: folded from the pods into
each policy's status (sync.py), exported per policy (metrics.py), and read back as a
report by `ckptdrain goodput` (command.py).

May import: the operator's base and apiserver/.
"""
