"""The catalog over a real file:// store full of mutated manifests: every
step is complete or rejected with a one-line reason; nothing else escapes."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_manifest import mutated_manifests, real_manifest

from ckptdrain import keys
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.catalog import one_line, scan


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated_manifests(), min_size=1, max_size=4))
def test_scan_of_fuzzed_manifests_sorts_every_step(docs: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalStore(Path(tmp) / "s")
        good = real_manifest()
        for step in range(1, len(docs) + 1):
            store.put_bytes(keys.manifest_key(step, 0), docs[step - 1])
        store.put_bytes(keys.manifest_key(100, 3), good.to_json())  # writers 0..2, 4..7 missing
        catalog = scan(store)
        seen = [c.step for c in catalog.complete] + [r.step for r in catalog.rejected]
        assert sorted(seen) == [*range(1, len(docs) + 1), 100]
        assert all(r.reason.isprintable() and len(r.reason) <= 300 for r in catalog.rejected)


def test_one_line_flattens_and_bounds() -> None:
    assert one_line("a\nb\x00c") == "a\\nb\\x00c"
    assert len(one_line("x" * 1000)) == 300
