"""Corruption of every kind, in the store and in the local tier.

Store: a two-writer step 2 on top of an intact step 1; each round damages step 2
one way (flip a byte, truncate, extend, delete a data object; delete, truncate,
garble, replace or re-checksum a manifest; swap the two writers' manifests),
then undoes it. Local tier: steps 1 and 2 captured on disk, step 2 damaged.

Invariants: the damage is detected (`verify` of step 2 fails; a damaged
manifest makes `ls` show step 2 incomplete); `pull` and `ckptdrain restore`
fall back to step 1 and deliver its exact bytes; nothing crashes.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

from tests.torture.core import Category, clean_env, make_tree, output_problems, run_cli
from tests.torture.kills import push_args
from tests.torture.ops import Ctx, same
from tests.torture.stores import Area, StoreKind

from ckptdrain import keys

Damage = Callable[[Area, random.Random, int], str]


def _data_keys(area: Area, step: int, writer: int) -> list[str]:
    """The writer's data objects of `step`, in either layout (docs/store-layout.md)."""
    found = [k for prefix in keys.writer_data_prefixes(step, writer)
             for k, size in area.keys(prefix).items() if size]
    assert found, f"no data of step {step} writer {writer} to damage"
    return sorted(found)


def _mkey(step: int, writer: int) -> str:
    return f"manifests/{step:020d}/{writer:05d}.json"


def flip(area: Area, rng: random.Random, w: int) -> str:
    key = rng.choice(_data_keys(area, 2, w))
    data = bytearray(area.get(key))
    at = rng.randrange(len(data))
    data[at] ^= 1 << rng.randrange(8)
    area.put(key, bytes(data))
    return f"flipped a bit at {at} of {key}"


def truncate(area: Area, rng: random.Random, w: int) -> str:
    key = rng.choice(_data_keys(area, 2, w))
    data = area.get(key)
    area.put(key, data[: rng.randrange(len(data))])
    return f"truncated {key}"


def extend(area: Area, rng: random.Random, w: int) -> str:
    key = rng.choice(_data_keys(area, 2, w))
    area.put(key, area.get(key) + b"\0")
    return f"appended a byte to {key}"


def delete_data(area: Area, rng: random.Random, w: int) -> str:
    key = rng.choice(_data_keys(area, 2, w))
    area.delete(key)
    return f"deleted {key}"


def delete_manifest(area: Area, rng: random.Random, w: int) -> str:
    area.delete(_mkey(2, w))
    return f"deleted writer {w}'s manifest"


def truncate_manifest(area: Area, rng: random.Random, w: int) -> str:
    data = area.get(_mkey(2, w))
    area.put(_mkey(2, w), data[: rng.randrange(len(data))])
    return f"truncated writer {w}'s manifest"


def garble_manifest(area: Area, rng: random.Random, w: int) -> str:
    data = bytearray(area.get(_mkey(2, w)))
    at = rng.randrange(len(data))
    # Invalid UTF-8 or a raw NUL is invalid anywhere in JSON; a plausible byte could
    # turn one valid manifest into another (a different `created`), which is no damage.
    data[at] = rng.choice(b"\xff\x00")
    area.put(_mkey(2, w), bytes(data))
    return f"garbled byte {at} of writer {w}'s manifest"


def older_manifest(area: Area, rng: random.Random, w: int) -> str:
    area.put(_mkey(2, w), area.get(_mkey(1, w)))
    return f"replaced writer {w}'s manifest by step 1's"


def recrc_manifest(area: Area, rng: random.Random, w: int) -> str:
    doc = json.loads(area.get(_mkey(2, w)))
    entry = rng.choice([f for f in doc["files"] if f.get("size")])
    entry["crc32c"] = f"{(int(entry['crc32c'], 16) + 1) % (1 << 32):08x}"
    area.put(_mkey(2, w), json.dumps(doc).encode())
    return f"changed the crc32c of {entry['path']} in writer {w}'s manifest"


def swap_manifests(area: Area, rng: random.Random, w: int) -> str:
    first, second = area.get(_mkey(2, 0)), area.get(_mkey(2, 1))
    area.put(_mkey(2, 0), second)
    area.put(_mkey(2, 1), first)
    return "swapped writer 0's and writer 1's manifests"


DATA_DAMAGE: list[Damage] = [flip, truncate, extend, delete_data, recrc_manifest]
MANIFEST_DAMAGE: list[Damage] = [delete_manifest, truncate_manifest, garble_manifest,
                                 older_manifest, swap_manifests]


