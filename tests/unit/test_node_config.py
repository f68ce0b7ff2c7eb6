"""The agent's config: flags over env over defaults, errors that name the field."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ckptdrain.errors import InvalidInput
from ckptdrain.node import config


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_env_per_pod_contract_is_read() -> None:
    env = {
        "CKPTDRAIN_WORK_DIR": "/w", "CKPTDRAIN_LOCAL_DIR": "/l", "CKPTDRAIN_LOCAL_KEEP": "3",
        "CKPTDRAIN_INTERVAL": "1h30m", "CKPTDRAIN_GLOBAL_EVERY": "4", "CKPTDRAIN_OVERLAP": "5%",
        "CKPTDRAIN_STORE_URI": "s3://bucket/p", "CKPTDRAIN_SHARE_FILE": "/s/bandwidth",
        "CKPTDRAIN_DEFAULT_RATE": "50MB/s", "CKPTDRAIN_GRACE_SECONDS": "60",
        "CKPTDRAIN_WRITER_ID": "3", "CKPTDRAIN_WRITERS": "8", "CKPTDRAIN_METRICS_PORT": "9200",
        "CKPTDRAIN_RESTORE_PREFER": "global",
    }
    cfg = config.load(_args(), env)
    assert cfg.work_dir == Path("/w") and cfg.local_dir == Path("/l")
    assert (cfg.local_keep, cfg.global_every, cfg.writer, cfg.writers) == (3, 4, 3, 8)
    assert cfg.interval_s == 5400 and cfg.overlap == pytest.approx(0.05)
    assert cfg.default_rate == 50e6 and cfg.grace_s == 60
    assert cfg.safety_margin_s == 6.0 and cfg.flush_budget_s == 54.0
    assert cfg.share_file == Path("/s/bandwidth") and cfg.metrics_port == 9200
    assert cfg.restore_prefer == "global" and cfg.restore_result == Path("/w/restore.json")


def test_flags_win_over_env() -> None:
    cfg = config.load(_args("--interval", "30s"), {"CKPTDRAIN_INTERVAL": "15m"})
    assert cfg.interval_s == 30


def test_rate_is_never_unlimited_by_default() -> None:
    assert config.load(_args(), {}).default_rate == config.FALLBACK_RATE


@pytest.mark.parametrize(("env", "field"), [
    ({"CKPTDRAIN_INTERVAL": "soon"}, "CKPTDRAIN_INTERVAL"),
    ({"CKPTDRAIN_OVERLAP": "150%"}, "CKPTDRAIN_OVERLAP"),
    ({"CKPTDRAIN_LOCAL_KEEP": "0"}, "CKPTDRAIN_LOCAL_KEEP"),
    ({"CKPTDRAIN_DEFAULT_RATE": "0"}, "CKPTDRAIN_DEFAULT_RATE"),
    ({"CKPTDRAIN_WRITERS": "4", "CKPTDRAIN_WRITER_ID": "pod-a"}, "CKPTDRAIN_WRITER_ID"),
    ({"CKPTDRAIN_WRITERS": "4", "CKPTDRAIN_WRITER_ID": "4"}, "CKPTDRAIN_WRITER_ID"),
    ({"CKPTDRAIN_GRACE_SECONDS": "10", "CKPTDRAIN_SAFETY_MARGIN": "10s"},
     "CKPTDRAIN_SAFETY_MARGIN"),
    ({"CKPTDRAIN_STORE_URI": "gs://b"}, "uri"),
    ({"CKPTDRAIN_METRICS_PORT": "99999"}, "CKPTDRAIN_METRICS_PORT"),
    ({"CKPTDRAIN_RESTORE": "maybe"}, "CKPTDRAIN_RESTORE"),
    ({"CKPTDRAIN_STORE_URI": "file:///mnt/ckpt", "CKPTDRAIN_COLD_STORAGE_CLASS": "STANDARD_IA"},
     "CKPTDRAIN_COLD_STORAGE_CLASS"),
    ({"CKPTDRAIN_STORE_URI": "s3://b/p", "CKPTDRAIN_COLD_STORAGE_CLASS": "STANDARD_IA",
      "CKPTDRAIN_COLD_AFTER": "0"}, "CKPTDRAIN_COLD_AFTER"),
    ({"CKPTDRAIN_STORE_URI": "gs://ckpt-b/p", "CKPTDRAIN_COLD_STORAGE_CLASS": "STANDARD_IA"},
     "CKPTDRAIN_COLD_STORAGE_CLASS"),
    ({"CKPTDRAIN_STORE_URI": "s3://ckpt-b/p", "CKPTDRAIN_COLD_STORAGE_CLASS": "NEARLINE"},
     "CKPTDRAIN_COLD_STORAGE_CLASS"),
])
def test_bad_values_name_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        config.load(_args(), env)
    assert err.value.field == field


def test_pod_name_is_writer_zero_when_alone() -> None:
    assert config.load(_args(), {"CKPTDRAIN_WRITER_ID": "trainer-0-abc"}).writer == 0


def test_help_renders() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    text = parser.format_help()
    assert "CKPTDRAIN_OVERLAP" in text and "10%" in text


def test_gcs_cold_classes_reach_a_gs_agent() -> None:
    cfg = config.load(_args(), {"CKPTDRAIN_STORE_URI": "gs://ckpt-b/p",
                                "CKPTDRAIN_COLD_STORAGE_CLASS": "COLDLINE",
                                "CKPTDRAIN_COLD_AFTER": "2"})
    assert (cfg.cold_storage_class, cfg.cold_after) == ("COLDLINE", 2)


@pytest.mark.parametrize("given", ["²", "١٢", "4294967295", "-1", "12a", "1 2"])
def test_a_work_group_that_is_no_ascii_group_id_is_refused_naming_it(given: str) -> None:
    with pytest.raises(InvalidInput) as err:
        config.load(_args(), {"CKPTDRAIN_WORK_GROUP": given})
    assert err.value.field == "CKPTDRAIN_WORK_GROUP"
    assert str(err.value) == ("CKPTDRAIN_WORK_GROUP: expected a group id: a whole number "
                              f"0 to 4294967294, got {given!r}")


@pytest.mark.parametrize(("given", "group"), [
    (None, None), ("", None), ("0", 0), (" 2000 ", 2000), ("4294967294", 4294967294)])
def test_a_work_group_is_read_as_a_group_id(given: str | None, group: int | None) -> None:
    env = {} if given is None else {"CKPTDRAIN_WORK_GROUP": given}
    assert config.load(_args(), env).work_group == group
