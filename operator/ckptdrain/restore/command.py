"""`ckptdrain restore`: the init step that puts the newest checkpoint where the trainer looks.

The engine that chooses and places the step is restore/engine.py; here is
the process around it.

Exit codes (and the result's `outcome`, restore/result.py): 0 restored or
fresh start (the store answered and nothing exists anywhere); 1 a checkpoint
exists but could not be written here (work volume full, over quota or
read-only; a local copy that cannot fit is refused before copying); 2 invalid
configuration; 3 the global tier could not be asked and the local tier had
nothing usable (restarting from scratch then could throw away days of
training, so we fail and let the kubelet retry); 4 candidates existed but
none verified, or the store holds a step that failed verification (a manifest
that does not parse or disagrees), or the newest step was saved by another
writer count and may not be handed to the trainer (restore/reshard.py; one
that may is exit 0, outcome `reshard`, nothing placed); 5 nothing anywhere,
but the policy's store moved away from a prefix its checkpoints reached
(CKPTDRAIN_EARLIER_STORES, outcome `history_elsewhere`: copy them over, or
set spec.relocation.startFresh).
Only exit 0 without a step is a fresh start: a step some of whose writers'
manifests are merely missing (still being written, or abandoned) does not
block one. Every outcome but a bad configuration starts by emptying the
work dir of what a previous pod left (restore/workdir.py): what cannot be
removed is exit 1, naming the path. The pod's own work dir on the node is
made first (restore/pod_work.py): a symlink or a dir restore did not make
in its place is exit 1 too. The pod annotation `ckptdrain.io/restore: skip` asks for one on
purpose: nothing is placed, outcome `fresh_start`, reason "skipped by
annotation".

Exit 3 is never immediate: a store that does not answer (when listing, or
mid-fetch) is asked again with jittered back-off until the policy's
`restore.retryDeadline` (restore/retry.py). A transient failure while
fetching the newest step ends that try; it never falls back to an older
step, which would throw progress away (and with several writers could put
ranks on different steps). The final line, with the reason, is also the init
container's termination message, so `kubectl describe pod` shows it.

Unfinished drain journals on the local tier are left to the agent: restore
runs before the trainer and every second it spends delays the whole job,
while the agent resumes the journal in the background moments later.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any

from ckptdrain import units
from ckptdrain.errors import BucketMissing, CkptdrainError, InvalidInput
from ckptdrain.node import config as node_config
from ckptdrain.restore import retry
from ckptdrain.restore.engine import restore, skip
from ckptdrain.restore.result import OUTCOMES, RestoreResult, skipped_lines, summary_line
from ckptdrain.store.base import Store

log = logging.getLogger("ckptdrain.restore")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    node_config.add_arguments(parser, node_config.RESTORE_FIELDS)


#: Where the kubelet reads a container's termination message (its default
#: terminationMessagePath); written only when the kubelet made it.
TERMINATION_LOG = Path("/dev/termination-log")


def run(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("botocore").setLevel(logging.WARNING)
    try:
        cfg = node_config.load(args)
    except CkptdrainError as err:
        print(f"ckptdrain restore: {err}", file=sys.stderr)
        _termination_message(f"ckptdrain restore: {err}")
        return err.exit_code
    if not cfg.restore:
        result = skip(cfg, "disabled", "")
        code = OUTCOMES[result.outcome]
        result.write(cfg.restore_result)
        if code == 0:
            print("ckptdrain restore: disabled (CKPTDRAIN_RESTORE=false); fresh start")
            return 0
        print(summary_line(result, code), file=sys.stderr)
        _termination_message(summary_line(result, code))
        return code
    if cfg.restore_skip:
        result = skip(cfg)
        code = OUTCOMES[result.outcome]
    else:
        result, code = restore_with_retries(cfg)
    result.write(cfg.restore_result)
    if node_config.in_cluster(cfg):
        from ckptdrain.node.kube import annotate_own_pod_with
        from ckptdrain.restore.annotations import pod_annotations

        # One patch, failed or not: a failure's reason reaches the policy status.
        annotate_own_pod_with(cfg.namespace, cfg.pod_name,
                              pod_annotations(result, code, time.time()))
    for line in skipped_lines(result):
        print(line)
    summary = summary_line(result, code)
    print(summary, file=sys.stdout if code == 0 else sys.stderr)
    _termination_message(summary)
    return code


def _open(cfg: node_config.AgentConfig) -> tuple[Store | None, str | None]:
    if not cfg.store_uri:
        return None, None
    try:
        from ckptdrain.store import open_store

        # A file:// store that does not exist is a wrong path, not an empty
        # store; a fresh start from it would hide the mistake. But only its root
        # is the user's: the webhook adds /<namespace>/<policy>, which the agent
        # makes on its first drain, after the first pod's restore has run.
        return open_store(cfg.store_uri, endpoint_url=cfg.s3_endpoint,
                          endpoint_field="CKPTDRAIN_S3_ENDPOINT", region=cfg.region,
                          options=cfg.s3_options, create=_policy_dir_of_a_root(cfg)), None
    except (InvalidInput, BucketMissing) as err:
        return None, f"{_MISCONFIGURED}{cfg.store_uri}: {err}"
    except (CkptdrainError, OSError) as err:
        return None, f"cannot open {cfg.store_uri}: {err}"


def _policy_dir_of_a_root(cfg: node_config.AgentConfig) -> bool:
    """True when the store is file:// and its path is an existing root plus this
    pod's /<namespace>/<policy> (what the webhook appends): that directory may be
    made; a missing root stays an error."""
    if not cfg.store_uri.startswith("file://") or cfg.policy.count("/") != 1:
        return False
    path = PurePosixPath(cfg.store_uri.removeprefix("file://").rstrip("/"))
    suffix = PurePosixPath(cfg.policy)
    return (len(path.parts) > len(suffix.parts) + 1
            and path.parts[-2:] == suffix.parts and Path(*path.parts[:-2]).is_dir())


#: How _open's problem starts when the configuration itself is wrong.
_MISCONFIGURED = "cannot open (invalid configuration) "


def restore_with_retries(
    cfg: node_config.AgentConfig,
    open_store: Any = None,
    *,
    clock: Any = time.monotonic,
    sleep: Any = time.sleep,
    rng: random.Random | None = None,
) -> tuple[RestoreResult, int]:
    """`restore`, tried again while the store does not answer (exit 3), until
    `cfg.restore_retry_deadline_s`. The result counts the tries; when they
    ran out, its reason says so."""
    opener = open_store or _open
    store: Store | None = None
    misconfigured = False
    started = clock()

    def attempt(n: int) -> tuple[RestoreResult, int]:
        nonlocal store, misconfigured
        problem = None
        if store is None:
            store, problem = opener(cfg)
            # A store that cannot even be opened (a bad URI or endpoint) is
            # configuration: no later try can succeed, so waiting only holds
            # the pod back.
            misconfigured = problem is not None and problem.startswith(_MISCONFIGURED)
        return restore(cfg, store, problem)

    def tell(n: int, value: tuple[RestoreResult, int], wait: float) -> None:
        log.warning("restore: try %d: %s; trying again in %.1fs (restore.retryDeadline %s)",
                    n, value[0].reason, wait, units.format_duration(cfg.restore_retry_deadline_s))

    done = retry.until_deadline(attempt, lambda value: (
                                    value[1] == OUTCOMES["store_unavailable"]
                                    and not misconfigured),
                                cfg.restore_retry_deadline_s, clock=clock, sleep=sleep,
                                rng=rng or random.Random(), on_retry=tell)
    result, code = done.value
    result.attempts = done.attempts
    result.seconds = clock() - started
    if done.gave_up and cfg.restore_retry_deadline_s > 0:
        result.reason += (f"; gave up after {done.attempts} tries in "
                          f"{units.format_duration(result.seconds)} (restore.retryDeadline "
                          f"{units.format_duration(cfg.restore_retry_deadline_s)})")
    return result, code


def _termination_message(text: str) -> None:
    """The kubelet shows this file as the container's last state message. Never
    created here: outside a pod (or with another terminationMessagePath) it is
    simply not there."""
    try:
        fd = os.open(TERMINATION_LOG, os.O_WRONLY | os.O_TRUNC)
    except OSError:
        return
    try:
        os.write(fd, text.encode()[:4096])  # the kubelet keeps at most 4096 bytes
    except OSError:
        pass
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ckptdrain restore", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
