"""`ckptdrain` as a user meets it: what each command says, and where."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.clistore import store_with_step

from ckptdrain import cli

EXAMPLE = ["size", "--parameters", "405B", "--interval", "15m", "--overlap", "10%"]


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
    uri = store_with_step(tmp_path)
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
    uri = store_with_step(tmp_path)
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
    uri = store_with_step(tmp_path)
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
    ("not yaml", "no Kubernetes cluster configured: not in a pod, and no usable kubeconfig "
     "(while parsing a block mapping); pass --kubeconfig or set KUBECONFIG"),
])
def test_the_operator_without_a_cluster_says_so_in_one_line(
        kubeconfig: str, said: str, tmp_path: Path) -> None:
    path = tmp_path / "config"
    if kubeconfig == "unreachable":
        path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: x\n"
                        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
                        "users: [{name: u, user: {token: t}}]\n"
                        "contexts: [{name: x, context: {cluster: c, user: u}}]\n")
    if kubeconfig == "not yaml":
        path.write_text(": [\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "ckptdrain", "operator", "--kubeconfig",
                           str(path)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == f"ckptdrain operator: {said.format(path=path)}\n"


def test_goodput_with_a_kubeconfig_that_is_not_yaml_says_so_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(": [\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), HOME=str(tmp_path), KUBECONFIG=str(path))
    proc = subprocess.run([sys.executable, "-m", "ckptdrain", "goodput"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == ("ckptdrain: error: no usable kubeconfig: while parsing a block "
                           "mapping (set KUBECONFIG to a valid one)\n")


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


def test_gc_keeps_an_attempt_replaced_between_its_listing_and_its_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc lists the manifests first and reads each step's manifest later: a push
    --replace in between must leave the attempt it replaced alone for the
    grace period (a restore may still read it), however old that attempt."""
    from ckptdrain.store.local import LocalStore
    from ckptdrain.transfer import prune

    src = tmp_path / "step-10"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(100_000))
    uri = f"file://{tmp_path}/store"
    assert cli.main(["push", str(src), uri, "-q", "--create"]) == 0
    two_days_ago = time.time() - 2 * 86400
    for path in (tmp_path / "store").rglob("*"):
        os.utime(path, (two_days_ago, two_days_ago))
    original = prune.current_keys

    def replaced_meanwhile(store: object, step: int, writer: int) -> object:
        (src / "a.bin").write_bytes(os.urandom(120_000))
        assert cli.main(["push", str(src), uri, "-q", "--replace"]) == 0
        return original(store, step, writer)  # type: ignore[arg-type]

    monkeypatch.setattr(prune, "current_keys", replaced_meanwhile)
    found = prune.find_leftovers(LocalStore(str(tmp_path / "store")), None)
    assert not found.objects
    assert [i.size for i in found.waiting] == [100_000]


def test_gc_of_a_store_that_does_not_exist_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gc", f"file://{tmp_path}/typo"]) == 3
    assert "typo does not exist" in capsys.readouterr().err


def test_pull_learns_its_total_before_the_first_byte(tmp_path: Path) -> None:
    """What the progress bar's size, rate and ETA come from."""
    from ckptdrain.store import open_store
    from ckptdrain.transfer.fetch import fetch

    uri = store_with_step(tmp_path)
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

    uri = store_with_step(tmp_path)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main(["pull", uri, str(tmp_path / "d")]) == 0
    assert "1.00k/1.00k" in terminal.getvalue()  # done of total: what rate and ETA need
