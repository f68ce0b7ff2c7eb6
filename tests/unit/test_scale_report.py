"""benchmarks/scale: the pure parts (sizes, growth exponents, the table)."""

from __future__ import annotations

import pytest
from benchmarks.scale import report
from benchmarks.scale.cli import parse
from benchmarks.scale.hollow import drain_ticks, realistic_ticks
from benchmarks.scale.run import Size, layout


def test_writers_spread_evenly_over_policies() -> None:
    writers, per = layout(Size(writers=11, policies=3))
    assert per == {"p0": 4, "p1": 4, "p2": 3} and len(writers) == 11
    assert len({w.pod for w in writers}) == 11


def test_exponent_between_two_sizes() -> None:
    assert report.exponent(500, 10, 5000, 100) == 1.0  # linear
    assert report.exponent(500, 10, 5000, 1000) == 2.0  # quadratic
    assert report.exponent(500, 3, 5000, 3) == 0.0  # independent of size
    assert report.exponent(500, 0, 5000, 3) is None


def _result(writers: int, policies: int, writes: float) -> dict[str, object]:
    return {"writers": writers, "policies": policies,
            "writes_per_writer_per_checkpoint": writes}


def test_growth_is_read_along_each_axis() -> None:
    lines = report.growth([_result(100, 10, 5), _result(1000, 10, 50), _result(1000, 100, 50)])
    by_axis = {(g["axis"], g.get("policies", g.get("writers"))): g for g in lines}
    assert by_axis[("writers", 10)]["exponents"]["writes/writer/ckpt"] == 1.0
    assert by_axis[("policies", 1000)]["exponents"]["writes/writer/ckpt"] == 0.0


def test_drain_publishes_a_falling_pending_count() -> None:
    assert drain_ticks(100, 4) == [75, 50, 25]
    assert realistic_ticks(5.67e12 / 50, 63e9 * 0.8 / 50) == 22  # 112 s in 5 s periods


@pytest.mark.parametrize("argv", [["--writers", "0"], ["--writers", "a,b"],
                                  ["--policies", ""], ["--rounds", "0"]])
def test_bad_sizes_are_one_clear_line(argv: list[str], capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert argv[0] in err and "Traceback" not in err


def test_a_quantile_from_histograms_is_the_upper_edge_of_its_bucket() -> None:
    from benchmarks.scale import latency

    def text(counts: tuple[int, int, int, int]) -> str:
        edges = ("0.01", "0.05", "0.25", "+Inf")
        lines = [f'ckptdrain_webhook_seconds_bucket{{outcome="ok",webhook="pod",le="{e}"}} {c}'
                 for e, c in zip(edges, counts, strict=True)]
        lines.append('ckptdrain_webhook_seconds_bucket{outcome="ok",webhook="policy",le="0.01"} 9')
        return "\n".join(lines)

    before = latency.buckets(text((10, 10, 10, 10)), "ckptdrain_webhook_seconds",
                             {"webhook": "pod"})
    # 100 more: 90 under 10 ms, 9 under 50 ms, 1 under 250 ms.
    after = latency.buckets(text((100, 109, 110, 110)), "ckptdrain_webhook_seconds",
                            {"webhook": "pod"})
    assert latency.quantile_ms(before, after, 0.5) == 10.0
    assert latency.quantile_ms(before, after, 0.99) == 50.0
    assert latency.quantile_ms(before, after, 1.0) == 250.0
    assert latency.quantile_ms(after, after, 0.5) is None  # nothing observed
