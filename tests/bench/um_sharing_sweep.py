#!/usr/bin/env python3
"""Unified Memory jobs against ordinary (VMM) jobs under zico, over the band.

Every pair and triple of the committed traces (repeats allowed) at summed
peaks / 1.3, 1.45 and 1.6 runs twice under `zico-umctl simulate --policy
all`, as VMM jobs and with --mode um, on the same budget and paging link.
Reported: zico's UM throughput over its VMM throughput (both against
unlimited), the runs where UM gains or loses more than 1 %, the runs where
some job's own peak is above the budget (every VMM policy fails a job
there; UM jobs page), and UM against the best simpler policy of the VMM
run. Simulated time: the figures do not depend on the machine's load.

Usage: um_sharing_sweep.py [--utilization U] [--iterations N] [--host-bandwidth R] [--jobs J] ZICO_UMCTL
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

TRACES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "traces")
BAND = (1.3, 1.45, 1.6)
SIMPLER = ("static", "sequential", "fcfs")


def simulate(umctl, args):
    done = subprocess.run([umctl, "simulate", "--json"] + args, capture_output=True, text=True)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        sys.exit(f"{umctl} simulate {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def completed(result):
    return result["failed_jobs"] == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--utilization", default="0.5")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--host-bandwidth", default="25GB/s")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulations at once")
    parser.add_argument("umctl")
    options = parser.parse_args()
    common = ["--iterations", str(options.iterations), "--utilization", options.utilization,
              "--host-bandwidth", options.host_bandwidth]
    names = sorted(f[: -len(".ztrace.gz")] for f in os.listdir(TRACES) if f.endswith(".ztrace.gz"))
    peaks = {n: simulate(options.umctl, ["--policy", "unlimited", "--iterations", "20",
                                         os.path.join(TRACES, f"{n}.ztrace.gz")])["jobs"][0]["peak_bytes"]
             for n in names}
    cases = [c for k in (2, 3) for c in itertools.combinations_with_replacement(names, k)]
    runs = [(c, r) for c in cases for r in BAND]

    def one(run):
        case, ratio = run
        traces = [os.path.join(TRACES, f"{n}.ztrace.gz") for n in case]
        budget = str(int(sum(peaks[n] for n in case) / ratio))
        args = ["--policy", "all", "--budget", budget] + common + traces
        return simulate(options.umctl, args), simulate(options.umctl, args + ["--mode", "um"])

    with ThreadPoolExecutor(max(options.jobs, 1)) as pool:
        results = list(pool.map(one, runs))

    ratios, gains, losses, rescued, exceeded = [], [], [], [], 0
    unfit = 0
    for (case, ratio), (vmm, um) in zip(runs, results):
        label = f"{'+'.join(case)} at summed peaks / {ratio}"
        z_vmm, z_um = vmm["zico"], um["zico"]
        exceeded += z_um["budget_exceeded"]
        if any(peaks[n] > int(sum(peaks[m] for m in case) / ratio) for n in case):
            unfit += 1
            if completed(z_um):
                rescued.append((label, z_um["vs_unlimited"]))
            continue
        if not completed(z_vmm) or not completed(z_um):
            losses.append((label, "a job failed", z_vmm["vs_unlimited"], z_um["vs_unlimited"]))
            continue
        r = z_um["aggregate_iters_per_s"] / z_vmm["aggregate_iters_per_s"]
        ratios.append(r)
        best = max(vmm[p]["aggregate_iters_per_s"] for p in SIMPLER)
        row = (label, r, z_vmm["vs_unlimited"], z_um["vs_unlimited"], z_um["aggregate_iters_per_s"] / best)
        if r > 1.01:
            gains.append(row)
        elif r < 0.99:
            losses.append(row)

    print(f"{len(runs)} runs, u = {options.utilization}, {options.iterations} iterations, "
          f"paging link {options.host_bandwidth}; budget exceeded in {exceeded}")
    print(f"where every job fits the budget ({len(ratios)} runs): zico UM / zico VMM "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}; gains > 1 % in {len(gains)}, losses > 1 % in "
          f"{sum(1 for row in losses if not isinstance(row[1], str))}")
    for title, rows in (("gains", gains), ("losses", losses)):
        for row in rows:
            if isinstance(row[1], str):
                print(f"  {title}: {row[0]}: {row[1]} (vmm {row[2]:.3f}, um {row[3]:.3f} x unlimited)")
            else:
                print(f"  {title}: {row[0]}: um/vmm {row[1]:.3f} (vmm {row[2]:.3f}, um {row[3]:.3f} x unlimited; "
                      f"um {row[4]:.3f} x the best simpler VMM policy)")
    print(f"where some job's peak is above the budget ({unfit} runs; every VMM policy fails a job): "
          f"UM completes {len(rescued)}" +
          (f", at {min(v for _, v in rescued):.3f}-{max(v for _, v in rescued):.3f} x unlimited" if rescued else ""))


if __name__ == "__main__":
    main()
