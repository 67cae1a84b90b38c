#!/usr/bin/env python3
"""zico's throughput over a sweep of budgets, for the committed pairs and triples.

For each case, zico runs at budgets from the exhaustive fixed-offset bound's
peak up to the peak `unlimited` reaches, in steps of STEP times the bound; each
run is compared with `unlimited` on the same inputs. Give several zico-umctl
binaries to compare builds on the same budgets (docs/benchmarks.md, "Across
budgets"). Simulated time: the figures do not depend on the machine's load.

Usage: time_shift_sweep.py [--utilization U] [--iterations N] [--step S] ZICO_UMCTL...
"""
import argparse
import json
import os
import subprocess
import sys

CASES = [("bert_base", "vit_b_16"), ("resnet50", "mobilenet_v2"), ("gpt2", "gpt2_medium"),
         ("bert_base", "bert_base"), ("bert_base", "gpt2", "vit_b_16"),
         ("resnet50", "mobilenet_v2", "bert_base")]
TRACES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "traces")


def simulate(umctl, args):
    done = subprocess.run([umctl, "simulate", "--json"] + args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{umctl} simulate {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--utilization", default="0.5", help="every job's busy fraction, or 'trace' (default 0.5)")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--step", type=float, default=0.013, help="budget step, a fraction of the bound's peak")
    parser.add_argument("umctl", nargs="+", help="zico-umctl binaries to compare")
    options = parser.parse_args()
    if not 0 < options.step <= 1:
        sys.exit(f"--step {options.step} is not in (0, 1]")
    if options.iterations < 1:
        sys.exit(f"--iterations {options.iterations} is not a whole number from 1")
    common = ["--iterations", str(options.iterations)]
    if options.utilization != "trace":
        common += ["--utilization", options.utilization]

    ratios = {u: [] for u in options.umctl}
    for case in CASES:
        traces = [os.path.join(TRACES, f"{name}.ztrace.gz") for name in case]
        unlimited = simulate(options.umctl[0], ["--policy", "unlimited"] + common + traces)
        top = unlimited["peak_bytes"]
        bound = simulate(options.umctl[0], ["--budget", str(top)] + common + traces)["exhaustive"]["peak_bytes"]
        line = []
        for umctl in options.umctl:
            case_ratios = []
            factor = 1.0
            while bound * factor < top:
                z = simulate(umctl, ["--budget", str(int(bound * factor))] + common + traces)
                if z["budget_exceeded"]:
                    sys.exit(f"{umctl}: {'+'.join(case)} exceeded a budget of {int(bound * factor)} bytes")
                case_ratios.append(z["aggregate_iters_per_s"] / unlimited["aggregate_iters_per_s"])
                factor += options.step
            ratios[umctl] += case_ratios
            line.append(f"{umctl}: min {min(case_ratios):.3f} mean {sum(case_ratios) / len(case_ratios):.3f} "
                        f"below 0.9: {sum(r < 0.9 for r in case_ratios)} of {len(case_ratios)}")
        print(f"{'+'.join(case)}: " + " | ".join(line), flush=True)
    for umctl, values in ratios.items():
        print(f"{umctl}: zico / unlimited over {len(values)} runs: min {min(values):.3f}, "
              f"mean {sum(values) / len(values):.4f}, below 0.9: {sum(r < 0.9 for r in values)}")


if __name__ == "__main__":
    main()
