"""The cluster tests' reader of the apiserver's audit log
(tests/support/audit_log.py) while the apiserver writes and rotates it:
whole lines only, rotated files read too, a file renamed away mid-read
taken as not there yet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support import audit_log


def line(n: int, note: str = "") -> bytes:
    return (json.dumps({"auditID": str(n), "note": note}, ensure_ascii=False) + "\n").encode()


def ids(workdir: Path) -> list[str]:
    return [e["auditID"] for e in audit_log.events(workdir)]


def test_a_last_line_cut_inside_a_character_is_left_for_later(tmp_path: Path) -> None:
    whole, next_one = line(1, "ü"), line(2, "ü")
    cut = next_one[:next_one.index("ü".encode()) + 1]  # the first byte of two
    (tmp_path / audit_log.LOG_NAME).write_bytes(whole + cut)
    assert ids(tmp_path) == ["1"]
    assert not audit_log.holds(tmp_path, "never written")


def test_rotated_files_are_read_before_the_current_one(tmp_path: Path) -> None:
    # The backups' names, as the log backend makes them: the time of rotation.
    (tmp_path / "audit-2026-12-02T10-00-00.000.log").write_bytes(line(1))
    (tmp_path / "audit-2026-12-02T10-05-00.000.log").write_bytes(line(2))
    (tmp_path / audit_log.LOG_NAME).write_bytes(line(3))
    assert ids(tmp_path) == ["1", "2", "3"]
    assert audit_log.holds(tmp_path, '"1"')


def test_a_file_renamed_away_while_read_is_not_there_yet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / audit_log.LOG_NAME).write_bytes(line(1))
    (tmp_path / "audit-2026-12-02T10-00-00.000.log").write_bytes(line(0))

    def renamed(self: Path) -> bytes:
        raise FileNotFoundError(self)
    monkeypatch.setattr(Path, "read_bytes", renamed)
    assert audit_log.events(tmp_path) == []
    assert not audit_log.holds(tmp_path, "0")


def test_the_apiserver_is_told_when_to_rotate_and_to_keep_every_file(tmp_path: Path) -> None:
    args = audit_log.apiserver_args(tmp_path)
    assert any(a.startswith("--audit-log-maxsize=") for a in args), args
    assert "--audit-log-maxbackup=0" in args, args
