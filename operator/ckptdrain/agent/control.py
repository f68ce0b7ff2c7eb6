"""What the agent writes into the work dir the trainer shares with it.

The trainer may run as root, as 65532 or as any uid; what both sides have in
common is the pod's group (group_access.py). So the `.ckptdrain/` control dir
the agent makes is shared (the trainer writes its ack and its resume request
beside the agent's files) and so is each file the agent writes there.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ckptdrain import group_access
from ckptdrain.client import CONTROL_DIR
from ckptdrain.jsonfile import write_json_atomic


def write(work_dir: Path, name: str, doc: Mapping[str, object]) -> Path:
    """Replace `<work>/.ckptdrain/<name>` with `doc` (atomically), the
    directory and the file shared with the pod's group."""
    control = group_access.make_dir(Path(work_dir) / CONTROL_DIR)
    path = control / name
    write_json_atomic(path, doc)
    group_access.share(path)
    return path
