"""`ckptdrain agent`: the sidecar. Wires config, tiers, drain, share, metrics, signals.

Exit codes: 0 after a SIGTERM flush (whatever it achieved: unfinished work is
journaled), 2 for invalid configuration (one line naming the field).
Also runnable as `python -m ckptdrain.agent.command`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from ckptdrain import group_access, kubeclient
from ckptdrain.agent import peer_runtime
from ckptdrain.agent.drainworker import DrainWorker, Fence
from ckptdrain.agent.goodput import GoodputMetrics, GoodputWatcher, OverlapReporter
from ckptdrain.agent.loop import Agent
from ckptdrain.agent.metrics import AgentMetrics, MetricsServer
from ckptdrain.agent.refusals import RefusalEvents
from ckptdrain.agent.report import FanOut, JsonLinesReporter, LoggingReporter, Reporter
from ckptdrain.agent.share import Share, ShareWatcher
from ckptdrain.contract.env import Env
from ckptdrain.errors import CkptdrainError, InvalidInput
from ckptdrain.node import config as node_config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore import pod_work

log = logging.getLogger("ckptdrain.agent")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    node_config.add_arguments(parser)
    parser.add_argument("--events", type=Path, default=None,
                        help="also append per-checkpoint events as JSON lines to this file")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: what log collectors on a cluster parse without rules."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"t": round(record.created, 3), "level": record.levelname,
               "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        # botocore logs every retry at INFO; the agent reports failures itself.
        logging.getLogger("botocore").setLevel(logging.WARNING)


def build_drain(cfg: node_config.AgentConfig, tier: LocalTier, reporter: Reporter,
                metrics: AgentMetrics) -> tuple[DrainWorker | None, ShareWatcher | None]:
    if cfg.store_uri is None:
        log.warning("no CKPTDRAIN_STORE_URI: local tier only, nothing goes global")
        return None, None
    from ckptdrain.ratelimit import TokenBucket
    from ckptdrain.store import open_store
    from ckptdrain.transfer.drain import Drainer

    store = open_store(cfg.store_uri, endpoint_url=cfg.s3_endpoint,
                       endpoint_field="CKPTDRAIN_S3_ENDPOINT", region=cfg.region,
                       options=cfg.s3_options)
    limiter = TokenBucket(cfg.default_rate)

    def apply(share: Share) -> None:
        limiter.set_rate(share.rate)
        metrics.set_share(share.rate, share.source)

    watcher = ShareWatcher(cfg.share_file, cfg.default_rate, apply)
    drainer = Drainer(store, limiter=limiter, part_size=cfg.part_size,
                      concurrency=cfg.concurrency)

    workers: list[DrainWorker] = []

    def prune(step: int) -> None:
        # Best effort: retention trouble must never stop a drain; it is
        # retried after the next global step.
        from ckptdrain.transfer.prune import prune_writer
        try:
            prune_writer(store, cfg.writer, cfg.global_keep)
        except CkptdrainError as err:
            metrics.errors.labels("retention").inc()
            log.warning("global retention after step %d failed: %s", step, err)
        if cfg.cold_storage_class is None:
            return
        from ckptdrain.transfer.cooling import cool_writer
        try:
            cooled = cool_writer(store, cfg.writer, cfg.cold_after, cfg.cold_storage_class,
                                 stopping=lambda: bool(workers) and workers[0].should_yield)
            metrics.cold_objects.inc(cooled.objects)
        except CkptdrainError as err:
            metrics.errors.labels("cold_storage").inc()
            log.warning("moving older checkpoints to %s after step %d failed (they stay "
                        "where they are; retried after the next global step): %s",
                        cfg.cold_storage_class, step, err)

    gate = getattr(store, "gate", None)
    if gate is not None:
        metrics.store.watch_gate(gate)
    worker = DrainWorker(tier, store, drainer, reporter, metrics, part_size=cfg.part_size,
                         on_global=prune, fence=writer_fence(cfg),
                         stall_after=cfg.stall_timeout_s,
                         housekeeping=orphan_sweep(cfg, tier, store))
    workers.append(worker)  # what prune's cold storage pass asks whether to stop
    return worker, watcher


def orphan_sweep(cfg: node_config.AgentConfig, tier: LocalTier,
                 store: Any) -> Callable[[], int]:
    """Abort this writer's orphaned uploads (transfer/orphans.py), sparing
    every upload a journal on this node will resume."""
    from ckptdrain.transfer import journal as jr
    from ckptdrain.transfer.orphans import abort_orphans, sweep_grace

    started = time.monotonic()

    def sweep() -> int:
        owned: set[tuple[str, str]] = set()
        for step in tier.steps():
            journal = jr.load(tier.journal_path(step))
            if journal is not None:
                owned.update(journal.open_uploads())
        grace = sweep_grace(time.monotonic() - started, cfg.grace_s)
        return abort_orphans(store, cfg.writer, owned, grace=grace)

    return sweep


def writer_fence(cfg: node_config.AgentConfig) -> Fence | None:
    """The writer's lease, checked before each commit (node/lease.py), in a pod only."""
    if not node_config.in_cluster(cfg) or not cfg.pod_uid:
        return None
    from ckptdrain.node.kube import WriterLease
    from ckptdrain.node.lease import lease_seconds

    try:
        lease = WriterLease(cfg.namespace, cfg.policy.split("/")[-1], cfg.writer, cfg.pod_uid,
                            seconds=lease_seconds(cfg.interval_s * cfg.global_every),
                            node=cfg.node_name or None, pod=cfg.pod_name or None)
    except Exception as err:  # no API access: fencing is a guard, not a dependency
        log.warning("writer fencing disabled: %s", err)
        return None
    lease.start()
    return lease


