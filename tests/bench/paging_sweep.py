#!/usr/bin/env python3
"""The paging policies on every committed trace, at 1.25x, 1.5x and 2x oversubscription.

Runs `zico-umctl page --json --policy all` for each trace and ratio (2 MiB
pages) and prints one markdown table per ratio: each policy's steady
iteration against the in-memory time, zico against the lower bound, plain UM
against zico, and whether zico is at least as fast as DeepUM and AutoSwap.
Then the targets, each marked met or missed: at every ratio zico the fastest
policy and within 1.5x of the bound. Simulated time: the figures do not
depend on the machine's load.

Usage: paging_sweep.py [--page-size SIZE] [--trace PATH]... [--only-given] [--check] ZICO_UMCTL

--trace adds a trace of your own (a model the committed traces do not
cover); --only-given sweeps those alone; --check exits 1 if a target is
missed.
"""
import argparse
import glob
import json
import os
import subprocess
import sys

TRACES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "traces")
RATIOS = (1.25, 1.5, 2.0)
# zico's target at every ratio: at most this many times the paging bound, and no policy faster.
BOUND_TARGET = 1.5
POLICIES = ("um", "deepum", "autoswap", "zico")


def page(umctl, trace, ratio, page_size):
    args = [umctl, "page", "--json", "--policy", "all", "--oversubscription", str(ratio), "--page-size", page_size,
            trace]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode == 2 and "the largest op uses at once" in done.stderr:
        return None  # no policy can run it: the budget is below one op's pages
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page-size", default="2MiB")
    parser.add_argument("--trace", action="append", default=[], help="a trace file to sweep too (repeatable)")
    parser.add_argument("--only-given", action="store_true", help="sweep the --trace files alone")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("umctl")
    args = parser.parse_args()
    for path in args.trace:
        if not os.path.isfile(path):
            parser.error(f"--trace '{path}': no such file")
    if args.only_given and not args.trace:
        parser.error("--only-given needs at least one --trace")
    committed = [] if args.only_given else sorted(glob.glob(os.path.join(TRACES, "*.ztrace.gz")))
    traces = committed + args.trace
    missed = []
    for ratio in RATIOS:
        print(f"\n### {ratio}x oversubscription ({args.page_size} pages)\n")
        print("| trace | in memory | bound | " + " | ".join(f"{p} ÷ in-mem" for p in POLICIES) +
              " | zico ÷ bound | um ÷ zico | zico vs best other |")
        print("|---|---:|---:|" + "---:|" * len(POLICIES) + "---:|---:|---|")
        for trace in traces:
            name = os.path.basename(trace).removesuffix(".ztrace.gz")
            r = page(args.umctl, trace, ratio, args.page_size)
            if r is None:
                print(f"| {name} | | | the budget holds fewer pages than its largest op uses |" + " |" * (len(POLICIES) + 2))
                continue
            z = r["zico"]
            mem = z["in_memory_iteration_s"]
            bound = z["lower_bound_iteration_s"]
            for p in POLICIES:
                if r[p]["peak_resident_bytes"] > r[p]["budget_bytes"]:
                    missed.append(f"{name} {ratio}x: {p} above the budget")
            best_other = min(r[p]["iteration_s"] for p in ("deepum", "autoswap"))
            vs = z["iteration_s"] / best_other
            cells = " | ".join(f"{r[p]['iteration_s'] / mem:.2f}" for p in POLICIES)
            print(f"| {name} | {mem * 1e3:.1f} ms | {bound * 1e3:.1f} ms | {cells} | {z['iteration_s'] / bound:.2f} | "
                  f"{r['um']['iteration_s'] / z['iteration_s']:.2f} | {'faster' if vs <= 1 else 'slower'} ({vs:.3f}) |")
            if z["iteration_s"] > BOUND_TARGET * bound:
                missed.append(f"{name} {ratio}x: zico {z['iteration_s'] / bound:.2f} x the bound (target {BOUND_TARGET})")
            if vs > 1 or r["um"]["iteration_s"] < z["iteration_s"]:
                missed.append(f"{name} {ratio}x: zico not the fastest policy ({vs:.3f} of the best of deepum and "
                              f"autoswap, {r['um']['iteration_s'] / z['iteration_s']:.2f} x faster than um)")
    print("\n### Targets\n")
    print("\n".join(f"- missed: {m}" for m in missed) if missed else "- all met")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
