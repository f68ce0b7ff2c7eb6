"""The drain bandwidth of every policy under the cluster cap: the joint budgets,
recomputed only where something changed (budgets.py), the passes that publish them
with their status conditions (rebalance.py), and the share channel the agents read
(share_channel.py).

May import: the operator's base, apiserver/ and policy/.
"""
