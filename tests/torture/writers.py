"""Concurrent and repeated writers of one step.

Each round, on a fresh step: push A; push A again (identical: exit 0, "already
committed", nothing re-sent); push B (different: refused with the conflict exit
code, naming step, writer and --replace; A intact); push B --replace (B whole);
a push of C killed midway (the step stays complete and is B, whole; with
--replace, B or C whole);
two different pushes to a new step at once, then three --replace pushes at once.

Invariant: every step ends as exactly one pushed tree that `verify` passes, or
a push was refused with the conflict code; never a mix, never a destroyed step.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.torture.badinput import doc_exit_codes
from tests.torture.core import Category, Spawned, clean_env, make_tree, output_problems, run_cli
from tests.torture.kills import data_identities, push_args, rate_for
from tests.torture.ops import Ctx
from tests.torture.stores import Area, StoreKind


def run(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    conflict = doc_exit_codes().get("conflict", 6)
    rng = ctx.opts.rng
    area, proxy = kind.area("writers").proxied()
    env = clean_env(area.env)
    base = ctx.scratch / f"writers-{kind.name}"
    size = max(ctx.opts.size // 4, 256 * 1024)
    for r in range(ctx.opts.rounds):
        step = 10 * (r + 1)
        trees = {}
        for name in "ABC":
            src = base / f"{name}{r}" / f"step-{step}"
            trees[name] = (src, make_tree(src, rng, size, files=4))

        def args(name: str, *extra: str, step_: int = step,
                 trees: dict[str, tuple[Path, dict[str, bytes]]] = trees) -> list[str]:
            return push_args(trees[name][0], area.uri, "--step", str(step_), *extra)

        def holds(step_: int, trees: dict[str, tuple[Path, dict[str, bytes]]] = trees) -> str:
            """Which tree the step holds, whole ('?' for none), after checking it verifies."""
            got = ctx.pull(area, base / "dest", "--step", str(step_))[1]
            verify = ctx.cli(area, "verify", area.uri, "--step", str(step_))
            match = next((n for n, (_, d) in trees.items() if d == got), "?")
            return match if verify.rc == 0 else f"{match} (verify: {verify.brief()})"

        first = run_cli(args("A"), env)
        if not cat.check(first.rc == 0, f"step {step}: first push failed: {first.brief()}"):
            continue
        before = data_identities(area, step)
        sent = sum(proxy.sent.values()) if proxy else 0
        again = run_cli(args("A"), env)
        resent = (sum(proxy.sent.values()) - sent if proxy else 0) + sum(
            1 for k, v in data_identities(area, step).items() if before.get(k, v) != v)
        said = (again.out + again.err).lower()
        cat.check(again.rc == 0 and ("already committed" in said
                                     or '"already_committed": true' in said)
                  and resent == 0,
                  f"step {step}: identical re-push: {resent} bytes/files sent again, "
                  f"{again.brief()} {again.out[-200:]!r}")
        other = run_cli(args("B"), env)
        text = other.err.lower()
        cat.check(other.rc == conflict and not output_problems(other) and str(step) in text
                  and "--replace" in text and "writer" in text,
                  f"step {step}: different content without --replace: {other.brief()}")
        cat.check(holds(step) == "A", f"step {step}: after a refused push it holds "
                  f"{holds(step)}, not A")
        replaced = run_cli(args("B", "--replace"), env)
        cat.check(replaced.rc == 0, f"step {step}: push --replace: {replaced.brief()}")
        cat.check(holds(step) == "B", f"step {step}: after --replace it holds {holds(step)}")
        for extra, allowed in (((), "B"), (("--replace",), "BC")):
            _killed_repush(ctx, area, cat, step, args("C", *extra, "--rate", rate_for(size)),
                           env, holds, base, allowed)
        _race(ctx, cat, conflict, step + 1, [args(n, "--rate", rate_for(size), step_=step + 1)
                                             for n in "BC"], "BC", env, holds, base)
        _race(ctx, cat, conflict, step + 1,
              [args(n, "--replace", "--rate", rate_for(size), step_=step + 1) for n in "ABC"],
              "ABC", env, holds, base)


def _killed_repush(ctx: Ctx, area: Area, cat: Category, step: int, argv: list[str],
                   env: dict[str, str], holds: object, base: object, allowed: str) -> None:
    proc = Spawned(argv, env, base / "logs")  # type: ignore[operator]
    time.sleep(ctx.opts.rng.uniform(0.3, 2.5))
    proc.kill()
    listed = step in ctx.complete(area)
    held = holds(step)  # type: ignore[operator]
    what = "--replace" if "--replace" in argv else "re-push"
    cat.check(listed and held in allowed,
              f"step {step}: a {what} killed midway left it listed complete={listed}, "
              f"holding {held} (want {' or '.join(allowed)}, whole)")


def _race(ctx: Ctx, cat: Category, conflict: int, step: int, argvs: list[list[str]],
          names: str, env: dict[str, str], holds: object, base: object) -> None:
    procs = [Spawned(argv, env, base / "logs") for argv in argvs]  # type: ignore[operator]
    runs = [p.wait(300) for p in procs]
    codes = {n: r.rc for n, r in zip(names, runs, strict=True)}
    bad = [r.brief() for r in runs if r.rc not in (0, conflict) or output_problems(r)]
    winners = [n for n, c in codes.items() if c == 0]
    held = holds(step)  # type: ignore[operator]
    cat.check(not bad and bool(winners) and held in winners,
              f"step {step}: {len(argvs)} concurrent pushes exited {codes}; the step holds "
              f"{held}; {bad[:2]}")
