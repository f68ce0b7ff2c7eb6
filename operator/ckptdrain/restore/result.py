"""The restore result file the trainer reads (`ckptdrain.client.Client.restored`).

    {"outcome": "restored", "fresh_start": false, "step": 42, "tier": "local",
     "name": "step-42", "path": "/ckptdrain/work/step-42",
     "bytes": 268435456, "seconds": 0.41,
     "writer": 0, "writers": 1, "reason": "",
     "skipped": [{"step": 43, "tier": "local", "reason": "a.bin: crc32c ..."}],
     "source": "/ckptdrain/local/step-42", "at": 1700000000.0, "attempts": 1}

`outcome` is one of OUTCOMES, with the exit code of `ckptdrain restore`:

    restored          0  a checkpoint is in place (step, tier, path)
    reshard           0  the newest step was saved by another writer count
                         (`step_writers`): nothing placed, the trainer loads
                         it resharded (restore/reshard.py)
    fresh_start       0  the store answered and nothing exists anywhere, or the
                         pod's ckptdrain.io/restore annotation says `skip`
                         (reason "skipped by annotation")
    disabled          0  restore is switched off for this policy
    cannot_place      1  a checkpoint exists but could not be written here
                         (work volume full, over quota or read-only)
    store_unavailable 3  the global tier could not be asked (or failed mid-fetch)
                         until restore.retryDeadline, nothing local was usable
    none_verified     4  checkpoints exist but none verified
    history_elsewhere 5  nothing at the store, or only a step older than one
                         the policy's checkpoints reached under an earlier
                         prefix before its store moved (CKPTDRAIN_EARLIER_STORES,
                         restore/elsewhere.py): the reason names both and the
                         two ways on (copy them, or relocation.startFresh)

`name` is the restored step's directory in the work dir that holds this
file; `path` is that directory as the trainer mounts it (CKPTDRAIN_TRAINER_WORK_DIR,
by default the work dir: restore and the agent may reach the same directory
through another mount). A reader resolves `name` in its own work dir.
The file, like the step, is readable by the pod's group (group_access.py).

`fresh_start` is true only for `fresh_start` and `disabled`: a trainer told
"fresh start" throws away every step it had, so a checkpoint that exists but
could not be restored (here, or under the prefix the policy's store moved
from) must never read as one. `reason` says why in one line
when nothing was restored (or why nothing was on purpose). `attempts`
counts the tries against a store that did not answer (restore/retry.py).
From the global tier, `io` says how the files were written ("direct",
"spliced" or "buffered") and `direct_bytes` how many went by direct I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ckptdrain import group_access, units
from ckptdrain.jsonfile import write_json_atomic


@dataclass(frozen=True)
class Skipped:
    step: int | None
    tier: str
    reason: str


OUTCOMES = {"restored": 0, "reshard": 0, "fresh_start": 0, "disabled": 0, "cannot_place": 1,
            "store_unavailable": 3, "none_verified": 4, "history_elsewhere": 5}


@dataclass
class RestoreResult:
    fresh_start: bool
    writer: int
    writers: int
    at: float
    outcome: str = "fresh_start"
    reason: str = ""
    step: int | None = None
    tier: str | None = None
    path: str | None = None
    #: The restored step's directory name (`step-<N>`) in the work dir.
    name: str | None = None
    source: str | None = None
    bytes: int = 0
    seconds: float = 0.0
    skipped: list[Skipped] = field(default_factory=list)
    attempts: int = 1
    #: When the restored step was captured (its manifest's `created`): the
    #: interruption lost the training since then (docs/goodput.md).
    step_created: float | None = None
    #: From the global tier: how the files were written ("direct",
    #: "spliced" or "buffered": transfer/range_fetch.py) and how many bytes
    #: went by direct I/O; None and 0 from the local or peer tier.
    io: str | None = None
    direct_bytes: int = 0
    #: With several writers: the step the ranks agreed on, in which round,
    #: why, and how this rank came to it (restore/agreement.py); None when
    #: ranks did not coordinate.
    agreement: dict[str, object] | None = None
    #: The timeline the trainer continues: the agent tags the steps it
    #: captures with it, so ranks never mix two timelines' copies of a step.
    timeline: str | None = None
    #: How many writers saved `step`, when not this job's count (outcome
    #: "reshard"); None otherwise.
    step_writers: int | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def write(self, path: Path) -> None:
        if not path.parent.is_dir():
            group_access.make_dir(path.parent)
        write_json_atomic(path, self.to_dict())
        group_access.share(path)  # the trainer may run as any uid of the pod's group


def skipped_lines(result: RestoreResult) -> list[str]:
    """One line per candidate restore skipped, with why."""
    lines = []
    for skipped in result.skipped:
        what = (f"the {skipped.tier} tier" if skipped.step is None
                else f"{skipped.tier} step {skipped.step}")
        lines.append(f"ckptdrain restore: skipped {what}: {skipped.reason}")
    return lines


def summary_line(result: RestoreResult, code: int) -> str:
    """The line restore ends with (and its termination message): what was
    placed, and how; or why nothing was."""
    if result.outcome == "reshard":
        return f"ckptdrain restore: {result.reason}"
    if result.step is not None:
        return (f"ckptdrain restore: step {result.step} from the {result.tier} tier, "
                f"{units.format_bytes(result.bytes)} in {units.format_duration(result.seconds)}"
                f" ({units.format_rate(result.bytes / max(result.seconds, 1e-6))})"
                f"{_written(result)}{_agreed(result)} -> {result.path}")
    if code == 0:
        return (f"ckptdrain restore: fresh start ({result.reason})" if result.reason
                else "ckptdrain restore: no checkpoint anywhere: fresh start")
    more = "; see skipped above" if result.skipped else ""
    return f"ckptdrain restore: {result.outcome}: {result.reason} (exit {code}){more}"


def _agreed(result: RestoreResult) -> str:
    """How the ranks came to the step, when they coordinated."""
    a = result.agreement
    if not a:
        return ""
    return f"; ranks {a.get('how')} it in round {a.get('round')} ({a.get('why')}: " \
        f"{a.get('detail')})"


def _written(result: RestoreResult) -> str:
    """How a global restore wrote its files."""
    if result.io == "direct":
        return f", {units.format_bytes(result.direct_bytes)} by direct I/O"
    return f", {result.io}" if result.io else ""
