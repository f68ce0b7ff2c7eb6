"""docs/security.md shows the hostile-tenant suite as it runs: its table
lists the attempts the suite makes (tests/cluster/hostile_record.py), in its
order, each with what refused it and where that is logged as the suite's
run asserts they were (hostile_record.EXPECTED), the open ones as not
refused and no other; its totals count them; and its command runs the
suite and writes the table where it says."""

from __future__ import annotations

import re
import shlex

from tests.cluster.hostile_record import ATTEMPTS, BESIDE, EXPECTED, OPEN, TABLE_ENV, cell
from tests.docs import blocks
from tests.docs.blocks import REPO

PAGE = REPO / "docs" / "security.md"
SUITE = "tests/cluster/test_hostile_tenant.py"
PAYLOADS = "tests/cluster/test_webhook_payloads.py"


def table_rows() -> list[list[str]]:
    """The cells of the measured run's table (header and rule left out)."""
    text = PAGE.read_text().split("## The measured run", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]
    assert rows[0] == ["attempt", "refused by", "logged", "leaked"], rows[0]
    return rows[2:]


def test_the_table_lists_the_suites_attempts_in_its_order() -> None:
    rows = table_rows()
    assert [row[0] for row in rows] == list(ATTEMPTS)
    for name, refused_by, logged, leaked in rows:
        expected_by, expected_log = EXPECTED[name]
        assert (refused_by, logged) == (cell(expected_by), expected_log or "—"), name
        assert (refused_by == "NOT REFUSED") == (name in OPEN or not expected_by), name
        assert leaked.isdigit(), (name, leaked)
        if name not in OPEN:
            assert leaked == "0", name


def test_the_totals_count_the_rows() -> None:
    rows = table_rows()
    leaked = sum(int(row[3]) for row in rows)
    totals = f"attempts: {len(ATTEMPTS)}, refused: {len(ATTEMPTS) - len(OPEN) - len(BESIDE)}, " \
             f"admitted beside A's: {len(BESIDE)}, open: {len(OPEN)}, leaked: {leaked}, " \
             "not run: 0"
    assert totals in PAGE.read_text()


def bullets(heading: str) -> int:
    section = PAGE.read_text().split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return len(re.findall(r"^- \*\*", section, re.MULTILINE))


def test_each_open_attempt_is_explained_under_open() -> None:
    assert bullets("Open: attempts not refused today") == len(OPEN)


def test_each_attempt_admitted_beside_as_data_is_explained() -> None:
    assert bullets("Admitted, and why that reaches nothing of A's") == len(BESIDE)


def test_the_command_runs_the_suite_and_writes_the_table() -> None:
    (command,) = [b for b in blocks.parse(PAGE) if b.lang == "bash" and SUITE in b.text]
    words = shlex.split(command.text.replace("\\\n", " ").splitlines()[0])
    assert words[0] == f"{TABLE_ENV}=hostile-tenant.md", words
    assert SUITE in words and (REPO / SUITE).is_file()
    assert "cat hostile-tenant.md" in command.text


def test_the_webhook_payload_figures_name_their_test_and_its_variable() -> None:
    """The hostile-payload sample's figures are quoted with the command that
    writes them, and that test exists and reads that variable."""
    (command,) = [b for b in blocks.parse(PAGE) if b.lang == "bash" and PAYLOADS in b.text]
    words = shlex.split(command.text.replace("\\\n", " ").splitlines()[0])
    variable, _, figures = words[0].partition("=")
    assert PAYLOADS in words and variable in (REPO / PAYLOADS).read_text()
    assert f"cat {figures}" in command.text
    section = PAGE.read_text().split("## Hostile webhook payloads", 1)[1].split("\n## ", 1)[0]
    assert "cases sent:" in section and "RSS:" in section
