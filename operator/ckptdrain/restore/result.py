"""The restore result file the trainer reads (`ckptdrain.client.Client.restored`).

    {"fresh_start": false, "step": 42, "tier": "local", "path": "/ckptdrain/work/step-42",
     "bytes": 268435456, "seconds": 0.41, "writer": 0, "writers": 1,
     "skipped": [{"step": 43, "tier": "local", "reason": "a.bin: crc32c ..."}],
     "source": "/ckptdrain/local/step-42", "at": 1700000000.0}

`fresh_start` true (and no step) means nothing was found anywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ckptdrain.client import write_json_atomic


@dataclass(frozen=True)
class Skipped:
    step: int | None
    tier: str
    reason: str


@dataclass
class RestoreResult:
    fresh_start: bool
    writer: int
    writers: int
    at: float
    step: int | None = None
    tier: str | None = None
    path: str | None = None
    source: str | None = None
    bytes: int = 0
    seconds: float = 0.0
    skipped: list[Skipped] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def write(self, path: Path) -> None:
        write_json_atomic(path, self.to_dict())
