"""Reaching the apiserver: how the admission process connects and reads without the
`kubernetes` package (connection.py, reads.py), the views it keeps current by list and
watch (watched_view.py), what is kept of an object held in memory (slim.py), the few
writes the operator makes outside Kopf (kube.py), and which replica reconciles
(leadership.py).

May import: the operator's base (config, metrics, coalesce, heap). Nothing else of the
operator: every other room stands on this one.
"""
