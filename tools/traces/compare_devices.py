#!/usr/bin/env python3
"""Compare two traces of the same model and settings, typically meta mode against GPU (cuda) mode.

    python3 tools/traces/compare_devices.py [--tolerance FRACTION] META.ztrace.gz CUDA.ztrace.gz

For each trace and their difference: the peak of live bytes, the bytes of each category at the peak and
where the peak falls, the blocks allocated, the ops recorded, the bytes live at the end, and the op
names whose counts differ (a different kernel choice shows up there first). For a cuda trace, also
PyTorch's own peak of allocated bytes (`meta allocator_max_allocated`) beside the trace's peak with
every block rounded up to 512 bytes, as the caching allocator rounds it: the gap is what the trace does
not see (cuDNN and cuBLAS workspaces). tools/traces/README.md explains the differences to expect.

Exits 0 if the peaks differ by at most FRACTION of the first trace's peak (default 0.01) and the bytes
live at the end (parameters, gradients, optimizer state, whose sizes no kernel choice changes) are the
same; 1 if not; 2 on a usage error or if the traces are not of the same model and settings. Standard
library only; assumes valid traces (check them with check_trace.py first).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import shlex
import sys

CATEGORIES = ("param", "grad", "optim", "input", "act", "temp", "other")
ALLOCATOR_ROUNDING = 512   # the CUDA caching allocator's smallest block and rounding
SETTINGS = ("model", "batch", "iterations", "image_size", "seq_len")


def _round_up(n: int) -> int:
    return -(-n // ALLOCATOR_ROUNDING) * ALLOCATOR_ROUNDING


def attention_of(meta: dict[str, str]) -> str:
    """The --attention the trace was captured with, from its command line (default efficient)."""
    try:
        words = shlex.split(meta.get("command", ""))
    except ValueError:
        return "efficient"
    for i, word in enumerate(words):
        if word == "--attention" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--attention="):
            return word.split("=", 1)[1]
    return "efficient"


def trace_stats(path: str) -> dict:
    meta: dict[str, str] = {}
    live: dict[int, tuple[int, str]] = {}
    by_cat = dict.fromkeys(CATEGORIES, 0)
    total = peak = rounded = rounded_peak = 0
    at_peak = dict(by_cat)
    peak_iteration, peak_op, peak_op_name = -1, -1, "outside any op"
    iteration = -1
    blocks = 0
    ops: collections.Counter[str] = collections.Counter()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split(" ")
            kind = fields[0]
            if kind == "meta":
                meta[fields[1]] = line.rstrip("\n").split(" ", 2)[2] if len(fields) > 2 else ""
            elif kind == "i":
                iteration = int(fields[1])
            elif kind == "a":
                size, cat, op = int(fields[2]), fields[4], int(fields[5])
                live[int(fields[1])] = (size, cat)
                blocks += 1
                by_cat[cat] += size
                total += size
                rounded += _round_up(size)
                rounded_peak = max(rounded_peak, rounded)
                if total > peak:
                    peak, at_peak, peak_iteration, peak_op = total, dict(by_cat), iteration, op
                    peak_op_name = "outside any op" if op < 0 else "?"
            elif kind == "f":
                size, cat = live.pop(int(fields[1]))
                by_cat[cat] -= size
                total -= size
                rounded -= _round_up(size)
            elif kind == "o":
                ops[fields[4]] += 1
                if int(fields[1]) == peak_op:
                    peak_op_name = fields[4]
    return {"meta": meta, "peak": peak, "at_peak": at_peak, "peak_iteration": peak_iteration,
            "peak_op": peak_op, "peak_op_name": peak_op_name, "rounded_peak": rounded_peak,
            "blocks": blocks, "ops": ops, "end_live": total, "end_by_cat": by_cat}


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _signed(n: int) -> str:
    return f"{n:+d} B ({n / 2**20:+.2f} MiB)"


def compare(path_a: str, path_b: str, tolerance: float, out=sys.stdout) -> int:
    a, b = trace_stats(path_a), trace_stats(path_b)
    src_a, src_b = a["meta"].get("source", "?"), b["meta"].get("source", "?")
    mismatched = [(k, a["meta"].get(k), b["meta"].get(k)) for k in SETTINGS
                  if a["meta"].get(k) != b["meta"].get(k)]
    if attention_of(a["meta"]) != attention_of(b["meta"]):
        mismatched.append(("attention", attention_of(a["meta"]), attention_of(b["meta"])))
    if mismatched:
        for key, x, y in mismatched:
            print(f"not the same settings: {key} is {x} in {path_a} but {y} in {path_b}", file=out)
        return 2

    p = lambda *cells: print("  ".join(str(c).rjust(w) for c, w in zip(cells, (22, 26, 26, 30))),
                             file=out)
    settings = ", ".join(f"{k} {a['meta'][k]}" for k in SETTINGS if k in a["meta"])
    print(f"{path_a} ({src_a}) against {path_b} ({src_b}): {settings}, attention "
          f"{attention_of(a['meta'])}", file=out)
    p("", src_a, src_b, f"difference ({src_b} - {src_a})")
    p("peak live bytes", a["peak"], b["peak"], _signed(b["peak"] - a["peak"]))
    p("", _mib(a["peak"]), _mib(b["peak"]), "")
    for cat in CATEGORIES:
        x, y = a["at_peak"][cat], b["at_peak"][cat]
        if x or y:
            p(f"  {cat} at peak", x, y, _signed(y - x))
    for s in (a, b):
        s["where"] = (f"iteration {s['peak_iteration']}, op {s['peak_op']}" if s["peak_op"] >= 0
                      else f"iteration {s['peak_iteration']}, outside ops")
    p("peak at", a["where"], b["where"], "")
    p("  allocated by", a["peak_op_name"], b["peak_op_name"], "")
    p("blocks allocated", a["blocks"], b["blocks"], f"{b['blocks'] - a['blocks']:+d}")
    p("ops recorded", sum(a["ops"].values()), sum(b["ops"].values()),
      f"{sum(b['ops'].values()) - sum(a['ops'].values()):+d}")
    p("live at end", a["end_live"], b["end_live"], _signed(b["end_live"] - a["end_live"]))
    p("peak, 512 B rounding", a["rounded_peak"], b["rounded_peak"],
      _signed(b["rounded_peak"] - a["rounded_peak"]))

    differing = sorted(name for name in set(a["ops"]) | set(b["ops"]) if a["ops"][name] != b["ops"][name])
    if differing:
        print(f"ops whose counts differ ({src_a} -> {src_b}, all iterations):", file=out)
        for name in differing:
            print(f"  {name}: {a['ops'][name]} -> {b['ops'][name]}", file=out)
    else:
        print("every op name occurs as often in both traces", file=out)

    for s, path in ((a, path_a), (b, path_b)):
        allocated = s["meta"].get("allocator_max_allocated")
        if allocated is not None and allocated.isdigit():
            gap = int(allocated) - s["rounded_peak"]
            print(f"{path}: torch.cuda.max_memory_allocated {allocated} B ({_mib(int(allocated))}), "
                  f"{_signed(gap)} beyond the trace's rounded peak (workspaces and other memory the "
                  f"trace does not see; max_memory_reserved "
                  f"{s['meta'].get('allocator_max_reserved', '?')} B)", file=out)

    bad = 0
    diff = b["peak"] - a["peak"]
    allowed = tolerance * a["peak"]
    if abs(diff) <= allowed:
        print(f"peaks: {_signed(diff)}, {abs(diff) / max(a['peak'], 1):.4%} of the {src_a} peak, "
              f"within the tolerance of {tolerance:.4%}: OK", file=out)
    else:
        print(f"peaks: {_signed(diff)}, {abs(diff) / max(a['peak'], 1):.4%} of the {src_a} peak, "
              f"beyond the tolerance of {tolerance:.4%}: DIFFERENT", file=out)
        bad += 1
    if a["end_live"] == b["end_live"]:
        print("bytes live at the end (parameters, gradients, optimizer state): the same: OK", file=out)
    else:
        print(f"bytes live at the end: {_signed(b['end_live'] - a['end_live'])}: DIFFERENT "
              f"(parameter-shaped state should not depend on the device)", file=out)
        bad += 1
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Compare a meta-mode and a cuda-mode trace of the "
                                                 "same model and settings.")
    parser.add_argument("--tolerance", type=float, default=0.01,
                        help="largest allowed peak difference, as a fraction of the first trace's peak "
                             "(default 0.01)")
    parser.add_argument("first", help="the reference trace, usually meta mode")
    parser.add_argument("second", help="the trace to compare, usually cuda mode")
    args = parser.parse_args(argv)
    if not 0 <= args.tolerance < 1:
        parser.error("--tolerance must be a fraction in [0, 1)")
    try:
        return compare(args.first, args.second, args.tolerance)
    except (OSError, EOFError, UnicodeDecodeError, ValueError, KeyError, IndexError) as e:
        print(f"compare_devices.py: cannot read the traces ({type(e).__name__}: {e}); "
              f"check them with check_trace.py", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
