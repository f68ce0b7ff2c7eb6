"""Hostile work-dir entries on the agent's capture path (part of the corruption category).

A trainer directory named `step-007` (capture must copy what is there, or refuse,
never publish an empty step 7), then a `step-9` symlink pointing outside the work
dir at a fake private key (the trainer protocol, like `push`, refuses symlinks).

Invariants: no local or global step is ever published empty when its source had
files; nothing behind a symlink reaches the local tier or the store; every step
published verifies.
"""

from __future__ import annotations

import time

from tests.support.agentprocs import Pod
from tests.torture.core import Category, clean_env, make_tree, tree_digest
from tests.torture.ops import Ctx
from tests.torture.stores import StoreKind

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- torture canary"
WATCH = 8.0  # seconds the agent gets to act on each entry


def run(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    area = kind.area("agent-inputs")
    root = ctx.scratch / f"agent-inputs-{kind.name}"
    outside = root / "outside"
    outside.mkdir(parents=True)
    (outside / "id_ed25519").write_bytes(SECRET)
    pod = Pod(root, store_env={**clean_env(area.env), "CKPTDRAIN_STORE_URI": area.uri},
              interval="0.3s")
    pod.work.mkdir(parents=True, exist_ok=True)
    source = make_tree(pod.work / "step-007", ctx.opts.rng, 256 * 1024, files=3)
    try:
        agent = pod.start_agent()
        _watch(pod, 7)
        cat.add("agent inputs")
        for step in pod.tier.steps():
            got = tree_digest(pod.tier.data_dir(step))
            cat.check(got == source, f"trainer dir step-007: local step {step} holds "
                      f"{len(got)} files, not the {len(source)} the trainer wrote")
        pulled = {}
        if 7 in ctx.complete(area):
            pulled = ctx.pull(area, root / "pulled", "--step", "7")[1]
            cat.check(pulled == source, f"trainer dir step-007: global step 7 holds "
                      f"{len(pulled)} files, not {len(source)}")
        (pod.work / "step-9").symlink_to(outside, target_is_directory=True)
        _watch(pod, 9)
        cat.add("agent inputs")
        leaked = [str(p) for p in pod.local.rglob("*") if p.is_file()
                  and SECRET in p.read_bytes()]
        leaked += [k for k in area.keys("data/") if SECRET in area.get(k)]
        cat.check(not leaked, f"a step-9 symlink to {outside}: its target was captured or "
                  f"drained: {leaked[:4]}")
        pod.sigterm(agent, timeout=60)
    finally:
        pod.stop_all()


def _watch(pod: Pod, step: int) -> None:
    """Give the agent WATCH seconds, or less once the step reached an end state."""
    deadline = time.monotonic() + WATCH
    while time.monotonic() < deadline:
        states = {e["state"] for e in pod.event_list() if e["step"] == step}
        if states & {"Global", "Failed"}:
            return
        time.sleep(0.2)
