"""The error taxonomy: what went wrong, said so a person can act on it.

Every error a user can cause or fix carries the exit code the CLI returns, so
scripts can tell bad input from an unreachable store from a corrupt checkpoint.
"""

from __future__ import annotations


class CkptdrainError(Exception):
    """Base of every error ckptdrain raises on purpose."""

    exit_code = 1


class InvalidInput(CkptdrainError):
    """A value a person typed or wrote in a spec is wrong.

    The message names the field, what was expected, and what was seen.
    """

    exit_code = 2

    def __init__(self, field: str, expected: str, seen: object) -> None:
        self.field = field
        self.expected = expected
        self.seen = seen
        got = "nothing was given" if seen is None else f"got {seen!r}"
        super().__init__(f"{field}: expected {expected}, {got}")


class StoreError(CkptdrainError):
    """The object store could not do what was asked (reachable or not)."""

    exit_code = 3


class StoreUnreachable(StoreError):
    """The endpoint did not answer; usually transient."""


class StoreAccessDenied(StoreError):
    """Credentials are missing, wrong, or lack a permission."""


class BucketMissing(StoreError):
    """The bucket named in the URI does not exist."""


class ObjectMissing(StoreError):
    """A key that should exist does not."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"object not found: {key}")


class GenerationChanged(StoreError):
    """A request pinned to an object's generation found another one there
    (HTTP 412 from GCS): someone else wrote the name meanwhile."""


class IntegrityError(CkptdrainError):
    """Bytes do not match their manifest: size, checksum, or shape."""

    exit_code = 4


class ObjectTooLarge(IntegrityError):
    """An object is larger than its reader allows (a manifest of many GB at a
    manifest key): refused before its bytes are read, never after."""


class UnsafePath(IntegrityError):
    """A path from a manifest would escape its destination or is malformed."""


class CommitConflict(CkptdrainError):
    """The step already holds a different committed checkpoint for this writer.

    Committed checkpoints are never changed behind a user's back: replacing
    one is asked for explicitly (`push --replace`)."""

    exit_code = 6


class NoCheckpoint(CkptdrainError):
    """No complete checkpoint matches what was asked for."""

    exit_code = 5


class Interrupted(CkptdrainError):
    """Stopped by Ctrl-C or SIGTERM before the work was done (a push resumes
    from its journal when run again)."""

    exit_code = 130


class UnsafeSource(InvalidInput):
    """A directory to checkpoint is missing, vanished, is a symlink, or holds
    something other than directories and regular files (localfs.regular_files).

    Raised the same way for `push` and for the agent's capture: a checkpoint is
    plain files, and following a link could publish something outside it.
    """
