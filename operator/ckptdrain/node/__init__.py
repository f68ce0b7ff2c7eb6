"""The node side's shared rooms, used by agent/, restore/ and demo/ alike: the
local (NVMe) tier and its durable copies, step directory names, the config
the agent and restore read from the injected environment, and the node's
calls to the apiserver. Nothing here imports operator/ (tests/unit/test_layering.py).
"""
