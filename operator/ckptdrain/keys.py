"""Where things live in the global store: the key layout, as pure functions.

    manifests/<step:020d>/<writer:05d>.json           one per writer, written last:
                                                      the commit (formats 2 and 3
                                                      name the attempt whose data it is)
    data/<spread>/<step:020d>/<writer:05d>/s<attempt>/<path>
                                                      the writer's files, one
                                                      prefix per upload attempt
                                                      ("s" + 16 lowercase hex), in
                                                      the spread layout (format 3)
    data/<step:020d>/<writer:05d>/<attempt>/<path>    the same, as format-2
                                                      manifests (16 hex) left them
    data/<step:020d>/<writer:05d>/<path>              the same, as format-1
                                                      manifests (no attempt) left them
    commits/<step:020d>.json                          optional record that a step was
                                                      seen complete (by the operator)

Manifests live apart from data so discovery lists only small objects.

Prefix spreading: S3 serves about 3,500 writes and 5,500 reads a second per
prefix, and splits a hot key range only after throttling it for a while.
Every writer of a step used to write under data/<step>/: one hot range.
`<spread>` is two hex digits of SHA-256 of the writer's id, so the writers
of a step fall evenly into 256 ranges (1,000 writers: about 4 per range),
and a reader still derives every key from the manifest, never by listing:
the attempt says which layout its data is in ("s..." is spread), so old
checkpoints keep restoring from where they are. docs/store-layout.md has
the migration.
Listings are used only to *discover* candidate steps; completeness is
decided by reading each writer's manifest by its exact key, never by
trusting a listing (S3-style listings may lag writes).

Every push or drain writes its data under a fresh attempt prefix, so the
data a committed manifest names is never overwritten: a re-push or a
concurrent writer uploads beside it, and whichever manifest lands last is
the checkpoint, whole. Data no current manifest names is orphaned, and
global retention removes it after a grace period (transfer/prune.py). The
trainer's files keep their own names below the prefix, so any S3 tool can
copy a checkpoint out. Data keys are always derived here from a validated
step, writer, attempt and path, never taken from a manifest as a string.
"""

from __future__ import annotations

import hashlib
import re
import secrets

from ckptdrain.errors import IntegrityError
from ckptdrain.manifest import check_attempt, check_step, is_spread
from ckptdrain.paths import check_relative_path

MANIFESTS = "manifests/"
DATA = "data/"
COMMITS = "commits/"

_MANIFEST_KEY = re.compile(r"manifests/(?P<step>[0-9]{20})/(?P<writer>[0-9]{5})\.json")
_DATA_KEY = re.compile(
    r"data/(?:(?P<spread>[0-9a-f]{2})/)?(?P<step>[0-9]{20})/(?P<writer>[0-9]{5})/.+")


def _step(step: int) -> str:
    return f"{check_step(step):020d}"


def _writer(writer: int) -> str:
    if isinstance(writer, bool) or not isinstance(writer, int) or not 0 <= writer < 100000:
        raise ValueError(f"writer must be a whole number in [0, 100000), got {writer!r}")
    return f"{writer:05d}"


def new_attempt() -> str:
    """A fresh attempt id in the spread layout: "s" and 16 lowercase hex digits, random."""
    return "s" + secrets.token_hex(8)


def spread(writer: int) -> str:
    """The writer's spread prefix: two hex digits of SHA-256 of its 5-digit id."""
    return hashlib.sha256(_writer(writer).encode("ascii")).hexdigest()[:2]


def manifest_key(step: int, writer: int) -> str:
    return f"{MANIFESTS}{_step(step)}/{_writer(writer)}.json"


def step_manifests_prefix(step: int) -> str:
    return f"{MANIFESTS}{_step(step)}/"


def writer_data_prefix(step: int, writer: int) -> str:
    """Everything `writer` uploaded for `step` in the layouts before spreading."""
    return f"{DATA}{_step(step)}/{_writer(writer)}/"


def writer_data_prefixes(step: int, writer: int) -> tuple[str, str]:
    """Everything `writer` ever uploaded for `step`, of every attempt and layout."""
    return (f"{DATA}{spread(writer)}/{_step(step)}/{_writer(writer)}/",
            writer_data_prefix(step, writer))


def data_prefix(step: int, writer: int, attempt: str | None) -> str:
    """The data of one attempt (None: the format-1 layout, no attempt level);
    an "s" attempt's is in the spread layout."""
    if attempt is None:
        return writer_data_prefix(step, writer)
    try:
        check_attempt(attempt)
    except IntegrityError as err:
        raise ValueError(str(err)) from None
    spread_base, old_base = writer_data_prefixes(step, writer)
    return f"{spread_base if is_spread(attempt) else old_base}{attempt}/"


def data_key(step: int, writer: int, path: str, attempt: str | None) -> str:
    return data_prefix(step, writer, attempt) + check_relative_path(path)


def commit_key(step: int) -> str:
    return f"{COMMITS}{_step(step)}.json"


def parse_manifest_key(key: str) -> tuple[int, int] | None:
    """(step, writer) for a manifest key; None for anything else."""
    match = _MANIFEST_KEY.fullmatch(key)
    return (int(match["step"]), int(match["writer"])) if match else None


def parse_data_key(key: str) -> tuple[int, int] | None:
    """(step, writer) for a data key of either layout; None for anything else
    (a spread key under another writer's spread prefix included)."""
    match = _DATA_KEY.fullmatch(key)
    if match is None:
        return None
    step, writer = int(match["step"]), int(match["writer"])
    if match["spread"] is not None and match["spread"] != spread(writer):
        return None
    return step, writer
