#!/usr/bin/env python3
"""UM mode's swapped pages against managed ones: the same job, the same budget, live on SimDriver.

    um_swap_speed.py BUILD_DIR [--traces bert_base,gpt2,vit_b_16] [--scale 1/16] [--iterations N]
                     [--calibration FILE] [--json] [--check]

Each trace (tools/traces/NAME.ztrace.gz, its memory scaled by --scale) runs as trace_job --ops under
zico-run --mode um with half its peak as the budget and the zico planner, once with
ZICO_UM_MEMORY=managed and once with swap, on the modelled clock. Printed per trace: the steady
(last) iteration of each and swap's over managed's. With --calibration (ZICO_GPU_CALIBRATION) the
simulated device also charges the host time the file gives: the driver's per migration call and
block for managed pages, and per chunk mapped and unmapped (chunk_map_ns, chunk_unmap_ns: the
calibration's P8) for swapped ones. --json prints a list, one object per trace: trace,
budget_bytes, managed_iter_s, swap_iter_s, swap_x_managed. --check exits 1 unless swap is no slower
than managed on every trace.
"""
import argparse
import json
import os
import subprocess
import sys

from trace_job_result import result_fields

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "..", "..", "tools", "traces")
PAGE = 2 << 20


def result(build, trace, scale, iterations, env, budget=None):
    command = [os.path.join(build, "bin", "zico-run"), "--backend", "sim", "--mode", "um"]
    if budget is not None:
        command += ["--budget", str(budget)]
    command += ["--", os.path.join(build, "bin", "trace_job"), "--ops", "--trace", trace, "--iterations",
                str(iterations), "--memory-scale", scale]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"um_swap_speed: {' '.join(command)} failed (exit {run.returncode}):\n{run.stderr}")
    return result_fields(run.stdout, f"um_swap_speed: {' '.join(command)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build")
    parser.add_argument("--traces", default="bert_base,gpt2,vit_b_16")
    parser.add_argument("--scale", default="1/16", help="the traces' memory scale (default 1/16)")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--calibration", help="a GPU calibration file (ZICO_GPU_CALIBRATION)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check", action="store_true", help="exit 1 unless swap is no slower than managed")
    args = parser.parse_args()
    if args.iterations < 2:
        raise SystemExit(f"um_swap_speed: --iterations {args.iterations}: at least 2 (the last one is measured)")
    if args.calibration is not None and not os.path.isfile(args.calibration):
        raise SystemExit(f"um_swap_speed: --calibration {args.calibration!r}: no such file")
    base = {key: value for key, value in os.environ.items() if not key.startswith("ZICO_")}
    base.update(ZICO_SOCKET="off", ZICO_PAGING_POLICY="zico")
    if args.calibration is not None:
        base["ZICO_GPU_CALIBRATION"] = os.path.abspath(args.calibration)
    rows = []
    for name in args.traces.split(","):
        trace = os.path.join(TRACES, f"{name}.ztrace.gz")
        if not os.path.isfile(trace):
            raise SystemExit(f"um_swap_speed: --traces names '{name}', which is not in tools/traces")
        peak = int(result(args.build, trace, args.scale, 2, base)["peak_allocated_bytes"])
        budget = peak // 2 // PAGE * PAGE
        times = {}
        for memory in ("managed", "swap"):
            fields = result(args.build, trace, args.scale, args.iterations, dict(base, ZICO_UM_MEMORY=memory), budget)
            times[memory] = float(fields["last_iter_s"])
        rows.append({"trace": name, "budget_bytes": budget, "managed_iter_s": times["managed"],
                     "swap_iter_s": times["swap"], "swap_x_managed": round(times["swap"] / times["managed"], 3)})
    if args.json:
        print(json.dumps(rows))
    else:
        where = f"calibration {args.calibration}" if args.calibration else "no calibration"
        print(f"half the peak as the budget, zico planner, memory scale {args.scale}, {where}, modelled clock")
        for r in rows:
            print(f"{r['trace']:12s} budget {r['budget_bytes'] / 2**20:7.0f} MiB  managed {r['managed_iter_s'] * 1e3:8.2f} ms"
                  f"  swap {r['swap_iter_s'] * 1e3:8.2f} ms  swap / managed {r['swap_x_managed']:.3f}x")
    slower = [r["trace"] for r in rows if r["swap_iter_s"] > r["managed_iter_s"]]
    for name in slower:
        print(f"FAIL: swapped pages were slower than managed ones on {name}", file=sys.stderr)
    return 1 if args.check and slower else 0


if __name__ == "__main__":
    sys.exit(main())
