"""The chart's alerts against a real Prometheus scraping real agents.

In the first test, two pods run the real agent and the simulated trainer as
processes: one drains to a real MinIO bucket, the other to a bucket that
does not exist (a job misconfigured from day one). A real Prometheus
scrapes both agents (labelled as the chart's PodMonitor labels them:
namespace, pod, policy) and evaluates the PrometheusRule the chart renders,
loaded as a rule file. The test reads what fires from Prometheus' HTTP API
(`ALERTS`) and asks it for the healthy pod's side of each expression
directly; the dashboard's queries run on the same series. The second test
restores a pod past a corrupt local copy and sees the fallback alert fire.
Thresholds come from the chart's values, made small (a 2 s interval, 5
intervals, a 1 minute stall window): waits poll with a cap, nothing asserts
on how long anything took.
"""

from __future__ import annotations

import json
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support import prometheus
from tests.support.agentprocs import Pod
from tests.support.s3servers import S3Server, free_port

INTERVAL = "2s"
DASHBOARD = prometheus.CHART / "dashboards" / "ckptdrain.json"
HELM_ARGS = ("--set", "metrics.prometheusRule.recoveryPointIntervals=5",
             "--set", "metrics.prometheusRule.drainStalledMinutes=1")


def _store_env(server: S3Server, bucket: str) -> dict[str, str]:
    return {"CKPTDRAIN_STORE_URI": f"s3://{bucket}/job", "CKPTDRAIN_S3_ENDPOINT":
            server.endpoint_url, "AWS_ACCESS_KEY_ID": server.access_key,
            "AWS_SECRET_ACCESS_KEY": server.secret_key, "AWS_REGION": server.region}


@pytest.fixture
def rules() -> dict[str, Any]:
    try:
        prometheus.binary("prometheus")
        return prometheus.chart_rules(*HELM_ARGS)
    except prometheus.MissingBinaries as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture
def pods(tmp_path: Path, minio: S3Server) -> Iterator[dict[str, tuple[Pod, int]]]:
    """{policy: (pod, metrics port)} for a healthy and a misconfigured job."""
    bucket = minio.create_bucket()
    stores = {"healthy": _store_env(minio, bucket),
              "broken": _store_env(minio, f"missing-{uuid.uuid4().hex[:12]}")}
    running: dict[str, tuple[Pod, int]] = {}
    try:
        for policy, env in stores.items():
            port = free_port()
            pod = Pod(tmp_path / policy, store_env=env, interval=INTERVAL, size="2MiB",
                      extra_env={"CKPTDRAIN_METRICS_PORT": str(port)})
            running[policy] = (pod, port)
            pod.start_agent()
            pod.start_trainer()
        yield running
    finally:
        for pod, _ in running.values():
            pod.stop_all()
        minio.delete_bucket(bucket)


def _firing(prom: prometheus.Prometheus) -> set[tuple[str, str]]:
    return {(r["metric"]["alertname"], r["metric"].get("policy", ""))
            for r in prom.query('ALERTS{alertstate="firing"}')}


def _expr(rules: dict[str, Any], alert: str) -> str:
    return next(str(r["expr"]) for g in rules["groups"] for r in g["rules"]
                if r.get("alert") == alert)


def _policies(prom: prometheus.Prometheus, expr: str) -> set[str]:
    return {r["metric"].get("policy", "") for r in prom.query(expr)}


