"""Ranks agreeing on a restore step, under faults, against a real apiserver.

Each trial is one job of 2 to 4 writers, each with its node's local tier
(random steps, sometimes from two timelines, sometimes an empty node) and a
shared file:// global tier, whose ranks restore in parallel exactly as their
init containers do (restore/engine.py with the agent's documented rights).
Faults, drawn at random per trial:

- a rank killed during the agreement (at a random apiserver call: before or
  after its report, or while rank 0 decides) and restarted, by the same pod
  (an init container retried) or by a new one;
- one rank's local copy corrupted;
- a rank that reports only after the bound (the others fall back), then
  joins late;
- a stale rank: reports and a decision left by an earlier pod generation.

A trial runs gang restarts until every rank restored (at most four).
Invariant, per gang restart: every rank that restored has the same step, and
the bytes it got are that rank's shard of one timeline, a step every rank
could get; never a mixed-step restore.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tests.torture.core import ROOT, Category
from tests.torture.ops import Ctx
from tests.torture.stores import StoreKind

TIMEOUT_S = 2.0


class Killed(BaseException):
    """The rank's process died here: nothing after it runs (not an Exception,
    so no handler in the code under test sees it)."""


class FaultyApi:
    """The real apiserver client; a rank's thread may be told to die at its
    n-th call (fault injection around the real part)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.local = threading.local()

    def kill_at(self, n: int | None) -> None:
        self.local.calls, self.local.kill_at = 0, n

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.api, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.local.calls = getattr(self.local, "calls", 0) + 1
            if getattr(self.local, "kill_at", None) == self.local.calls:
                raise Killed(name)
            return method(*args, **kwargs)
        return call


def run(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    from kubernetes import client, config
    from tests.support import apiserver

    from ckptdrain import kubeclient

    trials = ctx.opts.agreements
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(apiserver.running(ctx.scratch / "agreement-apiserver"))
        namespace = "torture"
        cluster.kubectl("create", "namespace", namespace)
        kubeconfig = _agent_kubeconfig(cluster, namespace)
        api = FaultyApi(client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig))))
        admin = client.CustomObjectsApi(config.new_client_from_config(str(cluster.kubeconfig)))
        saved = kubeclient.custom_objects_api
        stack.callback(setattr, kubeclient, "custom_objects_api", saved)
        kubeclient.custom_objects_api = lambda: api  # type: ignore[assignment]
        # Restore's own choice in a pod (kube_rest) must not pass the faults by.
        saved_node = kubeclient.node_custom_objects_api
        stack.callback(setattr, kubeclient, "node_custom_objects_api", saved_node)
        kubeclient.node_custom_objects_api = lambda: api  # type: ignore[assignment]
        import os
        previous = os.environ.get("KUBERNETES_SERVICE_HOST")
        os.environ["KUBERNETES_SERVICE_HOST"] = "apiserver"
        stack.callback(lambda: os.environ.pop("KUBERNETES_SERVICE_HOST", None)
                       if previous is None else os.environ.update(
                           KUBERNETES_SERVICE_HOST=previous))
        mixed = restores = local_wins = 0
        for i in range(trials):
            trial = Trial(ctx.scratch / "agreement" / f"t{i}", namespace, f"p{i}",
                          random.Random(ctx.opts.rng.random()), api, admin)
            cat.tried += 1
            try:
                problems, counted, local = trial.run()
            except Exception as err:  # a harness fault is a failure, seen
                problems, counted, local = [f"trial crashed: {err!r}"], 0, 0
            restores += counted
            local_wins += local
            if problems:
                mixed += 1
                cat.fail(f"trial {i} ({trial.faults}): " + "; ".join(problems))
        cat.figures.update({"trials": trials, "restores": restores,
                            "mixed-step trials": mixed, "local-step agreements": local_wins})


def _agent_kubeconfig(cluster: Any, namespace: str) -> Path:
    """Credentials with exactly the agent's documented rights (docs/rbac-agent.md's
    first block) in `namespace`."""
    import json
    import re

    import yaml

    text = (ROOT / "docs" / "rbac-agent.md").read_text()
    rules = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", text, re.S)[0])["rules"]
    name = "ckptdrain-agent"
    meta = {"name": name, "namespace": namespace}
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}]}))
    return Path(cluster.kubeconfig_for(namespace, name))


