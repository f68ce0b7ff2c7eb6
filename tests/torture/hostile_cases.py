"""Hostile manifests: the known cases, and a hypothesis strategy mutating a real one.

Every payload replaces the newest step's manifest (written by a real `push`).
`escape` is a directory outside every destination; paths aimed at it must never
produce a file there.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

Doc = dict[str, Any]


def dump(doc: Any, ascii_only: bool = True) -> bytes:
    text = json.dumps(doc, ensure_ascii=ascii_only, allow_nan=True)
    return text.encode("utf-8", "surrogatepass")


def hostile_texts(escape: str) -> list[str]:
    return [
        "../escaped.bin", "../../escaped.bin", "a/../../escaped.bin", f"{escape}/abs.bin",
        "/etc/passwd", "..", ".", "", "a//b", "a/./b", "a\\..\\..\\escaped.bin", "\x00",
        "a\x00b", "\ud800x", "x\udfff", "a" * 300, "d/" + "b" * 300, "~/escaped.bin",
        "link -> /etc/passwd", ".ckptdrain-tmp-x", "\u202eevil", "CON", "step-2",
        "0123456789abcdef", "ZZZZZZZZZZZZZZZZ", "../" * 40 + "escaped.bin",
    ]


def _files(doc: Doc) -> list[Doc]:
    files = doc.get("files")
    return [f for f in files if isinstance(f, dict)] if isinstance(files, list) else []


def _with(doc: Doc, **changes: Any) -> Doc:
    new = copy.deepcopy(doc)
    new.update(changes)
    return new


def _file_change(doc: Doc, **changes: Any) -> Doc:
    """`doc` with the largest file entry changed (keys with None removed)."""
    new = copy.deepcopy(doc)
    entry = max(_files(new), key=lambda f: f.get("size", 0))
    for key, value in changes.items():
        entry[key] = value
    return new


def _splice(doc: Doc, key: str, raw: bytes) -> bytes:
    """`doc` serialized with the value of `key` replaced by raw JSON text."""
    return dump(_with(doc, **{key: "@@splice@@"})).replace(b'"@@splice@@"', raw, 1)


def _all_part_sizes(doc: Doc, value: int) -> Doc:
    new = _with(doc, part_size=value)
    for entry in _files(new):
        for key in list(entry):
            if "part" in key:
                entry[key] = value
    return new


#: Classes of known cases: the manifest itself is invalid (`ls` must show the step
#: incomplete); it names data that does not exist (restore must fall back; `ls`,
#: which reads manifests only, may not see it); or it may be tolerated (restore
#: step 1, or step 2's true bytes).
INVALID, UNBACKED, TOLERATED = "invalid", "unbacked", "tolerated"


def known_cases(doc: Doc, escape: str) -> list[tuple[str, bytes, str]]:
    """(name, payload, class) of every case a probe found or a reviewer named."""
    nested = "[" * 100_000 + "]" * 100_000
    big = max(_files(doc), key=lambda f: f.get("size", 0))
    cases: list[tuple[str, bytes]] = [
        ("deeply nested JSON", nested.encode()),
        ("deeply nested extra", _splice(doc, "extra", nested.encode())),
        ("deeply nested file list", _splice(doc, "files", nested.encode())),
        ("deeply nested file entry", _splice(doc, "files", b"[" + nested.encode() + b"]")),
        ("lone surrogate in a path", dump(_file_change(doc, path="shard-\ud800.bin"))),
        ("lone surrogate, raw bytes", dump(_file_change(doc, path="s\udfff"), False)),
        ("size 2^70", dump(_file_change(doc, size=2**70))),
        ("size 1 PB", dump(_file_change(doc, size=10**15))),
        ("size -1", dump(_file_change(doc, size=-1))),
        ("size 5000 digits", dump(doc).replace(f'"size": {big["size"]}'.encode(),
                                               b'"size": ' + b"9" * 5000, 1)),
        ("size 1e999", dump(doc).replace(f'"size": {big["size"]}'.encode(),
                                         b'"size": 1e999', 1)),
        ("300-byte name component", dump(_file_change(doc, path="a" * 300))),
        ("300-byte nested component", dump(_file_change(doc, path="d/" + "b" * 300))),
        ("part size 1, huge size", dump(_file_change(_all_part_sizes(doc, 1), size=2**40))),
        ("part size 1", dump(_all_part_sizes(doc, 1))),
        ("part size 0", dump(_all_part_sizes(doc, 0))),
        ("absolute path", dump(_file_change(doc, path=f"{escape}/abs.bin"))),
        ("dot-dot path", dump(_file_change(doc, path="../escaped.bin"))),
        ("dot-dot deep", dump(_file_change(doc, path="../" * 40 + "escaped.bin"))),
        ("dot-dot inside", dump(_file_change(doc, path="a/../../escaped.bin"))),
        ("backslash dot-dot", dump(_file_change(doc, path="..\\..\\escaped.bin"))),
        ("symlink-looking name", dump(_file_change(doc, path="link -> /etc/passwd"))),
        ("home path", dump(_file_change(doc, path="~/escaped.bin"))),
        ("NUL in a path", dump(_file_change(doc, path="a\x00b"))),
        ("reserved name", dump(_file_change(doc, path=".ckptdrain-tmp-x"))),
        ("duplicate paths", dump(_with(doc, files=_files(doc) + _files(doc)[:1]))),
        ("file and directory clash", dump(_with(doc, files=[
            {**big, "path": "a"}, {**big, "path": "a/b"}]))),
        ("not JSON", b"\xff\xfe\x00garbage"),
        ("empty", b""),
        ("null", b"null"),
        ("a list", b"[]"),
        ("BOM", b"\xef\xbb\xbf" + dump(_with(doc, format="x"))),
        ("NaN created", dump(_with(doc, created=float("nan")))),
        ("step as text", dump(_with(doc, step=str(doc.get("step"))))),
        ("step mismatch", dump(_with(doc, step=int(doc.get("step", 0)) + 1))),
        ("writer -1", dump(_with(doc, writer=-1))),
        ("writers 0", dump(_with(doc, writers=0))),
        ("writers 1e9", dump(_with(doc, writers=10**9))),
        ("format 99", dump(_with(doc, format=99))),
        ("files not a list", dump(_with(doc, files={"a": 1}))),
        ("crc not hex", dump(_file_change(doc, crc32c="zzzzzzzz"))),
        ("attempt escapes", dump(_with(doc, attempt="../../escaped"))),
        ("attempt upper-case", dump(_with(doc, attempt="ABCDEF0123456789"))),
        ("attempt a number", dump(_with(doc, attempt=5))),
        ("format 2 without attempt", dump({k: v for k, v in _with(doc, format=2).items()
                                           if k != "attempt"})),
    ]
    # A 1 PB or 1 TiB file is absurd today but not malformed: a parser may accept the
    # manifest and leave the mismatch with the data to pull and restore.
    unbacked = {"symlink-looking name", "home path", "reserved name", "size 1 PB",
                "part size 1, huge size"}
    tolerated = {"part size 1"}
    if "attempt" not in doc:  # format 1: no attempt to validate
        tolerated |= {"attempt escapes", "attempt upper-case", "attempt a number"}
    return [(name, payload, TOLERATED if name in tolerated else UNBACKED if name in unbacked
             else INVALID) for name, payload in cases]


def _slots(doc: Any, path: tuple[Any, ...] = (), depth: int = 0) -> list[tuple[Any, ...]]:
    """Every place in `doc` (dict keys, list items) down to depth 3."""
    found = [path] if path else []
    if depth >= 3:
        return found
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _slots(value, (*path, key), depth + 1)
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:8]):
            found += _slots(value, (*path, i), depth + 1)
    return found


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> None:
    for step in path[:-1]:
        doc = doc[step]
    if delete:
        del doc[path[-1]]
    else:
        doc[path[-1]] = value


def values(escape: str) -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**80), 2**80),
        st.sampled_from([2**70, 10**15, 2**63, 2**64, -1, 0, 1, 1 << 20]),
        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
        st.sampled_from(hostile_texts(escape)),
    )
    return st.recursive(leaf, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                        max_leaves=12)


@st.composite
def mutated(draw: st.DrawFn, doc: Doc, escape: str) -> tuple[str, bytes]:
    """A real manifest changed in one to three hostile ways: (what, payload)."""
    new: Any = copy.deepcopy(doc)
    what = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["replace", "replace", "delete", "add-file", "bytes"]))
        slots = _slots(new) if isinstance(new, dict | list) else []
        if kind == "replace" and slots:
            slot = draw(st.sampled_from(slots))
            _set(new, slot, draw(values(escape)))
            what.append(f"replace {'.'.join(map(str, slot))}")
        elif kind == "delete" and slots:
            slot = draw(st.sampled_from(slots))
            _set(new, slot, None, delete=True)
            what.append(f"delete {'.'.join(map(str, slot))}")
        elif kind == "add-file" and isinstance(new, dict) and isinstance(new.get("files"), list):
            entry = {"path": draw(st.sampled_from(hostile_texts(escape)) | st.text(max_size=20)),
                     "size": draw(st.integers(0, 2**70)), "crc32c": "00000000"}
            new["files"].append(entry)
            what.append(f"add file {entry['path']!r:.60}")
    payload = dump(new, draw(st.booleans()))
    if draw(st.integers(0, 4)) == 0 and payload:
        at = draw(st.integers(0, len(payload) - 1))
        op = draw(st.sampled_from(["truncate", "flip", "insert"]))
        if op == "truncate":
            payload = payload[:at]
        elif op == "flip":
            payload = payload[:at] + bytes([payload[at] ^ draw(st.integers(1, 255))]) \
                + payload[at + 1:]
        else:
            payload = payload[:at] + draw(st.binary(min_size=1, max_size=8)) + payload[at:]
        what.append(f"bytes {op} at {at}")
    return ", ".join(what) or "unchanged", payload
