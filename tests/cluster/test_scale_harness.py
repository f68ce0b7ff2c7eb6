"""The scale harness (benchmarks/scale) at a tiny size, on its own real etcd +
kube-apiserver and the real operator: every figure docs/scale.md reports is
measured and sane. Figures only, never timings: those belong to the harness."""

from __future__ import annotations

from pathlib import Path

from benchmarks.scale import report
from benchmarks.scale.run import Size, run


def test_the_harness_measures_every_figure_at_20_writers(tmp_path: Path) -> None:
    result = run(Size(writers=20, policies=2, rounds=1, probe_pods=5, tick_s=0.2),
                 tmp_path, log=lambda _: None)

    # Every pod went through the webhook, and each creation has its latency.
    assert result["admission_errors"] == []
    assert result["admission_during_creation"]["n"] == 20
    assert result["admission_with_n_present"]["n"] == 5
    assert 0 < result["admission_with_n_present"]["p50_ms"] \
        <= result["admission_with_n_present"]["p99_ms"]

    # The round's writes were counted at the apiserver, the agents' among them.
    (checkpoint,) = result["rounds_detail"]
    assert result["agent_errors"] == {}
    # Two pod patches each, progress riding with the drain's start and end;
    # the lease was renewed at the job's start, so the check before the
    # commit is a read, not a write. No agent writes a record.
    assert checkpoint["agent_by_call"] == {"patch_namespaced_pod": 2 * 20}
    assert checkpoint["agent_writes_per_writer"] == 2
    assert checkpoint["writes_per_writer"] > checkpoint["agent_writes_per_writer"]
    # The operator made each policy's record once and folded the progress in.
    assert checkpoint["by_resource"]["POST checkpoints"] == 2
    assert 2 <= checkpoint["by_resource"]["PATCH checkpoints/status"] < 20
    assert result["lease_renewals_per_checkpoint"] == 0.5  # the loop, every other interval
    # The operator wrote the two policies' share channels, never a pod.
    assert checkpoint["by_resource"].get("PATCH checkpointshares", 0) \
        + checkpoint["by_resource"].get("POST checkpointshares", 0) >= 2
    assert checkpoint["by_resource"]["PATCH pods"] == 2 * 20
    assert checkpoint["operator_cpu_s"] > 0
    assert result["job_start_writes_per_writer"] >= 2  # a restore annotation and a lease

    # One record per policy and step, and the largest objects were measured.
    assert result["largest_bytes"]["checkpoints"] == 2
    assert result["largest_bytes"]["checkpoint"] > 0 and result["largest_bytes"]["pod"] > 0

    # The arriving job moved every writer's share, and each was seen.
    assert result["share_visible"]["affected"] == 20
    assert result["share_visible"]["max_s"] >= result["share_visible"]["p50_s"] > 0
    assert result["overshoot_cluster"] >= 0 and result["operator_rss_mib"] > 0

    table = report.markdown([result])
    assert "| 20 | 2 |" in table and "–" not in table.split("| 20 | 2 |")[1]