class Trial:
    def __init__(self, root: Path, namespace: str, policy: str, rng: random.Random,
                 api: FaultyApi, admin: Any) -> None:
        from ckptdrain.store import open_store

        self.root, self.namespace, self.policy, self.rng, self.api = root, namespace, \
            policy, rng, api
        #: The garbage collector's part: a replaced pod's report goes with it.
        self.admin = admin
        self.writers = rng.choice((2, 2, 3, 4))
        (root / "store").mkdir(parents=True)
        self.store_uri = f"file://{root}/store"
        self.store = open_store(self.store_uri)
        self.nodes = {w: root / f"node-{w}" for w in range(self.writers)}
        self.faults: list[str] = []

    # -- set-up ------------------------------------------------------------------
    def _shard(self, step: int, writer: int, flavour: str) -> Path:
        src = self.root / "src" / f"{step}-{writer}-{flavour}"
        src.mkdir(parents=True, exist_ok=True)
        (src / "model.bin").write_bytes(f"{flavour}|{step}|{writer}|".encode() * 64)
        return src

    def _tier(self, writer: int) -> Any:
        from ckptdrain.node.localtier import LocalTier

        return LocalTier(self.nodes[writer] / "local")

    def _setup(self) -> None:
        from ckptdrain.transfer.drain import Drainer
        from ckptdrain.transfer.scan import build_manifest

        rng = self.rng
        if rng.random() < 0.8:
            for w in range(self.writers):
                src = self._shard(50, w, "g")
                Drainer(self.store, part_size=5 << 20, concurrency=1).drain(
                    src, build_manifest(src, 50, w, self.writers, created=50.0),
                    journal_path=self.root / f"j-{w}.json")
        for w in range(self.writers):
            for step in (60, 70, 80):
                if rng.random() < 0.75:
                    timeline = "a" if rng.random() < 0.85 else "b"
                    self._tier(w).capture(self._shard(step, w, timeline), step, writer=w,
                                          writers=self.writers, extra={"timeline": timeline})
        if rng.random() < 0.25:
            w = rng.randrange(self.writers)
            self.nodes[w] = self.root / f"node-{w}-new"
            self.faults.append(f"rank {w} on a new node")
        if rng.random() < 0.3:
            w = rng.randrange(self.writers)
            held = self._tier(w).steps()
            if held:
                step = rng.choice(held)
                data = self._tier(w).data_dir(step) / "model.bin"
                data.write_bytes(b"#" + data.read_bytes()[1:])
                self.faults.append(f"rank {w} step {step} corrupt")
        if rng.random() < 0.3:
            self._stale_generation()

    def _stale_generation(self) -> None:
        """Reports and a decision an earlier pod generation left behind."""
        from ckptdrain.restore.agreement import Decision, Report
        from ckptdrain.restore.meeting import Meeting

        meeting = Meeting(self.namespace, f"{self.namespace}/{self.policy}", self.api)
        round_ = self.rng.randrange(1, 5)
        for w in range(self.writers):
            meeting.report(Report(round=round_ + self.rng.choice((0, 1)), rank=w,
                                  uid=f"old-{w}", local={90: "z"}, at=time.time() - 3600))
        old = Decision(round_, 90, "agreed", "", {w: f"old-{w}" for w in range(self.writers)},
                       time.time() - self.rng.choice((5, 3600)), f"r{round_}-old")
        meeting.write_decision(old, None)
        self.faults.append(f"stale generation (round {round_})")

    def _pod_deleted(self, writer: int, uid: str) -> None:
        """What the garbage collector does when a pod goes: its owned report goes."""
        from ckptdrain.node.lease import LEASE_API, LEASE_PLURAL
        from ckptdrain.restore.meeting import report_name

        name = report_name(f"{self.namespace}/{self.policy}", writer)
        with contextlib.suppress(Exception):
            found = self.admin.get_namespaced_custom_object(*LEASE_API, self.namespace,
                                                            LEASE_PLURAL, name)
            if (found.get("spec") or {}).get("holderIdentity") == uid:
                self.admin.delete_namespaced_custom_object(*LEASE_API, self.namespace,
                                                           LEASE_PLURAL, name)

    # -- one gang restart ----------------------------------------------------------
    def _cfg(self, writer: int, uid: str) -> Any:
        from ckptdrain.node import config as node_config

        node = self.nodes[writer]
        return node_config.load(environ={
            "CKPTDRAIN_WORK_DIR": str(node / f"work-{uid}"),
            "CKPTDRAIN_LOCAL_DIR": str(node / "local"), "CKPTDRAIN_STORE_URI": self.store_uri,
            "CKPTDRAIN_WRITER_ID": str(writer), "CKPTDRAIN_WRITERS": str(self.writers),
            "CKPTDRAIN_POLICY": f"{self.namespace}/{self.policy}",
            "CKPTDRAIN_POD_NAME": f"{self.policy}-{uid}", "CKPTDRAIN_POD_UID": uid,
            "CKPTDRAIN_NAMESPACE": self.namespace, "CKPTDRAIN_NODE_NAME": f"node-{writer}",
            "CKPTDRAIN_RESTORE_AGREE_TIMEOUT": f"{TIMEOUT_S}s"})

    def _rank(self, writer: int, kill_at: int | None, delay: float,
              out: dict[int, Any]) -> None:
        from ckptdrain.restore.engine import restore

        time.sleep(delay)
        uid = uuid.uuid4().hex
        for _ in range(3):  # the kubelet retries a failed init container
            self.api.kill_at(kill_at)
            try:
                result, code = restore(self._cfg(writer, uid), self.store)
            except Killed:
                if self.rng.random() < 0.5:  # a new pod replaces the dead one
                    self._pod_deleted(writer, uid)
                    uid = uuid.uuid4().hex
                kill_at = None
                continue
            out[writer] = (result, code, uid)
            if code != 4:
                return

    def _generation(self, faulty: bool) -> dict[int, Any]:
        out: dict[int, Any] = {}
        threads = []
        late = self.rng.randrange(self.writers) if faulty and self.rng.random() < 0.25 else None
        if late is not None:
            self.faults.append(f"rank {late} reports after the bound")
        for w in range(self.writers):
            kill_at = self.rng.randrange(1, 6) if faulty and self.rng.random() < 0.2 else None
            if kill_at is not None:
                self.faults.append(f"rank {w} killed at call {kill_at}")
            delay = TIMEOUT_S * 1.5 if w == late else self.rng.random() * 0.3
            threads.append(threading.Thread(target=self._rank, args=(w, kill_at, delay, out)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        return out

    def run(self) -> tuple[list[str], int, int]:
        self._setup()
        gettable = self._gettable()
        problems: list[str] = []
        restores = local = 0
        for gen in range(4):
            out = self._generation(faulty=gen == 0)
            for w, (_, _, uid) in out.items():  # the next gang restart replaces every pod
                self._pod_deleted(w, uid)
            restores += len(out)
            problems += self._check(out, gettable, gen)
            if all(code == 0 for _, code, _ in out.values()) and len(out) == self.writers:
                local += any(r.tier == "local" for r, _, _ in out.values()) and \
                    next(iter(out.values()))[0].step not in self._complete()
                break
            gettable = self._gettable()
        else:
            problems.append("ranks did not all restore in four gang restarts")
        return problems, restores, int(local)

    def _complete(self) -> set[int]:
        from ckptdrain.transfer.catalog import scan

        return {c.step for c in scan(self.store).complete}

    def _gettable(self) -> dict[int, set[int]]:
        """What each rank can get before the restart: its node's steps and the store's."""
        complete = self._complete()
        return {w: set(self._tier(w).steps()) | complete for w in range(self.writers)}

    def _check(self, out: dict[int, Any], gettable: dict[int, set[int]], gen: int) -> list[str]:
        placed = {w: r for w, (r, code, _) in out.items() if code == 0}
        steps = {r.step for r in placed.values()}
        problems = []
        if len(steps) > 1:
            problems.append(f"generation {gen}: ranks restored different steps "
                            f"{ {w: (r.step, r.agreement, r.reason) for w, r in placed.items()} }")
        flavours = set()
        for w, r in placed.items():
            if r.step is None:
                continue
            if any(r.step not in gettable[x] for x in range(self.writers)):
                problems.append(f"generation {gen}: step {r.step} was not gettable by every rank")
            text = (Path(r.path) / "model.bin").read_bytes().decode(errors="replace")
            flavour, step, writer = text.split("|")[:3]
            if (int(step), int(writer)) != (r.step, w):
                problems.append(f"generation {gen}: rank {w} got {text[:30]!r}")
            flavours.add(flavour)
        if len(flavours) > 1:
            problems.append(f"generation {gen}: copies of two timelines {sorted(flavours)}")
        return problems
