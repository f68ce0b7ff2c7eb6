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


@pytest.mark.parametrize(("argv", "field"), [
    (["size", "--parameters", "405X", "--interval", "15m"], "--parameters"),
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


def _store_with_step(tmp_path: Path) -> str:
    src = tmp_path / "step-3"
    if not src.exists():  # pushed again by some cases: the same content, already committed
        src.mkdir()
        (src / "a.bin").write_bytes(os.urandom(1000))
    uri = f"file://{tmp_path}/store"
    assert cli.main(["push", str(src), uri, "-q", "--create"]) == 0
    (tmp_path / "empty").mkdir(exist_ok=True)
    return uri


def _data_gone(tmp_path: Path) -> str:
    uri = _store_with_step(tmp_path)
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
    ("verify --writer -1", lambda t, u: ["verify", str(t / "step-3"), "--against", u,
                                         "--writer", "-1"], 2, "invalid", "--writer"),
    ("verify a writer that does not exist",
     lambda t, u: ["verify", str(t / "step-3"), "--against", u, "--writer", "5"],
     2, "invalid", "--writer"),
    ("--endpoint-url notaurl", lambda t, u: ["ls", "s3://bucket", "--endpoint-url", "notaurl"],
     2, "invalid", "--endpoint-url"),
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
     2, "invalid", "--rate: expected a rate with its unit such as 50MB/s"),
    ("size --interval without a unit",
     lambda t, u: ["size", "--parameters", "405B", "--interval", "15"],
     2, "invalid", "--interval: expected a duration with its unit such as 15m"),
    ("size --parameters 405", lambda t, u: ["size", "--parameters", "405", "--interval", "15m"],
     2, "invalid", "--parameters: expected a model size of at least 1M"),
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
    uri = _store_with_step(tmp_path)
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
    assert {0, 1, 2, 3, 4, 5} <= set(_documented_codes()) and {0, 1, 2, 3, 4, 5} <= covered


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


# -- what each command says ------------------------------------------------------------


def _two_writers(tmp_path: Path) -> str:
    uri = f"file://{tmp_path}/store"
    for writer in (0, 1):
        src = tmp_path / f"w{writer}" / "step-4"
        src.mkdir(parents=True)
        (src / f"shard{writer}.bin").write_bytes(os.urandom(2000))
        assert cli.main(["push", str(src), uri, "--writer", str(writer), "--writers", "2",
                         "-q", "--create"]) == 0
    return uri


def test_verify_a_whole_pull_of_several_writers(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    uri = _two_writers(tmp_path)
    assert cli.main(["pull", uri, str(tmp_path / "d"), "-q"]) == 0
    assert cli.main(["verify", str(tmp_path / "d"), "--against", uri]) == 0
    assert cli.main(["verify", str(tmp_path / "d" / "1"), "--against", uri, "--writer", "1"]) == 0
    (tmp_path / "d" / "1" / "shard1.bin").write_bytes(b"changed")
    capsys.readouterr()
    assert cli.main(["verify", str(tmp_path / "d"), "--against", uri]) == 4
    assert "1/shard1.bin: 7 bytes" in capsys.readouterr().out


def test_verify_names_files_and_checks_every_step_with_all(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = _store_with_step(tmp_path)
    src = tmp_path / "step-9"
    src.mkdir()
    (src / "b.bin").write_bytes(b"nine")
    assert cli.main(["push", str(src), uri, "-q"]) == 0
    assert cli.main(["verify", uri, "--all"]) == 0
    assert "2 of 2 complete step(s) verified" in capsys.readouterr().out
    for path in (tmp_path / "store" / "data").rglob("a.bin"):
        path.write_bytes(b"rotten")
    assert cli.main(["verify", uri, "-q"]) == 0  # the newest step, 9, is intact
    assert cli.main(["verify", uri, "--all", "--json"]) == 4
    doc = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in doc["steps"] if s["problems"]] == [3]
    assert doc["steps"][1]["problems"][0].startswith("writer 0: a.bin: 6 bytes")


def test_size_quiet_prints_only_the_bandwidth(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*EXAMPLE, "-q"]) == 0
    assert capsys.readouterr().out == "63.0 GB/s\n"


def test_a_push_elsewhere_keeps_the_first_ones_resume_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import signal

    from ckptdrain.transfer import command

    src = tmp_path / "step-2"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(6 << 20))
    first, second = (f"file://{tmp_path}/{name}" for name in ("first", "second"))
    interrupt = [True]

    def progress(bar: object, done: int) -> None:
        if done > 0 and interrupt[0]:  # Ctrl-C, as a user presses it, once a part is sent
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(command._Bar, "__call__", progress)
    # push sets its own handlers; the test's are put back after
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert cli.main(["push", str(src), first, "--create", "--part-size", "1MiB",
                         "--concurrency", "1", "-q"]) == 130
        interrupt[0] = False
        assert cli.main(["push", str(src), second, "--create", "-q"]) == 0
        assert cli.main(["push", str(src), first, "--part-size", "1MiB", "--json"]) == 0
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert json.loads(capsys.readouterr().out)["resumed_bytes"] >= 1 << 20


def test_a_read_only_source_directory_says_where_the_journal_can_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    uri = _store_with_step(tmp_path)
    real = os.access
    # What the kernel answers for a directory on a read-only mount (root included).
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == tmp_path
                        and mode == os.W_OK else real(path, mode))
    src = tmp_path / "step-8"
    src.mkdir()
    (src / "x.bin").write_bytes(b"x")
    capsys.readouterr()
    assert cli.main(["push", str(src), uri]) == 2
    assert "pass --journal PATH" in capsys.readouterr().err
    assert cli.main(["push", str(src), uri, "-q", "--journal", str(tmp_path / "store" / "j")]) == 0


