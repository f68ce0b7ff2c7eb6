"""The peer tier: a copy of each writer's newest local steps on a partner
agent on another node (docs/peer-tier.md)."""
