"""A `helm upgrade --reset-then-reuse-values` line changes a release made
before; the docs reader leaves it to the test that runs its section, and
refuses one anywhere else, where nothing would run it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.docs import pages

UPGRADE = "helm upgrade ckptdrain charts/ckptdrain -n ckptdrain --reset-then-reuse-values \\\n" \
          "  --set nodeTier.mode=hostPath\n"


def page(tmp_path: Path, heading: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(f"# A page\n\n{heading}\n\n<!-- docs-test: cluster -->\n```sh\n"
                    f"# a comment, not a heading\n{UPGRADE}```\n")
    return path


def test_an_upgrade_line_outside_the_sections_a_test_runs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="in a section no test runs"):
        pages.read(page(tmp_path, "## Some other section"))


def test_the_section_the_move_test_runs_is_left_to_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = page(tmp_path, "### Moving from the hostPath mode")
    monkeypatch.setitem(pages.RUN_BY_THEIR_OWN_TEST, path, "### Moving from the hostPath mode")
    assert pages.read(path).helm_args is None
    # install.md itself: its upgrade lines all lie in that section (read
    # raises otherwise).
    pages.read(pages.REPO / "docs" / "install.md")
