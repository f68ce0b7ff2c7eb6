"""ckptdrain: cheap, fast and survivable checkpoints for large training jobs."""

__version__ = "0.3.0"
