#!/usr/bin/env python3
"""The paging policies on every committed trace, at 1.25x, 1.5x and 2x oversubscription.

Runs `zico-umctl page --json --policy all` for each trace and ratio (2 MiB
pages) and prints one markdown table per ratio: each policy's steady
iteration against the in-memory time, zico against the lower bound, plain UM
against zico, and whether zico is at least as fast as DeepUM and AutoSwap.
Then the targets, each marked met or missed. Simulated time: the figures do
not depend on the machine's load.

Usage: paging_sweep.py [--page-size SIZE] ZICO_UMCTL
"""
import argparse
import glob
import json
import os
import subprocess
import sys

TRACES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "traces")
RATIOS = (1.25, 1.5, 2.0)
# zico's target per ratio, x the in-memory time (or within 10 % of the bound when the bound is above it).
TARGET = {1.25: 1.05, 1.5: 1.15, 2.0: 1.5}
POLICIES = ("um", "deepum", "autoswap", "zico")


def page(umctl, trace, ratio, page_size):
    args = [umctl, "page", "--json", "--policy", "all", "--oversubscription", str(ratio), "--page-size", page_size,
            trace]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page-size", default="2MiB")
    parser.add_argument("umctl")
    args = parser.parse_args()
    traces = sorted(glob.glob(os.path.join(TRACES, "*.ztrace.gz")))
    missed = []
    for ratio in RATIOS:
        print(f"\n### {ratio}x oversubscription ({args.page_size} pages)\n")
        print("| trace | in memory | bound | " + " | ".join(f"{p} ÷ in-mem" for p in POLICIES) +
              " | zico ÷ bound | um ÷ zico | zico vs best other |")
        print("|---|---:|---:|" + "---:|" * len(POLICIES) + "---:|---:|---|")
        for trace in traces:
            name = os.path.basename(trace).removesuffix(".ztrace.gz")
            r = page(args.umctl, trace, ratio, args.page_size)
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
            goal = TARGET[ratio]
            if z["iteration_s"] > goal * mem and z["iteration_s"] > 1.1 * bound:
                missed.append(f"{name} {ratio}x: zico {z['iteration_s'] / mem:.2f} x in memory (target {goal}), "
                              f"{z['iteration_s'] / bound:.2f} x the bound")
            if ratio == 2.0 and r["um"]["iteration_s"] < 3 * z["iteration_s"]:
                missed.append(f"{name} 2x: zico only {r['um']['iteration_s'] / z['iteration_s']:.2f} x faster than um")
            if ratio == 2.0 and vs > 1:
                missed.append(f"{name} 2x: zico slower than the best of deepum and autoswap ({vs:.3f})")
    print("\n### Targets\n")
    print("\n".join(f"- missed: {m}" for m in missed) if missed else "- all met")


if __name__ == "__main__":
    main()
