"""Disk full on every path: the file:// store, push's journal, pull's DEST, restore's
work dir and the agent's local tier, each on a small tmpfs (needs root; otherwise
the category is skipped with one line).

Invariants: a clear error (a documented exit code, one line, no traceback,
saying the disk is full), nothing half-written (no partial step listed complete
or placed where a trainer looks, no temp files left behind), `fresh_start` never
claimed while a checkpoint existed, and no capture retry storm in the agent.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.agentprocs import Pod
from tests.torture.core import (
    Category,
    MiB,
    clean_env,
    make_tree,
    output_problems,
    run_cli,
    visible,
)
from tests.torture.kills import push_args
from tests.torture.ops import Ctx
from tests.torture.stores import StoreKind

#: Capture failures tolerated in the agent's observation window: a back-off retries a
#: handful of times; a storm (the probe saw one every ~0.2 s) retries dozens.
STORM = 10
WINDOW = 6.0
SPACE_WORDS = ("space", "full", "enospc")


@contextlib.contextmanager
def tmpfs(path: Path, size: int) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(mount: Path) -> None:
    """Use every byte of a tmpfs."""
    with (mount / "filler").open("wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 65536)
            out.flush()


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name.startswith((".ckptdrain-tmp", ".capture-")) or (".ckptdrain-" in p.name
                  and p.parent == root and not p.name.startswith(".ckptdrain-multipart")))


def _clear(run_: object) -> bool:
    text = (getattr(run_, "err", "") + getattr(run_, "out", "")).lower()
    return any(word in text for word in SPACE_WORDS)


def run(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    if os.geteuid() != 0:
        cat.skipped = "needs root to mount small tmpfs file systems"
        return
    base = ctx.scratch / "diskfull"
    src = base / "src" / "step-1"
    make_tree(src, ctx.opts.rng, 3 * MiB, files=4)
    area = kind.area("diskfull")
    env = clean_env(area.env)
    pushed = run_cli(push_args(src, area.uri), env)
    if not cat.check(pushed.rc == 0, f"setup push failed: {pushed.brief()}"):
        return

    with tmpfs(base / "store-mount", MiB) as mount:
        uri = f"file://{mount}/store"
        got = run_cli(push_args(src, uri), clean_env())
        listed = ctx.complete_uri(uri)
        cat.check(got.rc in (1, 3) and not output_problems(got) and _clear(got) and not listed,
                  f"push to a full file:// store: listed complete {listed}: {got.brief()}")
        left = leftovers(mount / "store") if (mount / "store").exists() else []
        cat.check(not left, f"push to a full file:// store left temp files: {left[:5]}")

    with tmpfs(base / "journal-mount", 64 * 1024) as mount:
        fill(mount)
        argv = push_args(src, area.uri, "--step", "2")
        at = argv.index("--journal")
        argv[at + 1] = str(mount / "journal")
        got = run_cli(argv, env)
        ok = got.rc == 0 or (got.rc == 1 and _clear(got))
        if got.rc == 0:
            ok = ctx.cli(area, "verify", area.uri, "--step", "2").rc == 0
        cat.check(ok and not output_problems(got),
                  f"push with its journal on a full disk: {got.brief()}")

    with tmpfs(base / "dest-mount", MiB) as mount:
        got = ctx.cli(area, "pull", area.uri, str(mount / "dest"))
        cat.check(got.rc == 1 and not output_problems(got) and _clear(got),
                  f"pull into a full disk: {got.brief()}")
        cat.check(not os.listdir(mount) or (os.listdir(mount) == ["dest"]
                  and not os.listdir(mount / "dest")),
                  f"pull into a full disk left {os.listdir(mount)} behind")

    with tmpfs(base / "work-mount", MiB) as mount:
        # The result file lives on a disk with room: what it says is the point.
        got, doc = ctx.restore(area, mount / "work", base / "nolocal",
                               result=base / "restore-result.json")
        cat.check(got.rc not in (0, None) and not output_problems(got) and _clear(got),
                  f"restore into a full disk: {got.brief()}")
        cat.check(doc.get("fresh_start") is not True,
                  "restore into a full disk wrote fresh_start: true although step 1 exists")
        cat.check(not visible(mount / "work"),
                  f"restore into a full disk left {visible(mount / 'work')} in the work dir")

    with tmpfs(base / "local-mount", MiB) as mount:
        _agent(ctx, area.uri, env, base / "pod", mount, cat)


def _agent(ctx: Ctx, uri: str, env: dict[str, str], root: Path, local: Path,
           cat: Category) -> None:
    pod = Pod(root, store_env={**env, "CKPTDRAIN_STORE_URI": uri}, size=f"{2 * MiB}",
              interval="0.3s", extra_env={"CKPTDRAIN_LOCAL_DIR": str(local)})
    pod.local = local
    try:
        agent = pod.start_agent()
        trainer = pod.start_trainer()
        time.sleep(WINDOW)
        failed = len(pod.states("Failed"))
        cat.check(agent.poll() is None, "the agent died when its local tier filled up")
        cat.check(failed <= STORM, f"capture retry storm: {failed} failed captures in "
                  f"{WINDOW:.0f} s with the local tier full (want a back-off)")
        pod.sigterm(trainer, agent, timeout=60)
    finally:
        pod.stop_all()
    for step in pod.tier.steps():
        try:
            pod.tier.verify(step)
        except Exception as err:
            cat.fail(f"full local tier: published step {step} does not verify: {err}")
    left = [n for n in os.listdir(local) if n.startswith(".capture-")]
    cat.check(not left, f"full local tier: capture temp dirs left behind: {left}")
