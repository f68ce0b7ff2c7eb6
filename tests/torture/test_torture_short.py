"""A short, bounded run of every torture category (the full run: `make torture`).

Small sizes and counts against file://, SeaweedFS and the GCS API server, so
it fits in the normal test run; each category must report zero failures. The counts are printed
(`pytest -s` shows them) so a run that tried nothing is visible too.
"""

from __future__ import annotations

import pytest
from tests.torture.core import CATEGORIES
from tests.torture.runner import line, options, report, sweep

pytestmark = pytest.mark.integration

#: Three small sweeps: the categories that need no server on file://, what an
#: S3 server adds (the counting proxy, outages, the canary on a real endpoint),
#: and the gs:// store under kills, corruption, hostile manifests, races and leaks.
SHORT = [
    {"stores": ["file"], "only": ("kills", "corruption", "hostile", "badinput", "diskfull",
                                  "writers", "agreement", "leaks"), "kills": 3, "manifests": 8,
     "agreements": 12},
    {"stores": ["seaweedfs"], "only": ("kills", "outages", "canary", "leaks"), "kills": 1},
    {"stores": ["gcs"], "only": ("kills", "corruption", "hostile", "writers", "leaks"),
     "kills": 1, "manifests": 8},
]
COMMON = {"outages": 1, "rounds": 1, "size": 1 << 20, "seed": 7}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[object]]:
    found: dict[str, list[object]] = {}
    for plan in SHORT:
        opts = options(**plan, **COMMON, scratch=tmp_path_factory.mktemp("torture"))
        for cat in sweep(opts, log=lambda text: print(text, flush=True)):
            found.setdefault(cat.name, []).append(cat)
    return found


@pytest.mark.parametrize("category", CATEGORIES)
def test_category_has_no_failures(results: dict[str, list[object]], category: str) -> None:
    cats = results.get(category, [])
    assert cats, f"{category} did not run"
    for cat in cats:
        print(line(cat))  # type: ignore[arg-type]
        assert cat.skipped or cat.tried > 0, f"{category} tried nothing"  # type: ignore[attr-defined]
    failed = [c for c in cats if c.failed]  # type: ignore[attr-defined]
    assert not failed, report(failed, as_json=False)  # type: ignore[arg-type]