def build_reporters(cfg: node_config.AgentConfig, args: argparse.Namespace) -> list[Reporter]:
    """Where per-checkpoint states go: the log and the --events file (and, in a
    pod, its progress annotation: `start_pod_report`)."""
    reporters: list[Reporter] = [LoggingReporter()]
    if getattr(args, "events", None):
        reporters.append(JsonLinesReporter(args.events))
    return reporters


def attach_share_channel(cfg: node_config.AgentConfig, watcher: ShareWatcher,
                         drain: DrainWorker | None, publisher: Any,
                         flushing: Callable[[], bool]) -> None:
    """Take the share from the policy's channel (contract/share.py), in a pod
    whose pending bytes are reported (admission follows the report); the
    file share stays the fallback."""
    if drain is None or publisher is None or not node_config.in_cluster(cfg):
        return
    from ckptdrain.agent.share_channel import ShareChannel

    try:
        channel = ShareChannel(
            cfg.namespace, cfg.policy.split("/")[-1],
            rank=cfg.writer if cfg.writer_ranked else None, pod=cfg.pod_name,
            pending=drain.lag_bytes, reported=lambda: publisher.reported_at,
            flushing=flushing, on_change=watcher.refresh)
    except Exception as err:  # no API access: the admission-time share applies
        log.warning("share channel disabled: %s", err)
        return
    watcher.attach(channel.view)
    channel.start()


def start_pod_report(cfg: node_config.AgentConfig, drain: DrainWorker | None,
                     reporter: FanOut, tier: LocalTier,
                     peer_holder: Callable[[int], tuple[int, str | None] | None],
                     along: Any = None) -> Any:
    """The writer's progress and pending bytes on its pod, started and
    subscribed to the checkpoint states (None outside a pod or without API:
    records are optional, training is not)."""
    if not node_config.in_cluster(cfg):
        return None
    from ckptdrain.agent.kube import PodReport

    try:
        report = PodReport(cfg.namespace, cfg.pod_name, cfg.writer, cfg.writers,
                           is_global=lambda s: tier.has(s) and tier.is_global(s),
                           peer_holder=peer_holder)
    except Exception as err:
        log.warning("progress and pending-bytes reports disabled: %s", err)
        return None
    if along is not None:
        report.along = along
    reporter.reporters.append(report)
    report.start(drain.lag_bytes if drain is not None else None)
    return report


def refusal_events(cfg: node_config.AgentConfig) -> RefusalEvents | None:
    if not node_config.in_cluster(cfg):
        return None
    try:
        core = kubeclient.core_api()
    except Exception as err:  # no API access: the record's claim still says it
        log.warning("capture-refused events disabled: %s", err)
        return None
    return RefusalEvents(cfg.namespace, cfg.pod_name, cfg.pod_uid or None,
                         lambda ns, body: core.create_namespaced_event(ns, body,
                                                                       _request_timeout=5))


def goodput_watcher(cfg: node_config.AgentConfig, tier: LocalTier, metrics: AgentMetrics,
                    reporter: FanOut) -> GoodputWatcher:
    """The trainer's progress into metrics and the pod's goodput annotation."""
    numbers = GoodputMetrics(metrics.registry)
    drains = OverlapReporter(numbers, cfg.interval_s * cfg.global_every, cfg.overlap)
    reporter.reporters.append(drains)
    annotate = None
    if node_config.in_cluster(cfg):
        from ckptdrain.node.kube import annotate_own_pod

        def annotate(key: str, value: str) -> bool:
            # The agent runs for the pod's life: the SDK, which rereads the
            # cluster CA for each connection (restore's kube_rest does not).
            return annotate_own_pod(cfg.namespace, cfg.pod_name, key, value,
                                    kubeclient.core_api())
    return GoodputWatcher(cfg.work_dir, tier, numbers, annotate, drains=drains,
                          interval_s=cfg.interval_s, overlap_target=cfg.overlap)


