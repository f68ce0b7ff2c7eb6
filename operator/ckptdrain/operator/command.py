"""`ckptdrain operator`, as a sub-command of the one CLI (flags and run live in main.py)."""

from ckptdrain.operator.main import add_arguments
from ckptdrain.operator.main import run_parsed as run

__all__ = ["add_arguments", "run"]
