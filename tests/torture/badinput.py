"""Bad CLI input: a table of wrong invocations checked against docs/cli.md.

The expected exit code of each row is looked up by *meaning* in the exit-code
table of docs/cli.md (parsed here), so the document and this test cannot drift:
renumber a code in the doc and the test follows; drop a meaning and the test
fails. Invariants: that exit code, one line on stderr (argparse's usage lines
aside) naming the field when a field is at fault, never a traceback.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.torture.core import ROOT, Category, clean_env, make_tree, output_problems, run_cli
from tests.torture.kills import push_args
from tests.torture.ops import Ctx
from tests.torture.stores import StoreKind

#: Words that identify each row of the table in docs/cli.md.
MEANINGS = {
    "usage": "invalid input",
    "other": "other error",
    "store": "store failed",
    "integrity": "integrity",
    "none": "no complete checkpoint",
    "conflict": "conflict",
}


def doc_exit_codes(path: Path = ROOT / "docs" / "cli.md") -> dict[str, int]:
    """{meaning key: code} from the `## Exit codes` table of docs/cli.md."""
    text = path.read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    codes = {}
    for code, meaning in re.findall(r"^\|\s*(\d+)\s*\|\s*(.+?)\s*\|\s*$", section, re.M):
        for key, words in MEANINGS.items():
            if words in meaning.lower():
                codes.setdefault(key, int(code))
    return codes


def table(tmp: Path, full: str, empty: str, broken: str) -> list[tuple[list[str], str, str]]:
    """(argv, meaning keys ('a|b': either), field the message must name or '') per bad input."""
    src = str(tmp / "src" / "step-5")
    dests = iter(range(1000))

    def dest_() -> str:
        return str(tmp / f"dest-{next(dests)}")
    notempty = str(tmp / "src")
    return [
        (["push", src, full, "--part-size", "0"], "usage", "--part-size"),
        (["push", src, full, "--part-size", "-1MiB"], "usage", "--part-size"),
        (["push", src, full, "--part-size", "lots"], "usage", "--part-size"),
        (["push", src, full, "--writer", "100000", "--writers", "2"], "usage", "--writer"),
        (["push", src, full, "--writer", "-1"], "usage", "--writer"),
        (["push", src, full, "--writer", "3", "--writers", "2"], "usage", "--writer"),
        (["push", src, full, "--writers", "0"], "usage", "--writers"),
        (["push", src, full, "--step", "-1"], "usage", "--step"),
        (["push", src, full, "--step", "x"], "usage", "--step"),
        (["push", src, full, "--rate", "-5MB/s"], "usage", "--rate"),
        (["push", src, full, "--rate", "fast"], "usage", "--rate"),
        (["push", src, full, "--concurrency", "0"], "usage", "--concurrency"),
        (["push", src, "ftp://host/x"], "usage", "uri"),
        (["push", src, "file://relative/x"], "usage", "uri"),
        (["push", src, "s3://"], "usage", "uri"),
        (["push", src, "s3://Bad_Bucket"], "usage", "uri"),
        (["push", src, "s3://bucket-x/p", "--endpoint-url", "notaurl"], "usage", "endpoint"),
        (["push", str(tmp / "missing" / "step-1"), full], "other|usage", ""),
        (["pull", full, dest_(), "--step", "abc"], "usage", "--step"),
        (["pull", full, dest_(), "--step", "-1"], "usage", "--step"),
        (["pull", full, dest_(), "--concurrency", "0"], "usage", "--concurrency"),
        (["pull", full, dest_(), "--part-size", "0"], "usage", "--part-size"),
        (["pull", full, notempty], "usage", "DEST"),
        # docs/cli.md: pull --step of a step that is not complete is exit 4; one that
        # does not exist at all is also "no complete checkpoint matches" (5).
        (["pull", full, dest_(), "--step", "99"], "none|integrity", ""),
        (["pull", empty, dest_()], "none", ""),
        (["pull", broken, dest_(), "--step", "5"], "integrity", ""),
        (["ls", "s3://bucket-x", "--endpoint-url", "notaurl"], "usage", "endpoint"),
        (["ls", "s3://bucket-x", "--endpoint-url", "http://127.0.0.1:1"], "store", ""),
        (["verify", empty], "none", ""),
        (["verify", full, "--step", "99"], "none|integrity", ""),
        (["verify", src, "--against", empty], "none", ""),
        (["verify", src, "--against", full, "--writer", "7"], "usage|none", ""),
        (["verify", src, "--against", full, "--writer", "-1"], "usage", "--writer"),
        (["verify", src], "usage", "--manifest"),
        (["verify", src, "--manifest", str(tmp / "nothere.json")], "other|usage", ""),
        (["size", "--parameters", "1e308", "--interval", "15m"], "usage", "--parameters"),
        (["size", "--parameters", "abc", "--interval", "15m"], "usage", "--parameters"),
        (["size", "--parameters", "405B", "--interval", "0"], "usage", "--interval"),
        (["size", "--parameters", "405B", "--interval", "15m", "--overlap", "200%"],
         "usage", "--overlap"),
        (["size", "--interval", "15m"], "usage", "--parameters"),
        (["size", "--parameters", "nan", "--interval", "15m"], "usage", "--parameters"),
        (["nosuchcommand"], "usage", ""),
        ([], "usage", ""),
    ]


def run(ctx: Ctx, kind: StoreKind, cat: Category) -> None:
    codes = doc_exit_codes()
    for key, words in MEANINGS.items():
        cat.check(key in codes, f"docs/cli.md's exit-code table has no row for '{words}'")
    tmp = ctx.scratch / "badinput"
    src = tmp / "src" / "step-5"
    make_tree(src, ctx.opts.rng, 64 * 1024, files=3)
    full, empty, broken = (f"file://{tmp / name}" for name in ("full", "empty", "broken"))
    (tmp / "empty").mkdir(parents=True, exist_ok=True)
    for uri in (full, broken):
        pushed = run_cli(push_args(src, uri), clean_env())
        cat.check(pushed.rc == 0, f"setup push failed: {pushed.brief()}")
    data = sorted((tmp / "broken" / "data").rglob("*.bin"))
    if data:
        data[0].unlink()  # a committed step with a data object missing
    for argv, meaning, field in table(tmp, full, empty, broken):
        want = {codes[m] for m in meaning.split("|") if m in codes}
        if not want:
            continue
        got = ctx.cli(None, *argv, timeout=60)
        problems = output_problems(got, want)
        if field and got.rc in want and field.lower() not in got.err.lower():
            problems.append(f"the message does not name {field}")
        meant = " or ".join(MEANINGS[m] for m in meaning.split("|"))
        shown = " ".join(argv[:1] + argv[2:] if len(argv) > 2 else argv)
        cat.check(not problems, f"{shown} ({meant}): {'; '.join(problems)}: {got.brief()}")
