"""An agent's (and restore's) configuration as a pod gets it: the
environment, read through the real argument parser and loader."""

from __future__ import annotations

import argparse
from pathlib import Path

from ckptdrain.node import config


def agent_config(root: Path, **env: str) -> config.AgentConfig:
    """Work dir `<root>/work`, local tier `<root>/local`, and `env` on top."""
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(root / "work"), "CKPTDRAIN_LOCAL_DIR": str(root / "local"),
        **env})
