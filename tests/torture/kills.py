"""Kills: SIGKILL of `push`, of the agent, and of `pull`/`restore`, at random moments.

Invariants after every kill and rerun:
- no partial step is ever listed complete (a step `ls --json` calls complete verifies);
- no partial step is ever restored (DEST / the work dir shows nothing or the whole step);
- every rerun resumes and finishes, and `verify` passes;
- no finished file is sent again (S3: a counting proxy sees no upload to a key whose
  upload had completed; file://: a finished object keeps its inode).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.support.agentprocs import Pod
from tests.torture.core import (
    Category,
    MiB,
    Spawned,
    clean_env,
    make_tree,
    output_problems,
    run_cli,
    tree_digest,
    visible,
)
from tests.torture.ops import Ctx, same
from tests.torture.stores import Area, StoreKind

DATA = "data/"


def run(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    n = ctx.opts.kills
    agent_n = n // 5 or (1 if n >= 3 else 0)
    read_n = n // 5 or (1 if n >= 3 else 0)
    _push_kills(ctx, kind, cat, max(1, n - agent_n - read_n))
    if agent_n:
        _agent_kills(ctx, kind, cat, agent_n)
    if read_n:
        _read_kills(ctx, kind, cat, read_n)


def push_args(src: Path, uri: str, *extra: str) -> list[str]:
    # Small parts make many kill points; S3 refuses parts under 5 MiB, the gs://
    # store keeps the same floor (and push refuses a --part-size under it).
    part = "5MiB" if uri.startswith(("s3://", "gs://")) else "1MiB"
    create = ["--create"] if uri.startswith("file:") else []  # a fresh area's directory
    return ["push", str(src), uri, "--part-size", part, "--concurrency", "2",
            "--journal", str(src.parent / f".journal-{src.name}"), "--json", *create, *extra]


def rate_for(size: int, seconds: float = 2.0) -> str:
    """A --rate that makes a push of `size` bytes last about `seconds`."""
    return f"{max(size / seconds, 256 * 1024) / 1e6:.3f}MB/s"


def data_identities(area: Area, step: int) -> dict[str, tuple[int, int] | None]:
    return {k: area.identity(k) for k in area.keys(f"{DATA}{step:020d}/")}


def check_listed(ctx: Ctx, area: Area, cat: Category, step: int, when: str) -> None:
    """A step `ls` calls complete must verify: never a partial step listed complete."""
    run, rows = ctx.ls(area)
    cat.check(run.rc == 0 and not output_problems(run), f"{when}: ls failed: {run.brief()}")
    if rows.get(step, {}).get("complete"):
        verify = ctx.cli(area, "verify", area.uri, "--step", str(step))
        cat.check(verify.rc == 0, f"{when}: step {step} listed complete but verify says "
                  f"{verify.brief()}")


def _push_kills(ctx: Ctx, kind: StoreKind, cat: Category, count: int) -> None:
    rng, size = ctx.opts.rng, ctx.opts.size
    area, proxy = kind.area("kills").proxied()
    base = ctx.scratch / f"kills-{kind.name}"
    env = clean_env(area.env)
    killed, step, rewrites = 0, 0, 0
    while killed < count:
        step += 1
        src = base / f"step-{step}"
        digest = make_tree(src, rng, size, files=rng.randint(3, 7))
        args = push_args(src, area.uri, "--rate", rate_for(size))
        for _ in range(rng.randint(1, 3)):
            if killed >= count:
                break
            before = data_identities(area, step)
            proc = Spawned(args, env, base / "logs")
            time.sleep(rng.uniform(0.05, 3.0))
            if not proc.kill():
                early = proc.wait()
                cat.check(early.rc == 0 and not output_problems(early),
                          f"push of step {step} (not killed) failed: {early.brief()}")
                break
            killed += 1
            cat.add("push kills")
            check_listed(ctx, area, cat, step, f"after push kill {killed}")
            rewrites += _rewritten(area, before, step)
        before = data_identities(area, step)
        final = run_cli(args, env)
        cat.check(final.rc == 0 and not output_problems(final),
                  f"rerun of push step {step} did not finish: {final.brief()}")
        rewrites += _rewritten(area, before, step)
        doc = _json(final.out)
        cat.add("bytes sent by the final reruns", int(doc.get("sent_bytes", 0)))
        cat.add("bytes resumed by the final reruns", int(doc.get("resumed_bytes", 0)))
        verify = ctx.cli(area, "verify", area.uri, "--step", str(step))
        cat.check(verify.rc == 0, f"verify of step {step} after its kills: {verify.brief()}")
        pulled, got = ctx.pull(area, ctx.scratch / "kills-pull", "--step", str(step))
        cat.check(same(got, digest), f"step {step} pulled back differs: {pulled.brief()}")
    resent = sum(v for k, v in (proxy.resent.items() if proxy else []) if f"/{DATA}" in f"/{k}")
    cat.figures["finished files re-sent (bytes)"] = resent
    cat.figures["finished files rewritten (file://)"] = rewrites
    cat.check(resent == 0 and rewrites == 0,
              f"finished files were sent again after kills: {resent} bytes to S3 keys "
              f"{sorted(k for k in (proxy.resent if proxy else {}) if DATA in k)[:5]}, "
              f"{rewrites} file:// objects rewritten")


def _json(text: str) -> dict[str, object]:
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _rewritten(area: Area, before: dict[str, tuple[int, int] | None], step: int) -> int:
    """How many finished file:// objects of `step` were written again since `before`."""
    after = data_identities(area, step)
    return sum(1 for k, ident in before.items()
               if ident is not None and k in after and after[k] != ident)


