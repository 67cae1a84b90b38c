#!/usr/bin/env python3
"""UM jobs under zico-umd against a static split of the same budget, live on SimDriver.

N copies of one trace replay their ops in UM mode (trace_job --ops, the modelled clock) at once under
a zico-umd holding BUDGET; in the same run each copy also runs alone with BUDGET / N (the static
split) and alone with BUDGET (one job at a time). Printed: each setting's mean steady iteration time
(the mean of the per-job `mean_iter_s`) and peak resident bytes, and the daemon's over the static
split's. The modelled clock counts a job's own kernels, faults and migrations: jobs side by side do
not slow each other's compute here, so this measures what sharing the budget costs in paging.

Usage: um_node_bench.py BIN_DIR TRACE [--budget 6GiB] [--jobs 2] [--iterations 30] [--repeats 3]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from trace_job_result import result_fields


def job(bin_dir, trace, iterations, env, budget=None):
    command = [os.path.join(bin_dir, "zico-run"), "--backend", "sim", "--mode", "um"]
    if budget is not None:
        command += ["--budget", str(budget)]
    command += ["--", os.path.join(bin_dir, "trace_job"), "--ops", "--trace", trace, "--iterations", str(iterations)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process):
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"a job failed (exit {process.returncode}):\n{err}")
    return result_fields(out, "um_node_bench")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    parser.add_argument("trace")
    parser.add_argument("--budget", default="6GiB")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    units = {"GiB": 1 << 30, "MiB": 1 << 20}
    budget = next((int(float(args.budget[:-3]) * v) for k, v in units.items() if args.budget.endswith(k)), None)
    if budget is None:
        raise SystemExit(f"--budget {args.budget!r}: expected a size in GiB or MiB, e.g. 6GiB")
    standalone = dict(os.environ, ZICO_SOCKET="off")
    rows = {"daemon": [], "static": [], "alone": []}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            socket = os.path.join(tmp, "umd.sock")
            daemon = subprocess.Popen([os.path.join(args.bin_dir, "zico-umd"), "--socket", socket, "--budget",
                                       str(budget)], env=dict(os.environ, ZICO_BACKEND="sim"),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                while not os.path.exists(socket):
                    time.sleep(0.02)
                under = dict(os.environ, ZICO_SOCKET=socket)
                jobs = [job(args.bin_dir, args.trace, args.iterations, under) for _ in range(args.jobs)]
                rows["daemon"] += [finish(p) for p in jobs]
            finally:
                daemon.terminate()
                daemon.wait()
        rows["static"] += [finish(job(args.bin_dir, args.trace, args.iterations, standalone, budget // args.jobs))
                           for _ in range(args.jobs)]
        rows["alone"].append(finish(job(args.bin_dir, args.trace, args.iterations, standalone, budget)))
    means = {}
    for name, results in rows.items():
        means[name] = statistics.mean(float(r["mean_iter_s"]) for r in results)
        peak = max(int(r["peak_resident_bytes"]) for r in results)
        spread = [round(float(r["mean_iter_s"]) * 1000, 1) for r in results]
        print(f"{name:7s} mean iteration {means[name] * 1000:7.1f} ms (each: {spread}) peak resident "
              f"{peak / (1 << 30):.2f} GiB")
    print(f"daemon / static split: {means['daemon'] / means['static']:.3f}x the iteration time "
          f"({args.jobs} jobs, {args.budget}, {os.path.basename(args.trace)})")


if __name__ == "__main__":
    sys.exit(main())