def restore_rounds(cfg: node_config.AgentConfig, agent: Agent, drain: Any) -> Any:
    """With several writers, in a pod: this rank's part in restore rounds while
    it runs (agent/rounds.py); None otherwise."""
    from ckptdrain.restore.coordinated import coordinates

    if not coordinates(cfg):
        return None
    from ckptdrain.agent.rounds import Rounds
    from ckptdrain.restore.meeting import Meeting

    return Rounds(agent, Meeting(cfg.namespace, cfg.policy, kubeclient.custom_objects_api()),
                  store=getattr(drain, "store", None))


def run(args: argparse.Namespace) -> int:
    # Catch SIGTERMs from the first moment: opening the store imports botocore (~1 s),
    # and an eviction then must still flush, not kill us mid-start.
    early: list[float] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: early.append(time.monotonic()))
    setup_logging()
    try:
        cfg = node_config.load(args)
    except CkptdrainError as err:
        print(f"ckptdrain agent: {err}", file=sys.stderr)
        return err.exit_code
    if cfg.reader:
        # A reader never captures or drains: the webhook gives it no agent.
        print(f"ckptdrain agent: {Env.ROLE.value} is 'reader': a reader restores its shard "
              "and never writes, so it runs no agent", file=sys.stderr)
        return InvalidInput.exit_code
    metrics = AgentMetrics()
    metrics.set_intervals(cfg.interval_s, cfg.global_every, drains=cfg.store_uri is not None)
    peer_held = peer_runtime.HeldSteps()
    reporter = FanOut(build_reporters(cfg, args))
    tier = LocalTier(cfg.local_dir)
    try:
        cfg.local_dir.mkdir(parents=True, exist_ok=True)
        # Never emptied here: the trainer may be running. The pod's own dir on
        # the node only as restore makes it (normally restore made it first).
        if pod_work.is_pod_dir(cfg.work_dir, cfg.local_dir):
            pod_work.make(cfg.work_dir, cfg.work_group)
        else:
            group_access.make_dir(cfg.work_dir)
        drain, watcher = build_drain(cfg, tier, reporter, metrics)
    except CkptdrainError as err:
        print(f"ckptdrain agent: {err}", file=sys.stderr)
        return err.exit_code
    agent = Agent(cfg, tier, reporter, metrics, drain)
    agent.goodput = goodput_watcher(cfg, tier, metrics, reporter)
    agent.refusals = refusal_events(cfg)
    agent.rounds = restore_rounds(cfg, agent, drain)

    def on_term(signum: int, frame: FrameType | None) -> None:
        agent.on_sigterm()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    for _ in early:
        agent.on_sigterm()
    if early:
        agent.sigterm_at = early[0]  # the flush budget counts from the first signal

    server = None
    if cfg.metrics_port:
        server = MetricsServer(metrics, cfg.metrics_port,
                               max_silence=max(30.0, cfg.flush_budget_s + 5))
        server.start()
        log.info("metrics on :%d/metrics, health on /healthz", server.port)
    publisher = start_pod_report(cfg, drain, reporter, tier, peer_held.holder_of,
                                 along=agent.goodput.annotation)
    if watcher is not None:
        attach_share_channel(cfg, watcher, drain, publisher, agent.terminating.is_set)
        watcher.start()
    if drain is not None:
        drain.start()
    if agent.rounds is not None:
        agent.rounds.start()
    try:
        peer = peer_runtime.start(cfg, tier, metrics, agent.terminating,
                                  on_held=peer_held.recorder(tier, reporter, drain))
    except (CkptdrainError, OSError) as err:
        # The peer tier is an extra copy: without it, local and global still work.
        log.error("peer tier disabled: %s", err)
        peer = None
    log.info("agent started: work %s, local %s, store %s, interval %ss, global every %d",
             cfg.work_dir, cfg.local_dir, cfg.store_uri, cfg.interval_s, cfg.global_every)
    code = agent.run()
    if peer is not None:
        peer.join(timeout=1.0)  # stopped by the flush's start; a send ends within a chunk
    if watcher is not None:
        watcher.stop()
    if server is not None:
        server.stop()
    if publisher is not None:
        publisher.close()  # the emergency checkpoint's states, if the API answers
    log.info("agent exiting with %d", code)
    if drain is not None and drain.running:
        # A part upload is still blocked on the network. Python would wait for it at
        # exit (executor threads are joined); the deadline does not. The journal is
        # consistent, and an unjournaled part is simply sent again next time.
        logging.shutdown()
        os._exit(code)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ckptdrain agent", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