def run(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    from tests.torture import agent_inputs

    _store(ctx, kind, cat)
    _local(ctx, kind, cat)
    agent_inputs.run(ctx, kind, cat)


def _store(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    rng = ctx.opts.rng
    area = kind.area("corruption")
    base = ctx.scratch / f"corruption-{kind.name}"
    env = clean_env(area.env)
    sources: dict[tuple[int, int], dict[str, bytes]] = {}
    for step in (1, 2):
        for w in (0, 1):
            src = base / f"w{w}" / f"step-{step}"
            sources[step, w] = make_tree(src, rng, max(ctx.opts.size // 4, 4096), files=4)
            pushed = run_cli(push_args(src, area.uri, "--writer", str(w), "--writers", "2"), env)
            if not cat.check(pushed.rc == 0, f"setup push failed: {pushed.brief()}"):
                return
    step1 = ctx.pull(area, base / "ref", "--step", "1")[1]
    pristine = {k: area.get(k) for k in [*area.keys(f"manifests/{2:020d}/"),
                                         *area.step_data_keys(2)]}
    for _ in range(ctx.opts.rounds):
        for damage in DATA_DAMAGE + MANIFEST_DAMAGE:
            w = rng.randrange(2)
            what = damage(area, rng, w)
            cat.add("store corruptions")
            problems = []
            ls, rows = ctx.ls(area)
            if damage in MANIFEST_DAMAGE and rows.get(2, {}).get("complete", True):
                problems.append(f"ls does not show step 2 incomplete ({ls.brief()})")
            verify = ctx.cli(area, "verify", area.uri, "--step", "2")
            if verify.rc not in (4, 5) or output_problems(verify):
                problems.append(f"verify of step 2: {verify.brief()}")
            pull, got = ctx.pull(area, base / "dest")
            if pull.rc != 0 or not same(got, step1):
                problems.append(f"pull did not fall back to step 1 ({pull.brief()})")
            rest, doc = ctx.restore(area, base / "work", base / "nolocal", writer=w, writers=2)
            if rest.rc != 0 or doc.get("step") != 1 or not same(
                    _tree(doc), sources[1, w]):
                problems.append(f"restore gave step {doc.get('step')} ({rest.brief()})")
            cat.check(not problems, f"{what}: " + "; ".join(problems))
            for key in set(area.keys(f"manifests/{2:020d}/")) | set(area.step_data_keys(2)):
                if key not in pristine:
                    area.delete(key)
            for key, data in pristine.items():
                area.put(key, data)


def _tree(doc: dict[str, object]) -> dict[str, bytes]:
    from tests.torture.core import tree_digest

    return tree_digest(Path(str(doc["path"]))) if doc.get("path") else {}


LOCAL_DAMAGE = ("flip", "truncate", "delete-file", "delete-manifest", "garble-manifest",
                "older-manifest", "extra-file-in-manifest")


def _local(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    from ckptdrain.node.localtier import LocalTier

    rng = ctx.opts.rng
    area = kind.area("local-corruption")
    base = ctx.scratch / f"local-corruption-{kind.name}"
    pristine = base / "pristine"
    sources = {}
    for step in (1, 2):
        src = base / f"step-{step}"
        sources[step] = make_tree(src, rng, max(ctx.opts.size // 4, 4096), files=4)
        LocalTier(pristine).capture(src, step, writer=0, writers=1)
    pushed = run_cli(push_args(base / "step-1", area.uri), clean_env(area.env))
    if not cat.check(pushed.rc == 0, f"setup push failed: {pushed.brief()}"):
        return
    for round_ in range(ctx.opts.rounds):
        for damage in LOCAL_DAMAGE:
            local = base / f"local-{round_}-{damage}"
            shutil.copytree(pristine, local)
            step_dir = local / "step-2"
            files = sorted(p for p in (step_dir / "data").rglob("*") if p.is_file()
                           and p.stat().st_size)
            victim = rng.choice(files)
            if damage == "flip":
                data = bytearray(victim.read_bytes())
                data[rng.randrange(len(data))] ^= 0x01
                victim.write_bytes(bytes(data))
            elif damage == "truncate":
                victim.write_bytes(victim.read_bytes()[:-1])
            elif damage == "delete-file":
                victim.unlink()
            elif damage == "delete-manifest":
                (step_dir / "manifest.json").unlink()
            elif damage == "garble-manifest":
                (step_dir / "manifest.json").write_bytes(b'{"format": 1, "files": [')
            elif damage == "older-manifest":
                shutil.copy(local / "step-1" / "manifest.json", step_dir / "manifest.json")
            else:
                doc = json.loads((step_dir / "manifest.json").read_bytes())
                doc["files"].append({"path": "missing.bin", "size": 5, "crc32c": "00000000"})
                (step_dir / "manifest.json").write_text(json.dumps(doc))
            cat.add("local corruptions")
            work = base / f"work-{round_}-{damage}"
            run, doc = ctx.restore(area, work, local)
            ok = (run.rc == 0 and doc.get("step") == 1 and not doc.get("fresh_start")
                  and same(_tree(doc), sources[1]) and not output_problems(run))
            cat.check(ok, f"local {damage} of step 2 ({victim.name}): restore gave step "
                      f"{doc.get('step')} from {doc.get('tier')}: {run.brief()}")
            shutil.rmtree(local, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
