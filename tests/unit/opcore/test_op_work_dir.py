"""admission/work_dir.py and admission/prepare.py: where the trainer's work
dir lives (the local tier's disk, a memory emptyDir, a reader's emptyDir), the
group that shares it, and the root program that hands it over."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import injection, prepare, work_dir
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
DISK = {"path": "/mnt/ckptdrain/nvme", "keep": 2}


def parse(writers: int = 1, **local: Any) -> policy.Policy:
    return policy.parse("ml", "llama", {
        "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
        "interval": "15m", "writers": writers, "localTier": {**DISK, **local},
        "storage": {"uri": "s3://bucket/runs"}}, CFG)


def pod(containers: int = 1, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": f"trainer-{i}", "image": "t:1"}
                                           for i in range(containers)]}
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
            "spec": body}


def inject(p: dict[str, Any], pol: policy.Policy, **kw: Any) -> dict[str, Any]:
    ops = injection.build_pod_patch(p, pol, CFG, default_rate=1e9, **kw)
    return jsonpatch.apply_patch(copy.deepcopy(p), ops)


def container(p: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in p["spec"]["initContainers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


UID = "5f0c1b2a-9d3e-4c1f-8a7b-0e1d2c3b4a59"


def expand(text: str, c: dict[str, Any]) -> str:
    """`$(VAR)` as kubelet expands it, from the container's own environment:
    each entry sees only those before it, the pod UID from the downward API."""
    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\(([A-Z_]+)\)",
                                    lambda m: env.get(m.group(1), m.group(0)), e["value"])
        elif e["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}:
            env[e["name"]] = UID
    return re.sub(r"\$\(([A-Z_]+)\)", lambda m: env[m.group(1)], text)


def work_mount(c: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in c["volumeMounts"] if m["mountPath"] == "/ckptdrain/work")


# The shared group -----------------------------------------------------------

def test_a_pod_without_a_security_context_gets_our_fs_group() -> None:
    out = inject(pod(), parse())
    assert out["spec"]["securityContext"] == {"fsGroup": 65532,
                                              "fsGroupChangePolicy": "OnRootMismatch"}


def test_the_pods_other_security_context_fields_stay() -> None:
    mine = {"runAsUser": 0, "runAsNonRoot": False, "supplementalGroups": [44]}
    out = inject(pod(securityContext=dict(mine)), parse())
    assert out["spec"]["securityContext"] == {**mine, "fsGroup": 65532,
                                              "fsGroupChangePolicy": "OnRootMismatch"}


@pytest.mark.parametrize("context", [{"fsGroup": 1000}, {"fsGroup": 0, "runAsUser": 1000},
                                     {"fsGroup": 1000, "fsGroupChangePolicy": "Always"}])
def test_the_pods_own_fs_group_is_kept_and_prepare_shares_through_it(
        context: dict[str, Any]) -> None:
    out = inject(pod(securityContext=dict(context)), parse())
    assert out["spec"]["securityContext"] == context
    program = container(out, injection.PREPARE)["command"][-1]
    assert re.search(rf"work, group = .*, {context['fsGroup']}\n", program)


def test_a_reader_shares_the_group_too() -> None:
    out = inject(pod(), parse(writers=2), rank=1, reader=True)
    assert out["spec"]["securityContext"]["fsGroup"] == 65532


# Where the work dir lives ---------------------------------------------------

@pytest.mark.parametrize(("writers", "rank", "name"), [(1, None, "work-0-"),
                                                      (8, 3, "work-3-")])
def test_each_pod_writes_into_its_own_work_dir_in_the_local_tiers_volume(
        writers: int, rank: int | None, name: str) -> None:
    out = inject(pod(containers=2), parse(writers=writers), rank=rank)
    assert "ckptdrain-work" not in {v["name"] for v in out["spec"]["volumes"]}
    agent = container(out, injection.AGENT)
    seen_by_agent = expand(env_of(agent)["CKPTDRAIN_WORK_DIR"], agent)
    # One per pod: a replacement pod on this node never shares the old one's.
    assert seen_by_agent == f"/ckptdrain/local/{name}{UID}"
    for c in (container(out, injection.RESTORE), container(out, injection.PREPARE),
              *out["spec"]["containers"]):
        assert expand(env_of(c).get("CKPTDRAIN_WORK_DIR", seen_by_agent), c) in (
            seen_by_agent, "/ckptdrain/work")
    for trainer in out["spec"]["containers"]:
        mount = work_mount(trainer)
        assert mount == {"name": "ckptdrain-local", "mountPath": "/ckptdrain/work",
                         "subPathExpr": "$(CKPTDRAIN_WORK_NAME)"}
        # Resolved in the trainer's own environment: the directory the agent sees.
        assert "/ckptdrain/local/" + expand(mount["subPathExpr"], trainer) == seen_by_agent
        env = env_of(trainer)
        assert env["CKPTDRAIN_WORK_DIR"] == "/ckptdrain/work"
        assert env["CKPTDRAIN_RESTORE_RESULT"] == "/ckptdrain/work/restore.json"
    for name_ in (injection.RESTORE, injection.AGENT):
        c = container(out, name_)
        # The same mount as the local tier: hard links cannot cross mounts.
        assert "/ckptdrain/work" not in {m["mountPath"] for m in c["volumeMounts"]}
        assert expand(env_of(c)["CKPTDRAIN_WORK_DIR"], c) == seen_by_agent
        assert "ephemeral-storage" not in c["resources"]["requests"]


def test_a_trainer_that_names_its_writer_id_keeps_it_and_its_agents_work_dir() -> None:
    p = pod()
    p["spec"]["containers"][0]["env"] = [{"name": "CKPTDRAIN_WRITER_ID", "value": "5"}]
    out = inject(p, parse(writers=8), rank=3)
    trainer = out["spec"]["containers"][0]
    assert [e for e in trainer["env"] if e["name"] == "CKPTDRAIN_WRITER_ID"] == [
        {"name": "CKPTDRAIN_WRITER_ID", "value": "5"}]
    agent = container(out, injection.AGENT)
    assert "/ckptdrain/local/" + expand(work_mount(trainer)["subPathExpr"], trainer) == \
        expand(env_of(agent)["CKPTDRAIN_WORK_DIR"], agent)


@pytest.mark.parametrize("mine", [
    [{"name": "CKPTDRAIN_WORK_NAME", "value": "work-0-mine"}],
    [{"name": "A", "value": "1"}, {"name": "CKPTDRAIN_POD_UID", "value": "x"},
     {"name": "B", "value": "2"}, {"name": "CKPTDRAIN_WORK_NAME", "value": "elsewhere"}],
    [{"name": "CKPTDRAIN_WORK_NAME", "value": "w"}, {"name": "CKPTDRAIN_POD_UID",
                                                      "valueFrom": {"fieldRef": {
                                                          "fieldPath": "metadata.name"}}}],
])
def test_the_webhooks_work_name_and_pod_uid_replace_the_trainers_own(
        mine: list[dict[str, Any]]) -> None:
    p = pod(containers=2)
    p["spec"]["containers"][1]["env"] = copy.deepcopy(mine)
    pol = parse(writers=8)
    out = inject(p, pol, rank=3)
    agent = container(out, injection.AGENT)
    trainer = out["spec"]["containers"][1]
    names = [e["name"] for e in trainer["env"]]
    assert names.count("CKPTDRAIN_WORK_NAME") == names.count("CKPTDRAIN_POD_UID") == 1
    assert names.index("CKPTDRAIN_POD_UID") < names.index("CKPTDRAIN_WORK_NAME")
    assert [e for e in trainer["env"] if e["name"] in "AB"] == [
        e for e in mine if e["name"] in "AB"]  # the pod's others stay, in order
    assert "/ckptdrain/local/" + expand(work_mount(trainer)["subPathExpr"], trainer) == \
        expand(env_of(agent)["CKPTDRAIN_WORK_DIR"], agent)
    said = injection.replaced_env(p, pol)
    assert len(said) == len(mine) - sum(e["name"] in "AB" for e in mine)
    assert all("spec.containers[1].env: CKPTDRAIN_" in line for line in said)
    assert injection.replaced_env(p, parse(memory={"sizeLimit": "100Gi"})) == []


def test_a_memory_tier_keeps_the_memory_emptydir() -> None:
    out = inject(pod(), parse(memory={"sizeLimit": "100Gi"}))
    vols = {v["name"]: v for v in out["spec"]["volumes"]}
    assert vols["ckptdrain-work"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "100Gi"}
    assert {"name": "ckptdrain-work", "mountPath": "/ckptdrain/work"} in \
        out["spec"]["containers"][0]["volumeMounts"]
    for name in (injection.RESTORE, injection.AGENT):
        c = container(out, name)
        assert {"name": "ckptdrain-work", "mountPath": "/ckptdrain/work"} in c["volumeMounts"]
        assert env_of(c)["CKPTDRAIN_WORK_DIR"] == "/ckptdrain/work"
    prep = container(out, injection.PREPARE)
    assert prep["volumeMounts"] == [{"name": "ckptdrain-local", "mountPath": "/ckptdrain/local"}]


def test_a_reader_keeps_a_sized_emptydir() -> None:
    out = inject(pod(), parse(writers=2), rank=1, reader=True)
    vols = {v["name"]: v for v in out["spec"]["volumes"]}
    assert "sizeLimit" in vols["ckptdrain-work"]["emptyDir"]
    restore = container(out, injection.RESTORE)
    assert env_of(restore)["CKPTDRAIN_WORK_DIR"] == "/ckptdrain/work"
    assert {"name": "ckptdrain-work", "mountPath": "/ckptdrain/work"} in restore["volumeMounts"]
    assert {"name": "ckptdrain-work", "mountPath": "/ckptdrain/work"} in \
        out["spec"]["containers"][0]["volumeMounts"]


def test_prepare_mounts_the_work_dir_as_the_trainer_does() -> None:
    out = inject(pod(), parse(writers=8), rank=3)
    prep = container(out, injection.PREPARE)
    trainer = out["spec"]["containers"][0]
    assert prep["volumeMounts"][1] == work_mount(trainer)
    assert expand(prep["volumeMounts"][1]["subPathExpr"], prep) == f"work-3-{UID}"
    assert set(env_of(prep)) == {"CKPTDRAIN_POD_UID", "CKPTDRAIN_WORK_NAME"}
    assert "$(" not in prep["command"][-1]  # kubelet would expand it into the program
    assert prep["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                       "add": ["CHOWN", "FOWNER"]}


def test_the_work_size_is_only_for_emptydirs() -> None:
    assert work_dir.ephemeral_request(parse()) is None
    assert work_dir.ephemeral_request(parse(memory={"sizeLimit": "100Gi"})) is None
    assert work_dir.ephemeral_request(parse(), reader=True) is not None


# The prepare program, run for real -------------------------------------------

NEEDS = ("unshare", "setpriv", "mount")
real = pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(t) for t in NEEDS),
                          reason="needs root, unshare, setpriv and mount")


def run_prepare(tmp: Path, node_entry: str, group: int, work_name: str | None = None,
                ) -> subprocess.CompletedProcess[str]:
    """What the pod does: kubelet mounts the node path and, resolving it as its
    subPath code does, the work entry; the program runs as root with CHOWN and
    FOWNER only, holding the pod's fsGroup."""
    node, local, work = tmp / "node", tmp / "pod-local", tmp / "pod-work"
    local.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    resolved = os.path.realpath(node / node_entry)
    program = prepare.script(group, local=str(local), work=str(work))
    caps = "-all,+chown,+fowner"
    shell = (f"mount --bind {node} {local} && mount --bind {resolved} {work} && "
             f"exec setpriv --reuid 0 --regid 0 --groups {group} --inh-caps={caps} "
             f"--ambient-caps={caps} --bounding-set={caps} {sys.executable} -c \"$0\"")
    env = {"PATH": os.environ["PATH"],
           "CKPTDRAIN_WORK_NAME": node_entry if work_name is None else work_name}
    return subprocess.run(["unshare", "-m", "sh", "-c", shell, program], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def owner_mode(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, st.st_mode & 0o7777


@real
@pytest.mark.parametrize("entry", [f"work-0-{UID}", f"work-12-{UID}"])
def test_prepare_hands_the_work_dir_to_65532_and_the_group(tmp_path: Path, entry: str) -> None:
    node = tmp_path / "node"
    node.mkdir(mode=0o755)  # as kubelet's DirectoryOrCreate makes it, root's
    (node / entry).mkdir(mode=0o755)  # as kubelet's subPath makes it
    for attempt in range(2):  # and again, as the next pod on the node finds it
        done = run_prepare(tmp_path, entry, 1234)
        assert done.returncode == 0, (attempt, done.stderr)
        assert owner_mode(node) == (65532, 65532, 0o700)
        assert owner_mode(node / entry) == (65532, 1234, 0o2775)


@real
def test_prepare_refuses_a_work_entry_that_is_a_symlink(tmp_path: Path) -> None:
    node = tmp_path / "node"
    node.mkdir()
    (node / "writer-0").mkdir(mode=0o700)
    os.chown(node / "writer-0", 65532, 65532)
    (node / f"work-0-{UID}").symlink_to("writer-0")  # kubelet would mount writer-0
    done = run_prepare(tmp_path, f"work-0-{UID}", 1234)
    assert done.returncode != 0
    assert "refusing to change its owner" in done.stderr
    assert owner_mode(node / "writer-0") == (65532, 65532, 0o700)  # not redirected


@real
@pytest.mark.parametrize("name", ["", "work", "work-3", f"work-x-{UID}", f"work-3-{UID}/..",
                                  "work-3-../../etc", f"work-3-{UID.upper()}", f"work-3-{UID}\n",
                                  "work-3-5f0c/../x"])
def test_prepare_refuses_a_work_name_that_is_not_a_pods(tmp_path: Path, name: str) -> None:
    node = tmp_path / "node"
    (node / f"work-3-{UID}").mkdir(parents=True, mode=0o755)
    done = run_prepare(tmp_path, f"work-3-{UID}", 1234, work_name=name)
    assert done.returncode != 0 and "expected work-<writer>-<pod uid>" in done.stderr
    assert owner_mode(node / f"work-3-{UID}")[2] == 0o755  # untouched
