#!/usr/bin/env python3
"""Check zicoum memory traces against docs/trace-format.md, independently of the C++ reader.

    python3 tools/traces/check_trace.py tools/traces/*.ztrace.gz

Prints `FILE: ok (...)` or `FILE:LINE: problem` for the first problem in each file; exits 1 if any file
is bad. Standard library only. Beyond the format's rules it checks two conventions of capture.py: the
`a` records of an op's outputs come immediately before its `o` record, which names them among its
writes; and `meta iterations` matches the number of `i` records.
"""

from __future__ import annotations

import gzip
import re
import sys
import zlib

REQUIRED_META = ("model", "command", "source", "batch", "iterations", "timing")
CATEGORIES = {"param", "grad", "optim", "act", "temp", "input", "other"}
FIELDS = {"i": 3, "a": 6, "f": 3, "o": 7, "end": 2}
UINT = re.compile(r"[0-9]+\Z")
META_KEY = re.compile(r"[a-z_]+\Z")


class TraceError(Exception):
    def __init__(self, line: int, problem: str):
        super().__init__(f"{line}: {problem}")
        self.line = line


def uint(text: str, line: int, what: str, allow_minus_one: bool = False) -> int:
    if allow_minus_one and text == "-1":
        return -1
    if not UINT.match(text):
        raise TraceError(line, f"malformed integer {text!r} for {what}")
    return int(text)


def id_list(text: str, line: int, what: str) -> list[int]:
    if text == "-":
        return []
    return [uint(part, line, what) for part in text.split(",")]


def read_lines(path: str):
    """Yields (line number, text); raises TraceError for gzip, UTF-8 or line-ending problems."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise TraceError(0, f"corrupt or truncated gzip stream: {e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(0, f"not UTF-8: {e}") from None
    if not text.endswith("\n"):
        raise TraceError(text.count("\n") + 1, "last line does not end with a newline")
    for n, line in enumerate(text[:-1].split("\n"), start=1):
        yield n, line


def check(path: str) -> dict:
    live: dict[int, int] = {}       # id -> bytes
    ever: set[int] = set()
    meta: dict[str, str] = {}
    events = 0
    ops = 0
    iterations = 0
    last_time = 0
    seen_event = False
    ended = False
    pending: list[tuple[int, int]] = []   # (line, id) of `a` records waiting for their op
    peak = 0
    in_use = 0
    last_line = 0
    for n, line in read_lines(path):
        last_line = n
        if n == 1:
            if not line.startswith("zicoum-trace "):
                raise TraceError(n, "missing magic line 'zicoum-trace 1'")
            if line != "zicoum-trace 1":
                raise TraceError(n, f"unknown version in {line!r}")
            continue
        if ended:
            raise TraceError(n, "content after the end line")
        if line.startswith("meta "):
            if seen_event:
                raise TraceError(n, "meta after the first event")
            parts = line.split(" ", 2)
            if len(parts) < 3 or parts[2] == "":
                raise TraceError(n, "meta line without a value")
            if not META_KEY.match(parts[1]):
                raise TraceError(n, f"bad meta key {parts[1]!r}")
            meta[parts[1]] = parts[2]
            continue
        fields = line.split(" ")
        kind = fields[0]
        if kind not in FIELDS:
            raise TraceError(n, f"unknown record type {kind!r}")
        if len(fields) != FIELDS[kind] or "" in fields:
            raise TraceError(n, f"'{kind}' record needs {FIELDS[kind]} fields separated by one space")
        if pending and kind != "a" and kind != "o":
            raise TraceError(pending[0][0], f"block {pending[0][1]} allocated for an op that does not follow")

        if kind == "end":
            count = uint(fields[1], n, "count")
            if count != events:
                raise TraceError(n, f"end count {count} but {events} i/a/f/o records")
            if pending:
                raise TraceError(pending[0][0], "allocation for an op that never ran")
            ended = True
            continue

        if not seen_event:
            missing = [k for k in REQUIRED_META if k not in meta]
            if missing:
                raise TraceError(n, f"missing required meta key(s): {', '.join(missing)}")
            seen_event = True
        events += 1
        t = uint(fields[3] if kind == "a" else fields[2], n, "time")
        if t < last_time:
            raise TraceError(n, f"time goes backwards ({t} < {last_time})")
        last_time = t

        if kind == "i":
            it = uint(fields[1], n, "iteration")
            if it != iterations:
                raise TraceError(n, f"iteration {it} out of sequence (expected {iterations})")
            iterations += 1
        elif kind == "a":
            bid = uint(fields[1], n, "id")
            size = uint(fields[2], n, "size")
            if size == 0:
                raise TraceError(n, "size of zero")
            if fields[4] not in CATEGORIES:
                raise TraceError(n, f"unknown category {fields[4]!r}")
            op = uint(fields[5], n, "op index", allow_minus_one=True)
            if op != -1 and op != ops:
                raise TraceError(n, f"OP {op} is neither -1 nor the next op index {ops}")
            if bid in ever:
                raise TraceError(n, f"id {bid} allocated twice")
            if op == -1 and pending:
                raise TraceError(n, "an allocation outside any op between an op's outputs and its o record")
            ever.add(bid)
            live[bid] = size
            in_use += size
            peak = max(peak, in_use)
            if op != -1:
                pending.append((n, bid))
        elif kind == "f":
            bid = uint(fields[1], n, "id")
            if bid not in live:
                raise TraceError(n, f"free of id {bid}, which is not live")
            in_use -= live.pop(bid)
        else:  # o
            k = uint(fields[1], n, "op index")
            if k != ops:
                raise TraceError(n, f"op index {k} out of sequence (expected {ops})")
            uint(fields[3], n, "duration")
            if not fields[4] or "," in fields[4]:
                raise TraceError(n, f"bad op name {fields[4]!r}")
            reads = id_list(fields[5], n, "read id")
            writes = id_list(fields[6], n, "write id")
            for bid in reads + writes:
                if bid not in live:
                    raise TraceError(n, f"op reads or writes id {bid}, which is not live")
            for line_no, bid in pending:
                if bid not in writes:
                    raise TraceError(line_no, f"block {bid} allocated for op {k} but not among its writes")
            pending.clear()
            ops += 1
    if not ended:
        raise TraceError(last_line, "missing end line (truncated file)")
    if str(iterations) != meta.get("iterations"):
        raise TraceError(last_line, f"meta iterations is {meta.get('iterations')} but the trace has "
                                    f"{iterations} iteration records")
    return {"records": events, "ops": ops, "blocks": len(ever), "iterations": iterations,
            "peak": peak, "end_time": last_time}


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: check_trace.py TRACE.ztrace.gz...", file=sys.stderr)
        return 2
    bad = 0
    for path in paths:
        try:
            s = check(path)
        except TraceError as e:
            print(f"{path}:{e}")
            bad += 1
            continue
        print(f"{path}: ok ({s['records']} records, {s['ops']} ops, {s['blocks']} blocks, "
              f"{s['iterations']} iterations, peak {s['peak'] / 2**30:.2f} GiB, "
              f"{s['end_time'] / 1e6:.1f} ms)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
