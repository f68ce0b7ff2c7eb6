"""Canary secrets: a password in the endpoint URL's userinfo, AWS_SECRET_ACCESS_KEY and
AWS_SESSION_TOKEN carry canary values through the CLI, `ckptdrain restore` and the
agent (with its metrics page), with a reachable and an unreachable endpoint.

Invariant: no canary appears in any stdout, stderr, log, events file, result
file, journal or metrics page those processes produce.
"""

from __future__ import annotations

import secrets
import time
import urllib.request
from pathlib import Path

from tests.support.agentprocs import Pod
from tests.support.s3servers import free_port
from tests.torture.core import Category, clean_env, make_tree, run_cli
from tests.torture.ops import Ctx
from tests.torture.stores import StoreKind


def _found(text: str, canaries: dict[str, str]) -> list[str]:
    return [name for name, value in canaries.items() if value in text]


def run(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    canaries = {"userinfo password": "CANARYpw" + secrets.token_hex(6),
                "AWS_SECRET_ACCESS_KEY": "CANARYsk" + secrets.token_hex(6),
                "AWS_SESSION_TOKEN": "CANARYst" + secrets.token_hex(6)}
    pw = canaries["userinfo password"]
    base = ctx.scratch / f"canary-{kind.name}"
    src = base / "step-3"
    make_tree(src, ctx.opts.rng, 256 * 1024, files=3)
    endpoints = {"unreachable": f"http://user:{pw}@bad_host:9000"}
    bucket = "canary-bucket"
    if kind.server is None:
        endpoints["refused"] = f"http://user:{pw}@127.0.0.1:{free_port()}"
    else:
        port = kind.server.endpoint_url.rsplit(":", 1)[1]
        endpoints["real server"] = f"http://user:{pw}@127.0.0.1:{port}"
        bucket = kind.bucket
    uri = f"s3://{bucket}/canary"
    secret_env = {"AWS_ACCESS_KEY_ID": kind.server.access_key if kind.server else "AKIDTEST",
                  "AWS_SECRET_ACCESS_KEY": canaries["AWS_SECRET_ACCESS_KEY"],
                  "AWS_SESSION_TOKEN": canaries["AWS_SESSION_TOKEN"],
                  "AWS_REGION": "us-east-1"}

    def scan(what: str, text: str) -> None:
        leaked = _found(text, canaries)
        cat.check(not leaked, f"{what}: printed the {', '.join(leaked)}: "
                  f"{_context(text, canaries)}")

    for label, endpoint in endpoints.items():
        # The CLI runs in the worker (the same main(), a fraction of the start-up);
        # restore and the agent run as processes of their own.
        for args in (["ls", uri], ["push", str(src), uri], ["pull", uri, str(base / "dest")],
                     ["verify", uri]):
            flag = ctx.cli(None, *args, "--endpoint-url", endpoint, env=secret_env)
            scan(f"{args[0]} --endpoint-url ({label})", flag.out + flag.err)
        via_env = ctx.cli(None, "ls", uri, env={**secret_env, "CKPTDRAIN_S3_ENDPOINT": endpoint,
                                                 "AWS_ENDPOINT_URL": endpoint})
        scan(f"ls with the endpoint in the environment ({label})", via_env.out + via_env.err)
        result = base / f"restore-{label}.json"
        restore = run_cli(["restore", "--work-dir", str(base / "work"), "--local-dir",
                           str(base / "local"), "--metrics-port", "0", "--restore-result",
                           str(result)], clean_env({**secret_env, "CKPTDRAIN_STORE_URI": uri,
                                                    "CKPTDRAIN_S3_ENDPOINT": endpoint}))
        scan(f"restore ({label})", restore.out + restore.err
             + (result.read_text() if result.exists() else ""))
    label = "real server" if "real server" in endpoints else "unreachable"
    _agent(base / "agent", uri, endpoints[label], secret_env, label, scan, cat)


def _agent(root: Path, uri: str, endpoint: str, secret_env: dict[str, str], label: str,
           scan: object, cat: Category) -> None:
    port = free_port()
    pod = Pod(root, store_env=clean_env({**secret_env, "CKPTDRAIN_STORE_URI": uri,
                                         "CKPTDRAIN_S3_ENDPOINT": endpoint}),
              size="1MiB", interval="0.3s", extra_env={"CKPTDRAIN_METRICS_PORT": str(port)})
    pages = ""
    try:
        agent = pod.start_agent(wait=False)
        trainer = pod.start_trainer()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and agent.poll() is None:
            try:
                for path in ("/metrics", "/healthz"):
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                        pages += r.read().decode(errors="replace")
                if pod.event_list():
                    break
            except OSError:
                pass
            time.sleep(0.5)
        # Refusing the endpoint as invalid configuration (exit 2) is as good as running.
        code = agent.poll()
        cat.check(bool(pages) or code == 2, f"agent ({label}): exited {code} without ever "
                  "serving its metrics page")
        pod.sigterm(trainer, agent, timeout=60)
    finally:
        pod.stop_all()
    texts = [pages]
    for path in root.rglob("*"):
        if path.is_file() and path.stat().st_size < (8 << 20) and ".bin" not in path.name:
            texts.append(path.read_text(errors="replace"))
    scan(f"agent ({label}): logs, events, journals, metrics", "\n".join(texts))  # type: ignore[operator]


def _context(text: str, canaries: dict[str, str]) -> str:
    for value in canaries.values():
        at = text.find(value)
        if at >= 0:
            return repr(text[max(0, at - 120): at + 40])
    return ""