def test_alerts_fire_for_the_broken_job_and_not_for_the_healthy_one(
        tmp_path: Path, rules: dict[str, Any], pods: dict[str, tuple[Pod, int]]) -> None:
    targets = [prometheus.Target(f"127.0.0.1:{port}",
                                 {"namespace": "ml", "pod": f"{policy}-0", "policy": policy})
               for policy, (_, port) in pods.items()]
    healthy, _ = pods["healthy"]
    with prometheus.running(tmp_path / "prometheus", targets, rule_groups=rules) as prom:
        prom.wait_for_scrape()
        # Every rule evaluates on real series without an error.
        prom.wait_for_every_rule_evaluated()
        healthy.wait_for(lambda: healthy.states("Global"), "a global checkpoint")

        # Wrong bucket from day one: no global timestamp to age, yet it fires.
        prom.wait_for("CkptdrainNeverCheckpointedGlobally for the broken job",
                      lambda: ("CkptdrainNeverCheckpointedGlobally", "broken") in _firing(prom))
        assert not prom.query(
            'ckptdrain_last_checkpoint_timestamp_seconds{policy="broken",tier="global"}')
        # ...and the failure kind says a person must act.
        prom.wait_for("CkptdrainDrainErrors (bucket_missing) for the broken job",
                      lambda: [r for r in prom.query('ALERTS{alertname="CkptdrainDrainErrors",'
                                                     'alertstate="firing",policy="broken"}')
                               if r["metric"]["kind"] == "bucket_missing"])
        # The healthy job's recovery point is fresh, and it has one.
        assert "healthy" not in _policies(prom, _expr(rules, "CkptdrainRecoveryPointStale"))
        assert "healthy" not in _policies(prom, _expr(rules, "CkptdrainNeverCheckpointedGlobally"))
        assert prom.query('ckptdrain_last_checkpoint_timestamp_seconds{policy="healthy",'
                          'tier="global"}')
        # The dashboard's queries run on the same real series: each one
        # evaluates, and the recovery point panel shows the healthy job.
        dashboard = json.loads(DASHBOARD.read_text())
        answers = {}
        for panel in (p for p in dashboard["panels"] if p["type"] != "row"):
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "1m")
                expr = expr.replace("$namespace", ".*").replace("$policy", ".*")
                answers.setdefault(panel["title"], []).extend(prom.query(expr))
        assert "healthy" in {r["metric"].get("policy") for r in
                             answers["Global recovery point age (oldest writer)"]}
        assert "broken" in {r["metric"].get("policy") for r in
                            answers["Writers with no global checkpoint"]}

        # Bytes pending and none sent for the whole window, once the agent is
        # older than the window.
        prom.wait_for("CkptdrainDrainStalled for the broken job",
                      lambda: ("CkptdrainDrainStalled", "broken") in _firing(prom), cap=240)
        assert "healthy" not in _policies(prom, _expr(rules, "CkptdrainDrainStalled"))
        firing = _firing(prom)
        assert not [a for a in firing if a[1] == "healthy"], firing

        # The healthy job's trainer stops checkpointing: its recovery point
        # ages past 3 global intervals and the stale alert fires for it.
        trainer = next(p for name, p, _ in healthy.procs if name == "trainer")
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
        prom.wait_for("CkptdrainRecoveryPointStale for the healthy job",
                      lambda: ("CkptdrainRecoveryPointStale", "healthy") in _firing(prom))
        (stale,) = prom.query('ALERTS{alertname="CkptdrainRecoveryPointStale",policy="healthy"}')
        assert stale["metric"]["severity"] == "critical"


def test_a_restore_past_a_corrupt_local_copy_raises_the_fallback_alert(
        tmp_path: Path, rules: dict[str, Any], minio: S3Server) -> None:
    bucket = minio.create_bucket()
    port = free_port()
    pod = Pod(tmp_path / "pod", store_env=_store_env(minio, bucket), interval=INTERVAL,
              size="2MiB", extra_env={"CKPTDRAIN_METRICS_PORT": str(port)})
    try:
        agent = pod.start_agent()
        trainer = pod.start_trainer()
        pod.wait_for(lambda: pod.states("Global"), "a global checkpoint")
        pod.sigterm(trainer, agent)
        newest = pod.tier.steps()[0]
        assert pod.tier.is_global(newest), pod.logs()
        shard = pod.tier.data_dir(newest) / "shard-000.bin"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x55
        shard.write_bytes(bytes(data))
        # The pod is replaced on the same node: empty work dir, restore, then the agent.
        shutil.rmtree(pod.work)
        code, result = pod.restore()
        assert code == 0 and result["tier"] == "global", result
        pod.start_agent()
        target = prometheus.Target(f"127.0.0.1:{port}",
                                   {"namespace": "ml", "pod": "fallback-0", "policy": "fallback"})
        with prometheus.running(tmp_path / "prometheus", [target], rule_groups=rules) as prom:
            prom.wait_for_scrape()
            prom.wait_for("CkptdrainRestoreFellBack",
                          lambda: ("CkptdrainRestoreFellBack", "fallback") in _firing(prom))
            (alert,) = prom.query('ALERTS{alertname="CkptdrainRestoreFellBack"}')
            assert alert["metric"]["severity"] == "warning"
            assert prom.query('ckptdrain_restore_outcome{outcome="restored",tier="global"} == 1')
    finally:
        pod.stop_all()
        minio.delete_bucket(bucket)
