"""Which checkpoints a store holds, and which of them are complete.

A listing of `manifests/` only *suggests* candidate steps (listings may lag
writes). Completeness is decided by reading every writer's manifest by its
exact key: a step is complete only when writers 0..N-1 all have a manifest
that parses, names that step and writer, and agrees on N. Anything wrong with
a manifest makes its step rejected, with a reason of one printable line.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptdrain import keys
from ckptdrain import manifest as manifest_mod
from ckptdrain.errors import IntegrityError, ObjectMissing
from ckptdrain.manifest import WriterManifest, check_consistent
from ckptdrain.store.base import Store


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: one verified manifest per writer, in writer order."""

    step: int
    manifests: tuple[WriterManifest, ...]

    @property
    def writers(self) -> int:
        return len(self.manifests)

    @property
    def total_bytes(self) -> int:
        return sum(m.total_bytes for m in self.manifests)

    @property
    def created(self) -> float:
        return max(m.created for m in self.manifests)


@dataclass(frozen=True)
class Rejected:
    """A step that has some manifests but is not complete, and why."""

    step: int
    reason: str


@dataclass(frozen=True)
class Catalog:
    complete: list[Checkpoint]  # newest first
    rejected: list[Rejected]  # newest first


def candidate_steps(store: Store) -> list[int]:
    """Steps with at least one manifest key in a listing, newest first."""
    steps = set()
    for info in store.list(keys.MANIFESTS):
        parsed = keys.parse_manifest_key(info.key)
        if parsed is not None:
            steps.add(parsed[0])
    return sorted(steps, reverse=True)


def read_manifest(store: Store, key: str) -> WriterManifest:
    """The manifest at `key`, parsed and validated. ObjectMissing if there is
    none; IntegrityError if it is invalid, or larger than any manifest may be
    (refused by its size, before its bytes are read: a multi-GB object at a
    manifest key must not exhaust memory)."""
    return WriterManifest.from_json(store.get_bytes(key, limit=manifest_mod.MAX_MANIFEST_BYTES))


def _read_manifest(store: Store, step: int, writer: int) -> WriterManifest:
    key = keys.manifest_key(step, writer)
    try:
        manifest = read_manifest(store, key)
    except ObjectMissing:
        raise IntegrityError(f"step {step}: writer {writer}'s manifest is missing") from None
    except IntegrityError as err:
        # Keep the class (UnsafePath stays UnsafePath) and say which manifest.
        raise type(err)(f"step {step}: writer {writer}'s manifest is invalid: {err}") from None
    if (manifest.step, manifest.writer) != (step, writer):
        raise IntegrityError(
            f"{key} describes step {manifest.step} writer {manifest.writer}, not its own key"
        )
    return manifest


def load_checkpoint(store: Store, step: int) -> Checkpoint:
    """Read and check every writer's manifest of `step` by exact key.

    Raises IntegrityError saying why the step is not complete."""
    first = _read_manifest(store, step, 0)
    manifests = [first] + [_read_manifest(store, step, w) for w in range(1, first.writers)]
    check_consistent(manifests)
    return Checkpoint(step, tuple(manifests))


def scan(store: Store) -> Catalog:
    """Every candidate step, sorted into complete and rejected (with the reason)."""
    complete, rejected = [], []
    for step in candidate_steps(store):
        try:
            complete.append(load_checkpoint(store, step))
        except IntegrityError as err:
            rejected.append(Rejected(step, one_line(str(err))))
    return Catalog(complete, rejected)


def one_line(text: str, limit: int = 300) -> str:
    """`text` as one printable line of at most `limit` characters."""
    flat = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def complete_steps(store: Store) -> list[Checkpoint]:
    """Complete checkpoints, newest first. Incomplete ones are never returned."""
    return scan(store).complete
