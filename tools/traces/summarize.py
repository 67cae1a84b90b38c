#!/usr/bin/env python3
"""Summarise zicoum memory traces: peak live bytes and what was live at the peak.

    python3 tools/traces/summarize.py [--markdown] tools/traces/*.ztrace.gz

For each trace: records, ops, estimated GPU time per iteration (mean over iterations after the first,
which also creates the optimizer state), the peak of live bytes (the sum of the sizes of allocated,
not yet freed blocks, with no allocator rounding) and, at that peak, the persistent part (param + grad
+ optim) against the transient part (act + temp + input + other), then the largest each part gets at
any time (the persistent part peaks after backward, when the gradients exist; the transient part at
the start of backward) and the bytes of each category at the peak. Standard library only; assumes
the trace is valid (check it with check_trace.py first).
"""

from __future__ import annotations

import gzip
import sys

CATEGORIES = ("param", "grad", "optim", "input", "act", "temp", "other")
PERSISTENT = ("param", "grad", "optim")


def summarize(path: str) -> dict:
    meta: dict[str, str] = {}
    live: dict[int, tuple[int, str]] = {}
    by_cat = dict.fromkeys(CATEGORIES, 0)
    total = peak = max_persistent = max_transient = 0
    at_peak = dict(by_cat)
    iteration_starts: list[int] = []
    records = ops = 0
    end_time = 0
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split(" ")
            kind = fields[0]
            if kind == "meta":
                meta[fields[1]] = line.rstrip("\n").split(" ", 2)[2]
                continue
            if kind not in ("i", "a", "f", "o"):
                continue
            records += 1
            if kind == "i":
                iteration_starts.append(int(fields[2]))
            elif kind == "a":
                size, cat = int(fields[2]), fields[4]
                live[int(fields[1])] = (size, cat)
                by_cat[cat] += size
                total += size
                if total > peak:
                    peak, at_peak = total, dict(by_cat)
                persistent = sum(by_cat[c] for c in PERSISTENT)
                max_persistent = max(max_persistent, persistent)
                max_transient = max(max_transient, total - persistent)
            elif kind == "f":
                size, cat = live.pop(int(fields[1]))
                by_cat[cat] -= size
                total -= size
            else:
                ops += 1
                end_time = int(fields[2]) + int(fields[3])
    steady = [b - a for a, b in zip(iteration_starts[1:], iteration_starts[2:] + [end_time])]
    return {
        "meta": meta, "records": records, "ops": ops, "peak": peak, "at_peak": at_peak,
        "persistent": sum(at_peak[c] for c in PERSISTENT),
        "transient": sum(at_peak[c] for c in CATEGORIES if c not in PERSISTENT),
        "max_persistent": max_persistent, "max_transient": max_transient,
        "iteration_ms": (sum(steady) / len(steady) / 1e6) if steady else end_time / 1e6,
    }


def gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def main(argv: list[str]) -> int:
    markdown = "--markdown" in argv
    paths = [a for a in argv if a != "--markdown"]
    if not paths:
        print("usage: summarize.py [--markdown] TRACE.ztrace.gz...", file=sys.stderr)
        return 2
    head = ["trace", "records", "ops", "ms/iter", "peak GiB", "persistent at peak",
            "transient at peak", "max persistent", "max transient"]
    head += [f"{c} at peak" for c in CATEGORIES]
    rows = []
    for path in paths:
        s = summarize(path)
        rows.append([s["meta"].get("model", path), str(s["records"]), str(s["ops"]),
                     f"{s['iteration_ms']:.1f}", gib(s["peak"]), gib(s["persistent"]),
                     gib(s["transient"]), gib(s["max_persistent"]), gib(s["max_transient"])]
                    + [gib(s["at_peak"][c]) for c in CATEGORIES])
    print("sizes in GiB" + ("\n" if markdown else ""))
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
        for row in [head] + rows:
            print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
