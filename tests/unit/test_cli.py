"""`ckptdrain` as a user meets it: outputs, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.clistore import store_with_step

from ckptdrain import cli
from ckptdrain.transfer import direct_io

EXAMPLE = ["size", "--parameters", "405B", "--interval", "15m", "--overlap", "10%"]


def test_size_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(EXAMPLE) == 0
    out = capsys.readouterr().out
    assert "63.0 GB/s" in out and "5.67 TB" in out and "1m30s" in out


def test_size_json_pins_63_gb_per_s(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*EXAMPLE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpoint_bytes"] == 5.67e12
    assert doc["required_bandwidth_bytes_per_second"] == pytest.approx(63e9, rel=1e-12)
    assert doc["drain_seconds"] == pytest.approx(90)


def test_size_with_caps_and_mtti(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["size", "--parameters", "405B", "--mtti", "150m", "--cap", "10GB/s",
            "--local-write-time", "30s", "--drainers", "4", "--json"]
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["binding_cap"] == "policy" and doc["bandwidth_constrained"]
    assert doc["local_interval_seconds"] == 900
    assert doc["per_drainer_bandwidth_bytes_per_second"] == pytest.approx(2.5e9)


def test_size_says_which_step_each_kind_of_interruption_restores(
        capsys: pytest.CaptureFixture[str]) -> None:
    gke = ["size", "--parameters", "70B", "--interval", "5m", "--global-every", "4",
           "--mtti", "150m"]
    assert cli.main(gke) == 0
    out = capsys.readouterr().out
    assert "2m30s with every node intact (local step), 12m with a node lost (global step; " \
        "5% of interruptions)" in out
    assert "expected goodput       98%" in out
    assert cli.main([*gke, "--peer-tier", "--node-loss-fraction", "10%", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["node_loss_restores_from"] == "peer" and doc["node_loss_fraction"] == 0.1
    assert doc["lost_work_node_lost_seconds"] == pytest.approx(180)
    assert doc["goodput"] == pytest.approx(1 - (0.9 * 150 + 0.1 * 180) / 9000)


@pytest.mark.parametrize(("argv", "field"), [
    (["size", "--parameters", "405X", "--interval", "15m"], "--parameters"),
    (["size", "--parameters", "70B", "--interval", "5m", "--node-loss-fraction", "120%"],
     "--node-loss-fraction"),
    (["size", "--parameters", "405B", "--interval", "soon"], "--interval"),
    (["size", "--parameters", "405B", "--interval", "15m", "--overlap", "150%"], "--overlap"),
    (["size", "--interval", "15m"], "--parameters"),
    (["push", "/nonexistent-dir-1", "file:///tmp/x", "--step", "1", "--rate", "fast"], "--rate"),
    (["pull", "ftp://x", "/tmp/d"], "uri"),
])
def test_bad_input_exits_2_naming_the_field(argv: list[str], field: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ckptdrain: error: ") and field in err
    assert "Traceback" not in err


def test_push_ls_pull_verify_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "step-12"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(300_000))
    uri = f"file://{tmp_path}/store"
    assert cli.main(["push", str(src), uri, "--part-size", "1MiB", "--json", "--create"]) == 0
    pushed = json.loads(capsys.readouterr().out)
    assert pushed["step"] == 12 and pushed["bytes"] == 300_000
    assert list(tmp_path.glob(".step-12*")) == []  # the journal goes on success
    assert cli.main(["ls", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["complete"]
    assert cli.main(["pull", uri, str(tmp_path / "out"), "--step", "12", "-q"]) == 0
    assert (tmp_path / "out" / "w.bin").read_bytes() == (src / "w.bin").read_bytes()
    assert cli.main(["verify", uri]) == 0
    on_disk = direct_io.worthwhile(tmp_path)
    for flags, io in (([], "direct" if on_disk else "buffered"), (["--no-direct-io"], "buffered")):
        dest = tmp_path / f"out{len(flags)}"
        capsys.readouterr()
        assert cli.main(["pull", uri, str(dest), "--json", *flags]) == 0
        pulled = json.loads(capsys.readouterr().out)
        # All but the file's unaligned tail went by direct I/O, or nothing did.
        assert (pulled["io"], pulled["direct_bytes"]) == (
            io, 300_000 - 300_000 % direct_io.ALIGN if io == "direct" else 0)
        assert (dest / "w.bin").read_bytes() == (src / "w.bin").read_bytes()
    (tmp_path / "out" / "w.bin").write_bytes(b"tampered")
    capsys.readouterr()
    assert cli.main(["verify", str(tmp_path / "out"), "--against", uri]) == 4
    assert "w.bin" in capsys.readouterr().out


def test_pull_from_an_empty_store_exits_5(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert cli.main(["pull", f"file://{tmp_path}/empty", str(tmp_path / "d")]) == 5
    assert "no complete" in capsys.readouterr().err


def test_help_documents_exit_codes_and_version() -> None:
    out = subprocess.run([sys.executable, "-m", "ckptdrain", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for code in ("0 ", "2 ", "3 ", "4 ", "5 ", "130"):
        assert code in out
    version = subprocess.run([sys.executable, "-m", "ckptdrain", "--version"],
                             capture_output=True, text=True, check=True).stdout
    assert version.startswith("ckptdrain ")


# -- exit codes, as docs/cli.md states them ---------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _documented_codes() -> dict[int, str]:
    """The "Exit codes" table of docs/cli.md: code -> meaning."""
    section = DOCS.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", section, re.MULTILINE)
    return {int(code): meaning for code, meaning in rows}


def _changed_step(tmp_path: Path, uri: str) -> list[str]:
    """step-3 edited after it was pushed: pushing it again is a conflict."""
    (tmp_path / "step-3" / "a.bin").write_bytes(b"changed after the push")
    return ["push", str(tmp_path / "step-3"), uri]


def _data_gone(tmp_path: Path) -> str:
    uri = store_with_step(tmp_path)
    for path in (tmp_path / "store" / "data").rglob("a.bin"):
        path.unlink()
    return uri


# (name, argv from (tmp_path, uri of a store holding step 3), exit code, a word from the
# docs' meaning of that code, what stderr must name)
CASES: list[tuple[str, Callable[[Path, str], list[str]], int, str, str]] = [
    ("size", lambda t, u: EXAMPLE, 0, "success", ""),
    ("manifest file missing", lambda t, u: ["verify", str(t), "--manifest", str(t / "no.json")],
     1, "other", "no.json"),
    ("push --part-size 0", lambda t, u: ["push", str(t / "step-3"), u, "--part-size", "0"],
     2, "invalid", "--part-size"),
    ("push --part-size -5", lambda t, u: ["push", str(t / "step-3"), u, "--part-size", "-5"],
     2, "invalid", "--part-size"),
    ("push --writer 100000", lambda t, u: ["push", str(t / "step-3"), u, "--writer", "100000"],
     2, "invalid", "--writer"),
    ("push --writer -1", lambda t, u: ["push", str(t / "step-3"), u, "--writer", "-1"],
     2, "invalid", "--writer"),
    ("push --step -1", lambda t, u: ["push", str(t / "step-3"), u, "--step", "-1"],
     2, "invalid", "--step"),
    ("push --rate -5MB/s", lambda t, u: ["push", str(t / "step-3"), u, "--rate", "-5MB/s"],
     2, "invalid", "--rate"),
    ("pull --writer -1", lambda t, u: ["pull", u, str(t / "d"), "--writer", "-1"],
     2, "invalid", "--writer"),
    ("pull --part-size 0", lambda t, u: ["pull", u, str(t / "d"), "--part-size", "0"],
     2, "invalid", "--part-size"),
    ("push of a step changed since it was pushed", _changed_step, 6, "conflict", "--replace"),
    ("pull --concurrency 100000000",
     lambda t, u: ["pull", u, str(t / "d"), "--concurrency", "100000000"],
     2, "invalid", "--concurrency"),
    ("push --concurrency 0", lambda t, u: ["push", str(t / "step-3"), u, "--concurrency", "0"],
     2, "invalid", "--concurrency"),
    ("verify --writer -1", lambda t, u: ["verify", str(t / "step-3"), "--against", u,
                                         "--writer", "-1"], 2, "invalid", "--writer"),
    ("verify a writer that does not exist",
     lambda t, u: ["verify", str(t / "step-3"), "--against", u, "--writer", "5"],
     2, "invalid", "--writer"),
    ("--endpoint-url notaurl", lambda t, u: ["ls", "s3://bucket", "--endpoint-url", "notaurl"],
     2, "invalid", "--endpoint-url"),
    ("size --parameters 1e30", lambda t, u: ["size", "--parameters", "1e30", "--interval",
                                             "15m"], 2, "invalid", "from 1M to 1000T"),
    ("size --interval of a century",
     lambda t, u: ["size", "--parameters", "405B", "--interval", "876000h"],
     2, "invalid", "at most a year"),
    ("demo --interval 4 (no unit)", lambda t, u: ["demo", "--interval", "4"],
     2, "invalid", "--interval: expected a positive duration with its unit"),
    ("size --parameters 1e308", lambda t, u: ["size", "--parameters", "1e308", "--interval",
                                              "15m"], 2, "invalid", "--parameters"),
    ("store path is a file", lambda t, u: ["ls", f"file://{t}/step-3/a.bin"], 3, "store", ""),
    ("ls a store directory that does not exist", lambda t, u: ["ls", f"file://{t}/typo"],
     3, "store", "/typo does not exist"),
    ("push to a store directory that does not exist",
     lambda t, u: ["push", str(t / "step-3"), f"file://{t}/typo"], 3, "store", "--create"),
    ("pull a step never pushed", lambda t, u: ["pull", u, str(t / "d"), "--step", "1300"],
     5, "no complete", "step 1300 is not in"),
    ("verify a step never pushed", lambda t, u: ["verify", u, "--step", "1300"],
     5, "no complete", "step 1300 is not in"),
    ("verify a DIR that does not exist",
     lambda t, u: ["verify", str(t / "nonexistent"), "--against", u], 2, "invalid", "DIR"),
    ("push an empty directory", lambda t, u: ["push", _mkdir(t / "step-5"), u],
     2, "invalid", "at least one file"),
    ("push a file name with a newline", lambda t, u: ["push", _named(t, "a\nb"), u],
     2, "invalid", "step-6/a\\nb"),
    ("push a file name that is not UTF-8",
     lambda t, u: ["push", _named(t, os.fsdecode(b"a\xffb")), u], 2, "invalid", "step-6/a\\xffb"),
    ("pull --step beyond any step",
     lambda t, u: ["pull", u, str(t / "d"), "--step", "99999999999999999999999"],
     2, "invalid", "--step"),
    ("verify --step beyond any step",
     lambda t, u: ["verify", u, "--step", "99999999999999999999999"], 2, "invalid", "--step"),
    ("push --rate without a unit", lambda t, u: ["push", str(t / "step-3"), u, "--rate", "500"],
     2, "invalid", "--rate: expected a positive rate with its unit such as 50MB/s"),
    ("size --interval without a unit",
     lambda t, u: ["size", "--parameters", "405B", "--interval", "15"],
     2, "invalid", "--interval: expected a positive duration with its unit such as 15m"),
    ("size --interval -5m (the message suggests nothing it refuses)",
     lambda t, u: ["size", "--parameters", "405B", "--interval", "-5m"],
     2, "invalid", "expected a positive duration with its unit such as 15m, 900s or 1h30m, "
     "got '-5m'"),
    ("size --parameters 405", lambda t, u: ["size", "--parameters", "405", "--interval", "15m"],
     2, "invalid", "--parameters: expected a model size from 1M to 1000T"),
    ("size --bytes-per-parameter 14B",
     lambda t, u: ["size", "--parameters", "405B", "--interval", "15m",
                   "--bytes-per-parameter", "14B"], 2, "invalid", "such as 14 (bf16 + Adam)"),
    ("size without --parameters", lambda t, u: ["size", "--interval", "15m"],
     2, "invalid", "--parameters: expected a parameter count (or --checkpoint-bytes), nothing"),
    ("pull --step whose data is gone", lambda t, u: ["pull", _data_gone(t), str(t / "d"),
                                                     "--step", "3"], 4, "integrity", "step 3"),
    ("verify a changed file", lambda t, u: ["verify", str(_changed(t)), "--against", u],
     4, "integrity", ""),
    ("verify an empty store", lambda t, u: ["verify", f"file://{t}/empty"], 5, "no complete", ""),
    ("verify DIR against an empty store",
     lambda t, u: ["verify", str(t / "step-3"), "--against", f"file://{t}/empty"],
     5, "no complete", ""),
    ("pull from an empty store", lambda t, u: ["pull", f"file://{t}/empty", str(t / "d")],
     5, "no complete", ""),
]


def _mkdir(path: Path) -> str:
    path.mkdir()
    return str(path)


def _named(tmp_path: Path, name: str) -> str:
    src = tmp_path / "step-6"
    src.mkdir()
    (src / "fine.bin").write_bytes(b"x")
    (src / name).write_bytes(b"x")
    return str(src)


def _changed(tmp_path: Path) -> Path:
    (tmp_path / "step-3" / "a.bin").write_bytes(b"changed")
    return tmp_path / "step-3"


@pytest.mark.parametrize(("name", "argv", "code", "word", "names"), CASES,
                         ids=[c[0] for c in CASES])
def test_exit_codes_match_the_docs(name: str, argv: Callable[[Path, str], list[str]],
                                   code: int, word: str, names: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    documented = _documented_codes()
    assert word in documented[code].lower(), (code, documented[code])
    uri = store_with_step(tmp_path)
    args = argv(tmp_path, uri)
    capsys.readouterr()
    assert cli.main(args) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if code not in (0, 4) or err:  # verify's problems go to stdout; errors are one line
        assert err.count("\n") == 1 and err.startswith("ckptdrain: error: "), err
    assert names in err


def test_every_documented_failure_code_has_a_case() -> None:
    covered = {c[2] for c in CASES}
    failures = _code_exit_codes() - {0, 130}  # 130: a signal, exercised by the drain tests
    assert failures <= set(_documented_codes()) and failures <= covered, failures - covered


def _code_exit_codes() -> set[int]:
    """Every exit code the error taxonomy (errors.py) carries, and success."""
    from ckptdrain import errors

    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.CkptdrainError)]
    return {0} | {c.exit_code for c in classes}


def test_the_exit_code_table_is_the_taxonomy_and_each_row_has_an_example() -> None:
    section = DOCS.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.+) \| (.+) \|$", section, re.MULTILINE)
    assert {int(code) for code, _, _ in rows} == _code_exit_codes()
    assert all(example.strip() for _, _, example in rows)
    assert set(map(int, re.findall(r"^  (\d+) ", cli.EXIT_CODES, re.MULTILINE))) \
        == _code_exit_codes()
