"""Where things live in the global store: the key layout, as pure functions.

    manifests/<step:020d>/<writer:05d>.json     one per writer, written last
    data/<step:020d>/<writer:05d>/<path>        the writer's files
    commits/<step:020d>.json                    optional record that a step was
                                                seen complete (by the operator)

Manifests live apart from data so discovery lists only small objects.
Listings are used only to *discover* candidate steps; completeness is
decided by reading each writer's manifest by its exact key, never by
trusting a listing (S3-style listings may lag writes).
"""

from __future__ import annotations

import re

from ckptdrain.manifest import check_step
from ckptdrain.paths import check_relative_path

MANIFESTS = "manifests/"
DATA = "data/"
COMMITS = "commits/"

_MANIFEST_KEY = re.compile(r"manifests/(?P<step>[0-9]{20})/(?P<writer>[0-9]{5})\.json")
_DATA_KEY = re.compile(r"data/(?P<step>[0-9]{20})/(?P<writer>[0-9]{5})/.+")


def _step(step: int) -> str:
    return f"{check_step(step):020d}"


def _writer(writer: int) -> str:
    if isinstance(writer, bool) or not isinstance(writer, int) or not 0 <= writer < 100000:
        raise ValueError(f"writer must be a whole number in [0, 100000), got {writer!r}")
    return f"{writer:05d}"


def manifest_key(step: int, writer: int) -> str:
    return f"{MANIFESTS}{_step(step)}/{_writer(writer)}.json"


def step_manifests_prefix(step: int) -> str:
    return f"{MANIFESTS}{_step(step)}/"


def data_prefix(step: int, writer: int) -> str:
    return f"{DATA}{_step(step)}/{_writer(writer)}/"


def data_key(step: int, writer: int, path: str) -> str:
    return data_prefix(step, writer) + check_relative_path(path)


def step_data_prefix(step: int) -> str:
    return f"{DATA}{_step(step)}/"


def commit_key(step: int) -> str:
    return f"{COMMITS}{_step(step)}.json"


def parse_manifest_key(key: str) -> tuple[int, int] | None:
    """(step, writer) for a manifest key; None for anything else."""
    match = _MANIFEST_KEY.fullmatch(key)
    return (int(match["step"]), int(match["writer"])) if match else None


def parse_data_key(key: str) -> tuple[int, int] | None:
    """(step, writer) for a data key; None for anything else."""
    match = _DATA_KEY.fullmatch(key)
    return (int(match["step"]), int(match["writer"])) if match else None
