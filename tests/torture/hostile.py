"""Hostile manifests: known cases plus property-based mutations of a real manifest.

Step 1 and step 2 are pushed for real; each case replaces step 2's manifest and
then runs `ls`, `pull`, `verify` and `ckptdrain restore`.

Invariants: no traceback and a documented exit code; nothing written outside
the destination (a sandbox around it is compared before and after); a known
case shows step 2 incomplete; pull and restore deliver either step 1's exact
bytes or (for a mutation that still describes real data) only true bytes of
step 2 — never bytes that were not pushed; restore never claims a fresh start.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from tests.torture.core import Category, clean_env, make_tree, output_problems, run_cli, snapshot
from tests.torture.hostile_cases import INVALID, TOLERATED, known_cases, mutated
from tests.torture.kills import push_args
from tests.torture.ops import Ctx
from tests.torture.stores import Area, StoreKind

MKEY = f"manifests/{2:020d}/00000.json"


class Bench:
    """The stage every case runs on: the store, the sandbox and the truth."""

    def __init__(self, ctx: Ctx, kind: StoreKind, cat: Category) -> None:
        self.ctx, self.cat = ctx, cat
        self.area: Area = kind.area("hostile")
        self.base = ctx.scratch / f"hostile-{kind.name}"
        self.sandbox = self.base / "sandbox"
        self.escape = self.sandbox / "escaped"
        self.dest, self.work = self.sandbox / "dest", self.sandbox / "work"
        self.sources: dict[int, dict[str, bytes]] = {}
        self.ready = False
        for step in (1, 2):
            src = self.base / f"step-{step}"
            self.sources[step] = make_tree(src, ctx.opts.rng, max(ctx.opts.size // 16, 16384),
                                           files=4)
            pushed = run_cli(push_args(src, self.area.uri), clean_env(self.area.env))
            if not cat.check(pushed.rc == 0, f"setup push failed: {pushed.brief()}"):
                return
        self.original = self.area.get(MKEY)
        self.data = set(self.area.step_data_keys(2))
        if not cat.check(bool(self.data), "setup: step 2 has no data objects to compare against"):
            return
        self.doc: dict[str, Any] = json.loads(self.original)
        self.escape.mkdir(parents=True, exist_ok=True)
        self.ready = True

    def delivered(self, step: object, got: dict[str, bytes]) -> str:
        """'' when `got` is an honest delivery of `step`, else why not."""
        if step == 1:
            return "" if got == self.sources[1] else "step 1's bytes differ"
        if step == 2:
            wrong = [p for p, h in got.items() if self.sources[2].get(p) != h]
            return f"bytes never pushed: {wrong[:3]}" if wrong else ""
        return f"restored step {step!r}"

    def case(self, what: str, payload: bytes, cls: str = TOLERATED) -> None:
        ctx, area = self.ctx, self.area
        for path in (self.dest, self.work):
            shutil.rmtree(path, ignore_errors=True)
        before = snapshot(self.sandbox)
        area.put(MKEY, payload)
        problems: list[str] = []
        known = cls != TOLERATED
        try:
            ls, rows = ctx.ls(area)
            if output_problems(ls, {0}):
                problems.append(f"ls: {'; '.join(output_problems(ls, {0}))}: {ls.brief()}")
            elif cls == INVALID and rows.get(2, {}).get("complete", True):
                problems.append("ls does not show step 2 incomplete")
            pull = ctx.cli(area, "pull", area.uri, str(self.dest), "--json", timeout=60)
            step = _json(pull.out).get("step")
            from tests.torture.core import tree_digest

            if output_problems(pull, {0}):
                problems.append(f"pull: {'; '.join(output_problems(pull, {0}))}: {pull.brief()}")
            elif why := self.delivered(step, tree_digest(self.dest)):
                problems.append(f"pull: {why}")
            if known and step != 1:
                problems.append(f"pull restored step {step}, not the intact step 1")
            verify = ctx.cli(area, "verify", area.uri, timeout=60)
            if output_problems(verify, {0, 4}):
                problems.append(f"verify: {'; '.join(output_problems(verify, {0, 4}))}: "
                                f"{verify.brief()}")
            rest, doc = ctx.restore(area, self.work, self.sandbox / "nolocal", timeout=60)
            if output_problems(rest, {0}) or doc.get("fresh_start", True):
                problems.append(f"restore: {'; '.join(output_problems(rest, {0}))} "
                                f"fresh_start={doc.get('fresh_start')}: {rest.brief()}")
            elif why := self.delivered(doc.get("step"), tree_digest(Path(doc["path"]))):
                problems.append(f"restore: {why}")
            if known and doc.get("step") not in (1, None):
                problems.append(f"restore took step {doc.get('step')}, not the intact step 1")
            outside = snapshot(self.sandbox, skip=(self.dest, self.work)) - before
            outside = {p for p in outside if not p.endswith("-restore.json")
                       and not Path(p).name.startswith(".dest.")}
            if outside:
                problems.append(f"wrote outside the destination: {sorted(outside)[:5]}")
        finally:
            area.put(MKEY, self.original)
            for key in set(area.step_data_keys(2)) - self.data:
                area.delete(key)
                problems.append(f"wrote into the store: {key}")
        self.cat.check(not problems, f"{what}: " + "; ".join(problems))


def _json(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def run(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    bench = Bench(ctx, kind, cat)
    if not bench.ready:
        return
    cases = known_cases(bench.doc, str(bench.escape))
    # The known cases first, and always a few fuzzed ones (a quarter of a short run).
    n = max(ctx.opts.manifests, 2)
    known = min(len(cases), n - n // 4)
    for what, payload, cls in cases[:known]:
        cat.add("known cases")
        bench.case(what, payload, cls)
    fuzzed = n - known
    if not fuzzed:
        return

    @seed(ctx.opts.seed)
    @settings(max_examples=fuzzed, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(mutated(bench.doc, str(bench.escape)))
    def one(example: tuple[str, bytes]) -> None:
        cat.add("fuzzed")
        bench.case(*example)

    one()