def test_ls_into_a_closed_pipe_is_quiet_and_succeeds(tmp_path: Path) -> None:
    uri = _store_with_step(tmp_path)
    for step in range(4, 40):
        src = tmp_path / f"step-{step}"
        src.mkdir()
        (src / "f").write_bytes(b"x")
        assert cli.main(["push", str(src), uri, "-q"]) == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(f"set -o pipefail; {sys.executable} -m ckptdrain ls {uri} | head -1",
                          shell=True, executable="/bin/bash", capture_output=True, text=True,
                          env=env)
    assert (proc.returncode, proc.stderr, proc.stdout.split()[0]) == (0, "", "STEP")


@pytest.mark.parametrize(("kubeconfig", "said"), [
    ("missing", "kubeconfig {path} does not exist"),
    ("unreachable", "cannot reach the API server at https://127.0.0.1:1: Connection refused"),
])
def test_the_operator_without_a_cluster_says_so_in_one_line(
        kubeconfig: str, said: str, tmp_path: Path) -> None:
    path = tmp_path / "config"
    if kubeconfig == "unreachable":
        path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: x\n"
                        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
                        "users: [{name: u, user: {token: t}}]\n"
                        "contexts: [{name: x, context: {cluster: c, user: u}}]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "ckptdrain", "operator", "--kubeconfig",
                           str(path)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == f"ckptdrain operator: {said.format(path=path)}\n"


def _help(*argv: str) -> str:
    return subprocess.run([sys.executable, "-m", "ckptdrain", *argv, "--help"],
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("command", ["push", "pull", "ls", "verify", "size"])
def test_each_commands_help_has_the_exit_codes(command: str) -> None:
    assert "exit codes:" in _help(command) and "130  interrupted" in _help(command)


def test_restore_and_peer_help_list_only_their_own_flags() -> None:
    restore, peer = _help("restore"), _help("peer")
    assert "--store-uri" in restore and "--restore-retry-deadline" in restore
    for agent_only in ("--interval", "--part-size", "--metrics-port", "--share-file"):
        assert agent_only not in restore and agent_only not in peer
    assert "--local-dir" in peer and "--store-uri" not in peer


def test_a_full_disk_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.smallfs import small_filesystem

    src = tmp_path / "step-1"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(3 << 20))
    uri = f"file://{tmp_path}/store"
    assert cli.main(["push", str(src), uri, "-q", "--create"]) == 0
    with small_filesystem(tmp_path / "small", "1m") as small:
        capsys.readouterr()
        assert cli.main(["pull", uri, str(small / "dest"), "--no-direct-io"]) == 1
        err = capsys.readouterr().err
    assert err.startswith("ckptdrain: error: No space left on device: ") and str(small) in err


def _stored_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_gc_lists_then_removes_what_a_replace_left_and_never_a_complete_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "step-12"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(200_000))
    uri = f"file://{tmp_path}/store"
    assert cli.main(["push", str(src), uri, "-q", "--create"]) == 0
    (src / "a.bin").write_bytes(os.urandom(300_000))
    assert cli.main(["push", str(src), uri, "-q", "--replace"]) == 0
    before = _stored_bytes(tmp_path / "store")
    assert before >= 500_000  # both attempts, while ls shows one
    capsys.readouterr()
    assert cli.main(["gc", uri, "--json"]) == 0  # the default: a dry run, 6h of grace
    doc = json.loads(capsys.readouterr().out)
    assert (doc["removable_bytes"], doc["waiting_bytes"]) == (0, 200_000)
    assert cli.main(["gc", uri, "--grace", "0s", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["removable_bytes"] == 200_000 and doc["removed"] == 0
    assert _stored_bytes(tmp_path / "store") == before
    assert cli.main(["gc", uri, "--grace", "0s", "--delete"]) == 0
    assert "1 object(s) (200 kB) and 0 unfinished upload(s) removed" in capsys.readouterr().out
    assert _stored_bytes(tmp_path / "store") < before - 190_000
    assert cli.main(["verify", uri, "--all", "-q"]) == 0
    assert cli.main(["pull", uri, str(tmp_path / "d"), "-q"]) == 0
    assert (tmp_path / "d" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()


def test_gc_of_a_store_that_does_not_exist_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gc", f"file://{tmp_path}/typo"]) == 3
    assert "typo does not exist" in capsys.readouterr().err


def test_pull_learns_its_total_before_the_first_byte(tmp_path: Path) -> None:
    """What the progress bar's size, rate and ETA come from."""
    from ckptdrain.store import open_store
    from ckptdrain.transfer.fetch import fetch

    uri = _store_with_step(tmp_path)
    events: list[tuple[str, int]] = []
    fetch(open_store(uri), tmp_path / "d", on_total=lambda n: events.append(("total", n)),
          progress=lambda n: events.append(("done", n)))
    assert events[0] == ("total", 1000) and events[-1] == ("done", 1000)


def test_pulls_bar_on_a_terminal_shows_the_size(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    uri = _store_with_step(tmp_path)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main(["pull", uri, str(tmp_path / "d")]) == 0
    assert "1.00k/1.00k" in terminal.getvalue()  # done of total: what rate and ETA need