def _agent_kills(ctx: Ctx, kind: StoreKind, cat: Category, count: int) -> None:
    rng = ctx.opts.rng
    area = kind.area("agent-kills")
    root = ctx.scratch / f"agent-kills-{kind.name}"
    size = max(MiB, ctx.opts.size // 4)
    pod = Pod(root, store_env={**clean_env(area.env), "CKPTDRAIN_STORE_URI": area.uri},
              size=f"{size}", rate=f"{size * 2}", interval="0.5s")
    trainer = pod.start_trainer()
    verified: set[int] = set()
    try:
        for number in range(1, count + 1):
            agent = pod.start_agent()
            time.sleep(rng.uniform(0.2, 3.0))
            agent.kill()
            agent.wait(30)
            pod.procs = [p for p in pod.procs if p[1] is not agent]  # its death is the test
            cat.add("agent kills")
            _check_agent_state(ctx, area, pod, cat, verified, f"after agent kill {number}")
        agent = pod.start_agent()
        try:
            pod.wait_for(lambda: ctx.complete(area), "a global step after the agent kills")
        except AssertionError as err:
            cat.fail(f"no step reached the store after the agent kills: {str(err)[-600:]}")
        pod.sigterm(trainer, agent)
        _check_agent_state(ctx, area, pod, cat, verified, "after the last agent run")
        local = sorted(pod.tier.steps(), reverse=True)
        glob = ctx.complete(area)
        newest = max([*local[:1], *glob[:1]], default=None)
        run, doc = ctx.restore(area, root / "restored", pod.local)
        got = tree_digest(Path(doc["path"])) if doc.get("path") else {}
        expect = tree_digest(pod.tier.data_dir(newest)) if newest in local else {}
        if newest is not None and newest not in local:
            expect = ctx.pull(area, root / "expect", "--step", str(newest))[1]
        cat.check(run.rc == 0 and doc.get("step") == newest and same(got, expect),
                  f"restore after agent kills: want step {newest}, got {doc.get('step')} "
                  f"(same bytes: {same(got, expect)}): {run.brief()}")
    finally:
        pod.stop_all()


def _check_agent_state(ctx: Ctx, area: Area, pod: Pod, cat: Category, verified: set[int],
                       when: str) -> None:
    for step in pod.tier.steps():
        try:
            pod.tier.verify(step)
            cat.check(True, "")
        except Exception as err:
            cat.fail(f"{when}: local step {step} is published but does not verify: {err}")
    for step in ctx.complete(area):
        if step in verified:
            continue
        verify = ctx.cli(area, "verify", area.uri, "--step", str(step))
        if cat.check(verify.rc == 0, f"{when}: global step {step} listed complete but "
                     f"verify says {verify.brief()}"):
            verified.add(step)


def _read_kills(ctx: Ctx, kind: StoreKind, cat: Category, count: int) -> None:
    rng = ctx.opts.rng
    area = kind.area("read-kills")
    base = ctx.scratch / f"read-kills-{kind.name}"
    env = clean_env(area.env)
    sources = {}
    for step in (1, 2):
        src = base / f"step-{step}"
        sources[step] = make_tree(src, rng, ctx.opts.size, files=6)
        pushed = run_cli(push_args(src, area.uri), env)
        if not cat.check(pushed.rc == 0, f"setup push failed: {pushed.brief()}"):
            return
    for number in range(count):
        if number % 2 == 0:
            dest = base / f"pull-{number}" / "dest"
            proc = Spawned(["pull", area.uri, str(dest), "--concurrency", "2"], env,
                           base / "logs")
            time.sleep(rng.uniform(0.05, 2.0))
            landed = proc.kill()
            cat.add("pull kills" if landed else "pulls that ended before the kill")
            shown = tree_digest(dest)
            cat.check(not visible(dest) or shown == sources[2],
                      f"killed pull left a partial DEST: {sorted(shown)[:5]}")
            # A DEST that is already whole is an honest outcome of a late kill.
            again = None if visible(dest) else ctx.cli(area, "pull", area.uri, str(dest))
            if again is not None:
                cat.check(again.rc == 0 and tree_digest(dest) == sources[2],
                          f"pull into the DEST of a killed pull: {again.brief()}")
            left = [p.name for p in dest.parent.iterdir() if p.name.startswith(".")]
            cat.check(not left, f"the killed pull's temp dirs remain after a rerun: {left}")
        else:
            work = base / f"restore-{number}" / "work"
            args = ["restore", "--work-dir", str(work), "--local-dir", str(base / "nolocal"),
                    "--store-uri", area.uri, "--metrics-port", "0",
                    "--restore-result", str(work.parent / "r.json")]
            proc = Spawned(args, env, base / "logs")
            time.sleep(rng.uniform(0.05, 2.5))
            cat.add("restore kills" if proc.kill() else "restores that ended before the kill")
            for name in visible(work):
                step = int(name.split("-")[1]) if name.startswith("step-") else None
                if step is not None:
                    cat.check(tree_digest(work / name) == sources.get(step),
                              f"killed restore left a partial {name} in the work dir")
            again, doc = ctx.restore(area, work, base / "nolocal")
            cat.check(again.rc == 0 and doc.get("step") == 2
                      and tree_digest(work / "step-2") == sources[2],
                      f"restore after a killed restore: step {doc.get('step')}: "
                      f"{again.brief()}")
