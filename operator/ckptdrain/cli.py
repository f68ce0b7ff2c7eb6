"""The one `ckptdrain` command: its parser, `size`, and the one exit path.

Built-in sub-commands (size here; push, pull, ls and verify in
transfer/command.py, gc in transfer/gc.py) import their heavy parts
(botocore, the engines) only when run, so `ckptdrain size` stays instant.
Other rooms plug in sub-commands through PLUGINS: a module with
`add_arguments(parser)` and `run(args) -> int`, imported only when its
sub-command is the one being run (a missing module just hides it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckptdrain import __version__, flags, units
from ckptdrain.errors import CkptdrainError, Interrupted, InvalidInput
from ckptdrain.transfer import gc
from ckptdrain.transfer.command import cmd_ls, cmd_pull, cmd_push, cmd_verify

if TYPE_CHECKING:
    from ckptdrain import sizing

PLUGINS: dict[str, tuple[str, str]] = {
    "agent": ("ckptdrain.agent.command", "run the node agent (sidecar): capture and drain"),
    "restore": ("ckptdrain.restore.command", "restore the newest good checkpoint (init container)"),
    "peer": ("ckptdrain.peer.command", "serve and accept partner copies (peer tier sidecar)"),
    "csi-node": ("ckptdrain.csi.command", "serve the node tier as CSI volumes (node driver)"),
    "demo": ("ckptdrain.demo.command", "the whole life of a checkpoint on this machine"),
    "operator": ("ckptdrain.operator.command", "run the Kubernetes operator"),
    "goodput": ("ckptdrain.operator.goodput.command",
                "each policy's runtime goodput and interruptions, read from the cluster"),
}

EXIT_CODES = """\
exit codes:
  0    success
  1    other error
  2    invalid input or usage (the message names the field)
  3    the store failed: unreachable, access denied, missing bucket, object
       or file:// directory
  4    integrity: bytes do not match their manifest (verify found problems)
  5    no complete checkpoint matches what was asked (or the --step is not there)
  6    conflict: push found the step already committed with other content
  130  interrupted (push resumes from its journal when run again)
