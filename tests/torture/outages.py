"""Store outages: the S3 server killed (and restarted) or frozen (SIGSTOP, then
SIGCONT) while `push` or `pull` runs.

Invariants: push either finishes once the server is back or fails with the
store's exit code and one clear line, and a rerun then finishes with a step
that verifies; pull either delivers the exact step or fails cleanly with DEST
showing nothing; never a wrong checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.torture.core import (
    Category,
    Spawned,
    clean_env,
    make_tree,
    output_problems,
    run_cli,
    tree_digest,
    visible,
)
from tests.torture.kills import check_listed, push_args, rate_for
from tests.torture.ops import Ctx, same
from tests.torture.stores import StoreKind

STORE_FAILED = 3


def run(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    rng = ctx.opts.rng
    area = kind.area("outages")
    env = clean_env(area.env)
    base = ctx.scratch / f"outages-{kind.name}"
    step = 0
    for r in range(ctx.opts.outages):
        for fault in ("kill", "freeze"):
            step += 1
            src = base / f"step-{step}"
            digest = make_tree(src, rng, ctx.opts.size, files=5)
            args = push_args(src, area.uri, "--rate", rate_for(ctx.opts.size, 3.0))
            proc = Spawned(args, env, base / "logs")
            time.sleep(rng.uniform(0.8, 3.0))
            _outage(kind, fault, rng.uniform(0.5, 3.0))
            got = proc.wait(300)
            cat.add(f"push + server {fault}")
            cat.add(f"push exit {got.rc} after a {fault}")
            cat.check(got.rc in (0, STORE_FAILED) and not output_problems(got),
                      f"push during a server {fault}: {got.brief()}")
            check_listed(ctx, area, cat, step, f"after a server {fault} during push")
            if got.rc != 0:
                again = run_cli(args, env)
                cat.check(again.rc == 0, f"push rerun after a server {fault}: {again.brief()}")
            verify = ctx.cli(area, "verify", area.uri, "--step", str(step))
            cat.check(verify.rc == 0, f"step {step} after a server {fault}: {verify.brief()}")

            # A pull of a small step is over in a blink: the outage starts first and
            # ends while the pull waits on the dead or frozen server.
            dest = base / f"pull-{r}-{fault}" / "dest"
            _down(kind, fault)
            pull = Spawned(["pull", area.uri, str(dest), "--step", str(step),
                            "--concurrency", "2"], env, base / "logs")
            time.sleep(rng.uniform(0.5, 4.0))
            _up(kind, fault)
            got = pull.wait(300)
            cat.add(f"pull + server {fault}")
            shown = tree_digest(dest)
            ok = (got.rc == 0 and same(shown, digest)) or (
                got.rc == STORE_FAILED and not visible(dest))
            cat.check(ok and not output_problems(got),
                      f"pull during a server {fault}: DEST holds {len(shown)} files "
                      f"(right bytes: {shown == digest}): {got.brief()}")
            if got.rc != 0:
                again, shown = ctx.pull(area, Path(dest), "--step", str(step))
                cat.check(same(shown, digest), f"pull rerun after a server {fault}: "
                          f"{again.brief()}")


def _outage(kind: StoreKind, fault: str, seconds: float) -> None:
    """Kill (then restart) or freeze (then thaw) the server for about `seconds`."""
    _down(kind, fault)
    try:
        time.sleep(seconds)
    finally:
        _up(kind, fault)


def _down(kind: StoreKind, fault: str) -> None:
    if fault == "kill":
        kind.kill_server()
    else:
        kind.freeze()


def _up(kind: StoreKind, fault: str) -> None:
    if fault == "kill":
        kind.restart_server()
    else:
        kind.thaw()
