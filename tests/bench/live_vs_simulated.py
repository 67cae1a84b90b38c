#!/usr/bin/env python3
"""The live node manager against its simulator, on the same jobs, budgets and iterations.

For each mix (pairs and triples of committed traces, the budget the jobs' summed peaks divided by 1.3
to 1.6), runs zico-demo (zico-umd and the jobs as processes on the simulated backend, trace_job
replaying each trace in scaled real time: the live path) and `zico-umctl simulate --policy zico` (the
daemon's own ledger and time-shift scheduler in virtual time), and prints their aggregate throughput
(model iterations per second) and yields side by side. The demo's simulated kernels are sleeps that
share no compute, so the simulator runs at the same assumption: --utilization 0.01, every job launched
together, as zico-umd runs what it is given.

  python3 tests/bench/live_vs_simulated.py BUILD_DIR [--json] [--iterations N] [--mixes K]

--json prints a list, one object per run: mix, budget_bytes, iterations, live_iters_per_s,
simulated_iters_per_s, live_over_simulated, live_yields, simulated_yields, static_iters_per_s (the
demo's static partitioning, live), simulated_static_iters_per_s and live_static_over_simulated (the
same partitioning in the simulator: what live loses there is its own path's cost, not a decision). Wall-clock: run it on an otherwise idle machine.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = os.path.join(ROOT, "tools", "traces")

# (traces, summed peaks / budget)
MIXES = [
    (["bert_base", "gpt2"], 1.3),
    (["bert_base", "vit_b_16"], 1.5),
    (["gpt2", "vit_b_16"], 1.3),
    (["bert_base", "gpt2", "vit_b_16"], 1.6),
    (["resnet50", "bert_base", "mobilenet_v2"], 1.3),
    (["vit_b_16", "gpt2", "resnet50"], 1.45),
]
UTILIZATION = 0.01  # the demo's kernels are sleeps: the jobs share no compute


def trace_paths(names):
    return [os.path.join(TRACES, name + ".ztrace.gz") for name in names]


def run_json(command):
    """The command's JSON; it may exit 1 having printed it (a job failed: a result, not an error)."""
    result = subprocess.run(command, capture_output=True, text=True)
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        sys.exit(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-2000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_dir")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--iterations", type=int, default=12, help="per job (default 12, zico-demo's)")
    parser.add_argument("--mixes", type=int, default=len(MIXES), help=f"the first K mixes (default {len(MIXES)})")
    args = parser.parse_args()
    if args.iterations < 1 or not 1 <= args.mixes <= len(MIXES):
        parser.error(f"--iterations must be >= 1 and --mixes 1..{len(MIXES)}")
    umctl = os.path.join(args.build_dir, "bin", "zico-umctl")
    demo = os.path.join(args.build_dir, "bin", "zico-demo")
    for tool in (umctl, demo):
        if not os.access(tool, os.X_OK):
            parser.error(f"{tool} is not there: build first (cmake --build {args.build_dir})")
    runs = []
    for names, ratio in MIXES[:args.mixes]:
        paths = trace_paths(names)
        unlimited = run_json([umctl, "simulate", "--json", "--policy", "unlimited", "--iterations", "1"] + paths)
        budget = int(sum(job["peak_bytes"] for job in unlimited["jobs"]) / ratio)
        simulated = run_json([umctl, "simulate", "--json", "--policy", "zico", "--launch", "together",
                              "--budget", str(budget), "--iterations", str(args.iterations),
                              "--utilization", str(UTILIZATION)] + paths)
        simulated_static = run_json([umctl, "simulate", "--json", "--policy", "static", "--launch", "together",
                                     "--budget", str(budget), "--iterations", str(args.iterations),
                                     "--utilization", str(UTILIZATION)] + paths)
        with tempfile.TemporaryDirectory() as out:
            live = run_json([demo, "--json", "--traces", ",".join(names), "--budget", str(budget),
                             "--iterations", str(args.iterations), "--out", out])
        zico = live["phases"]["zico"]
        run = {
            "mix": "+".join(names),
            "budget_bytes": budget,
            "iterations": args.iterations,
            "live_iters_per_s": zico["model_iterations_per_s"],
            "simulated_iters_per_s": simulated["aggregate_iters_per_s"],
            "live_yields": zico["deadlocks"],  # each deadlock the daemon broke is one yield to host
            "simulated_yields": simulated["yields"],
            "static_iters_per_s": live["phases"]["static"]["model_iterations_per_s"],
            "simulated_static_iters_per_s": simulated_static["aggregate_iters_per_s"],
        }
        run["live_over_simulated"] = (run["live_iters_per_s"] / run["simulated_iters_per_s"]
                                      if run["simulated_iters_per_s"] > 0 else 0.0)
        # Static partitioning lends each job its peak once: what live loses there is the live
        # path's own cost (grants, returns, chunk imports), not the scheduler's decisions.
        run["live_static_over_simulated"] = (run["static_iters_per_s"] / run["simulated_static_iters_per_s"]
                                             if run["simulated_static_iters_per_s"] > 0 else 0.0)
        runs.append(run)
        if not args.json:
            print(f"{run['mix']:32} budget {budget / 2**30:6.2f} GiB  live {run['live_iters_per_s']:6.2f} it/s "
                  f"({run['live_yields']} yields)  simulated {run['simulated_iters_per_s']:6.2f} it/s "
                  f"({run['simulated_yields']} yields)  live/simulated {run['live_over_simulated']:.3f}  "
                  f"static live/simulated {run['live_static_over_simulated']:.3f}", flush=True)
    if args.json:
        print(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