"""


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


# -- size ---------------------------------------------------------------------

_SIZE_FLAGS: list[tuple[str, Callable[[str, object], Any], str]] = [
    ("--parameters", flags.parameters, "model parameters: 405B, 70M, 4.05e11"),
    ("--bytes-per-parameter", flags.bytes_per_parameter,
     "checkpoint bytes per parameter: 14 (default: bf16 + Adam), 2 (bf16 weights)"),
    ("--checkpoint-bytes", units.parse_bytes, "checkpoint size instead of parameters: 5.67TB"),
    ("--interval", flags.duration, "time between local checkpoints: 15m, 900s"),
    ("--mtti", flags.duration, "mean time to interruption: 150m (interval = MTTI/10)"),
    ("--overlap", units.parse_fraction, "drain time / global interval: 10%% (default)"),
    ("--global-every", units.parse_positive_int, "every N-th local checkpoint goes global"),
    ("--local-write-time", flags.duration, "time a checkpoint stalls training (C): 30s"),
    ("--restart-time", flags.duration, "interruption to training again: 10m"),
    ("--cap", flags.rate, "policy bandwidth cap: 10GB/s"),
    ("--cluster-cap", flags.rate, "cluster bandwidth cap: 40GB/s"),
    ("--drainers", units.parse_positive_int, "nodes that drain (the bandwidth is split)"),
    ("--node-loss-fraction", flags.share,
     "interruptions that lose the node and its local copies: 5%% (default)"),
]


def _sizing_input(args: argparse.Namespace) -> sizing.SizingInput:
    v = {flag: getattr(args, flag[2:].replace("-", "_")) for flag, _, _ in _SIZE_FLAGS}
    parsed = {flag: (None if v[flag] is None else parse(flag, v[flag]))
              for flag, parse, _ in _SIZE_FLAGS}
    kw: dict[str, Any] = {
        "parameters": parsed["--parameters"], "checkpoint_bytes": parsed["--checkpoint-bytes"],
        "interval_s": parsed["--interval"], "mtti_s": parsed["--mtti"],
        "local_write_s": parsed["--local-write-time"], "restart_s": parsed["--restart-time"],
        "policy_cap": parsed["--cap"], "cluster_cap": parsed["--cluster-cap"],
    }
    for flag, field in (("--bytes-per-parameter", "bytes_per_parameter"),
                        ("--overlap", "overlap"), ("--global-every", "global_every"),
                        ("--drainers", "drainers"),
                        ("--node-loss-fraction", "node_loss_fraction")):
        if parsed[flag] is not None:
            kw[field] = parsed[flag]
    if kw["parameters"] is None and kw["checkpoint_bytes"] is None:
        raise InvalidInput("--parameters", "a parameter count (or --checkpoint-bytes)", None)
    if kw["interval_s"] is None and kw["mtti_s"] is None:
        raise InvalidInput("--interval", "a duration such as 15m (or --mtti)", None)
    from ckptdrain import sizing

    return sizing.SizingInput(**kw, peer_tier=bool(args.peer_tier))


def _size_json(s: sizing.Sizing) -> dict[str, Any]:
    rename = {"required_bandwidth": "required_bandwidth_bytes_per_second",
              "allowed_bandwidth": "allowed_bandwidth_bytes_per_second",
              "per_drainer_bandwidth": "per_drainer_bandwidth_bytes_per_second"}
    out = {}
    for key, value in dataclasses.asdict(s).items():
        key = rename.get(key, key)
        out[key[:-2] + "_seconds" if key.endswith("_s") else key] = value
    return out


def _size_rows(s: sizing.Sizing) -> list[tuple[str, str]]:
    opt = lambda v, f: "-" if v is None else f(v)  # noqa: E731
    rows = [
        ("checkpoint size", units.format_bytes(s.checkpoint_bytes)),
        ("local interval", units.format_duration(s.local_interval_s)),
        ("global interval", units.format_duration(s.global_interval_s)),
        ("overlap target", units.format_percent(s.overlap)),
        ("required bandwidth", units.format_rate(s.required_bandwidth)),
        ("allowed bandwidth", units.format_rate(s.allowed_bandwidth)
         + (f"  (capped by the {s.binding_cap} cap)" if s.binding_cap else "")),
        ("effective overlap", units.format_percent(s.effective_overlap)),
        ("drain time", units.format_duration(s.drain_seconds)),
        ("per drainer", f"{units.format_rate(s.per_drainer_bandwidth)} × {s.drainers}"),
        ("recommended interval", opt(s.recommended_interval_s, units.format_duration)),
        ("Young–Daly interval", opt(s.young_daly_interval_s, units.format_duration)),
        ("work lost / restart", f"{units.format_duration(s.lost_work_node_intact_s)} with "
         f"every node intact (local step), {units.format_duration(s.lost_work_node_lost_s)} "
         f"with a node lost ({s.node_loss_restores_from} step; "
         f"{units.format_percent(s.node_loss_fraction)} of interruptions)"),
        ("expected goodput", opt(s.goodput, units.format_percent)),
    ]
    return rows


def cmd_size(args: argparse.Namespace) -> int:
    from ckptdrain import size_costs, sizing

    try:
        result = sizing.compute(_sizing_input(args))
    except InvalidInput as err:
        if err.field not in flags.SIZE_FIELD_FLAGS:
            raise
        raise InvalidInput(flags.SIZE_FIELD_FLAGS[err.field], err.expected, err.seen) from None
    costs = size_costs.compute(args, result, _sizing_input(args).mtti_s)
    if args.json:
        print(json.dumps({**_size_json(result), **size_costs.to_json(costs)}, indent=2))
    elif args.quiet:  # the one number a script wants
        print(units.format_rate(result.required_bandwidth))
    else:
        rows = _size_rows(result) + size_costs.rows(costs)
        width = max(len(k) for k, _ in rows)
        print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return 0


# -- the parser -----------------------------------------------------------------


def _common(p: argparse.ArgumentParser, *, store: bool = True,
            quiet: str = "no progress, no summary") -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help=quiet)
    if store:
        p.add_argument("--endpoint-url", help="S3-compatible endpoint (default: "
                       "$CKPTDRAIN_S3_ENDPOINT, $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, AWS)")


def build_parser(plugin: str | None = None, chosen: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `plugin`'s module (if any) is imported to add its flags.
    `size` gets its cost flags (size_costs.py, with the sizing and economics
    models it imports) only when it is `chosen` or nothing is: every restore
    runs this parser, and those imports cost it ~8 ms."""
    parser = argparse.ArgumentParser(
        prog="ckptdrain", description="Cheap, fast, survivable checkpoints for large training.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ckptdrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, epilog=EXIT_CODES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    p = command("size", "bandwidth a checkpoint policy needs (sizing model)")
    for flag, _, text in _SIZE_FLAGS:
        p.add_argument(flag, help=text)
    p.add_argument("--peer-tier", action="store_true",
                   help="the policy's peer tier is on: a node loss restores from the "
                        "partner's copy, not the global step")
    if chosen in (None, "size"):
        from ckptdrain import size_costs

        size_costs.add_flags(p)
    _common(p, store=False, quiet="print only the required bandwidth")
    p.set_defaults(func=cmd_size)

    p = command("push", "upload a checkpoint directory (resumable, rate-limited)")
    p.add_argument("src", metavar="SRC_DIR")
    p.add_argument("uri", metavar="URI", help="file:///path, s3://bucket/prefix or gs://bucket/prefix")
    p.add_argument("--step", help="step (default: the number ending SRC_DIR's name)")
    p.add_argument("--writer", default="0", help="this writer's id (default 0)")
    p.add_argument("--writers", default="1", help="writers in the checkpoint (default 1)")
    p.add_argument("--rate", help="bandwidth limit for everything sent: 50MB/s (default none)")
    p.add_argument("--part-size", default="64MiB",
                   help="multipart part size (default 64MiB; at least 1MiB, 5MiB on S3)")
    p.add_argument("--concurrency", default="8", help="parts in flight (default 8)")
    p.add_argument("--journal", help="resume journal (default: beside SRC_DIR, one per URI)")
    p.add_argument("--create", action="store_true",
                   help="create a file:// store directory that does not exist yet")
    p.add_argument("--replace", action="store_true",
                   help="replace the step's committed checkpoint if its content differs")
    _common(p)
    p.set_defaults(func=cmd_push)

    p = command("pull", "restore a checkpoint, verified, atomically")
    p.add_argument("uri", metavar="URI")
    p.add_argument("dest", metavar="DEST", help="missing or empty directory")
    p.add_argument("--step", help="a step number or 'latest' (default)")
    p.add_argument("--writer", help="only this writer's files, directly under DEST")
    p.add_argument("--concurrency", default=None,
                   help="ranged GETs in flight (default: 2 per usable CPU, 4 to 16)")
    p.add_argument("--part-size", help="range size (default: the upload's part size)")
    p.add_argument("--no-direct-io", dest="direct_io", action="store_false",
                   help="onto a disk, write through the page cache (default: direct I/O)")
    _common(p)
    p.set_defaults(func=cmd_pull)

    p = command("ls", "checkpoints in a store, complete or why not")
    p.add_argument("uri", metavar="URI")
    _common(p)
    p.set_defaults(func=cmd_ls)

    p = command("verify", "check a stored step or a directory against its manifest")
    p.add_argument("target", metavar="URI|DIR")
    p.add_argument("--step", help="step to verify (default: the newest complete)")
    p.add_argument("--all", action="store_true", help="for a URI: every complete step")
    p.add_argument("--manifest", help="for a DIR: the manifest JSON to check it against")
    p.add_argument("--against", metavar="URI", help="for a DIR: take the manifest from a store")
    p.add_argument("--writer", help="for --against: which writer's manifest (default: "
                   "each writer's under DIR/<writer>/, as a whole pull lays them out)")
    _common(p)
    p.set_defaults(func=cmd_verify)

    p = command("gc", "list (or --delete) what pushes and drains left behind in a store")
    gc.add_arguments(p)
    _common(p)
    p.set_defaults(func=gc.cmd_gc)

    for name, (module, text) in PLUGINS.items():
        if not _available(module):
            continue
        p = sub.add_parser(name, help=text)
        if name == plugin:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(func=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command; user errors become one line on stderr and an exit code."""
    argv = flags.attach_negative_values(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    try:
        args = build_parser(chosen if chosen in PLUGINS else None, chosen).parse_args(argv)
        return int(args.func(args) or 0)
    except CkptdrainError as err:
        print(f"ckptdrain: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("ckptdrain: interrupted", file=sys.stderr)
        return Interrupted.exit_code
    except BrokenPipeError:
        # The reader stopped reading (`ckptdrain ls | head -1`): it has what
        # it wanted. Nothing more is written, not even at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:  # a file we were pointed at: say which, no traceback
        where = f": {err.filename}" if err.filename else ""
        print(f"ckptdrain: error: {err.strerror or err}{where}", file=sys.stderr)
        return 1
