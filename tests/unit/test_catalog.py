"""The catalog (and the pull that trusts it) over a real file:// store full
of mutated manifests: every step is complete or rejected with a one-line
reason, a pull restores an intact step, and nothing else escapes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_manifest import _paths, _replace, json_values, mutated_manifests, real_manifest

from ckptdrain import keys
from ckptdrain.errors import IntegrityError
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.catalog import one_line, scan
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.scan import build_manifest


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


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_pull_over_fuzzed_newest_manifests_restores_the_good_step(data: st.DataObject) -> None:
    """Step 1 is good; step 2's manifest is a mutation of a real one whose data
    is in the store. A pull restores step 2 only if it verifies, else step 1."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = LocalStore(root / "s")
        for step in (1, 2):
            src = root / f"src{step}"
            (src / "d").mkdir(parents=True)
            (src / "a.bin").write_bytes(bytes([step]) * 3000)
            (src / "d" / "b.bin").write_bytes(b"b" * step)
            Drainer(store, part_size=1024).drain(
                src, build_manifest(src, step, 0, 1, created=1.0), journal_path=root / f"j{step}")
        real = json.loads(store.get_bytes(keys.manifest_key(2, 0)))
        doc: object = real
        for _ in range(data.draw(st.integers(1, 3))):
            where = data.draw(st.sampled_from(_paths(doc)))
            doc = _replace(doc, where, data.draw(json_values))
        store.put_bytes(keys.manifest_key(2, 0), json.dumps(doc).encode())
        (root / "out").mkdir()
        try:
            got = fetch(store, root / "out" / "dest")
        except IntegrityError:  # a mutation that still parses may not restore
            raise AssertionError("step 1 is intact and must be restored") from None
        restored = (root / "out" / "dest" / "a.bin").read_bytes()
        assert restored == bytes([got.step]) * 3000
        assert [p.name for p in (root / "out").iterdir()] == ["dest"]
