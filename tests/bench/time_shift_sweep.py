#!/usr/bin/env python3
"""zico's throughput against unlimited and against the best simpler policy, over budgets.

Default: for each of the six pairs and triples the must-show tables use, zico
runs at budgets from the exhaustive fixed-offset bound's peak up to the peak
`unlimited` reaches, in steps of STEP times the bound; each case reports
zico / unlimited, zico / the best of static partitioning (its best plan),
sequential and fcfs at the same budget, and whether zico's throughput ever
falls as the budget grows (by more than 1 %). With --band: every pair and
triple of the committed traces (repeats allowed, 156 combinations) at
summed peaks / 1.3, 1.45 and 1.6; runs where some job cannot fit at all are
counted apart, and the rest are listed when zico is below 0.9 x unlimited or
below 0.95 x the best simpler policy. Every policy but sequential runs with
its best launch plan (`simulate --launch best`, the default); zico launched
with every job at once (the time-shift scheduler alone) is reported beside
it, against the same policies. Each run is compared with the others on the
same inputs. --launch together launches every job at once under every
policy (static: each as its reservation fits, in the order given). In the
band a run below 0.9 x unlimited at or above the bound's peak is also
compared with unlimited launched together (the bound's own assumption); in
either mode --long N runs each run below 0.9 x at or above the bound's peak
again over N iterations, to tell the learning phase (each job's first
iterations run without a claim, one learner at a time: paid once per run)
from the steady state. Give several
zico-umctl binaries to compare builds on the same budgets
(docs/benchmarks.md). Simulated time: the figures do not depend on the
machine's load.

Usage: time_shift_sweep.py [--band] [--utilization U] [--iterations N] [--step S] [--launch best|together]
                           [--long N] ZICO_UMCTL...
"""
import argparse
import itertools
import json
import os
import subprocess
import sys

CASES = [("bert_base", "vit_b_16"), ("resnet50", "mobilenet_v2"), ("gpt2", "gpt2_medium"),
         ("bert_base", "bert_base"), ("bert_base", "gpt2", "vit_b_16"),
         ("resnet50", "mobilenet_v2", "bert_base")]
TRACES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "traces")
BAND = (1.3, 1.45, 1.6)


SIMPLER = ("static", "sequential", "fcfs")


def best_simpler(results):
    """The simpler policy with the most throughput in a --policy all result, and that throughput."""
    name = max(SIMPLER, key=lambda p: results[p]["aggregate_iters_per_s"])
    return name, results[name]["aggregate_iters_per_s"]


def together(z):
    """zico's throughput with every job launched at once (reported beside its best plan)."""
    return z.get("launched_together", z)["aggregate_iters_per_s"]


def check_budget(umctl, case, budget, z):
    for run in (z, z.get("launched_together", z)):
        if run["budget_exceeded"]:
            sys.exit(f"{umctl}: {'+'.join(case)} exceeded a budget of {budget} bytes")


def simulate(umctl, args):
    done = subprocess.run([umctl, "simulate", "--json"] + args, capture_output=True, text=True)
    # Exit 1 with a complete result: a job failed (the result says which).
    if done.returncode not in (0, 1) or not done.stdout.strip():
        sys.exit(f"{umctl} simulate {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--band", action="store_true", help="every pair and triple at summed peaks / 1.3, 1.45, 1.6")
    parser.add_argument("--utilization", default="0.5", help="every job's busy fraction, or 'trace' (default 0.5)")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--step", type=float, default=0.013, help="budget step, a fraction of the bound's peak")
    parser.add_argument("--launch", choices=("best", "together"), default="best",
                        help="every policy's launch plan: its best (default) or all jobs at once")
    parser.add_argument("--long", type=int, default=0, metavar="N",
                        help="run each run below 0.9 x unlimited at or above the bound's peak again over N "
                             "iterations (how much of the loss is the jobs' learning, a one-off)")
    parser.add_argument("umctl", nargs="+", help="zico-umctl binaries to compare")
    options = parser.parse_args()
    if not 0 < options.step <= 1:
        sys.exit(f"--step {options.step} is not in (0, 1]")
    if options.iterations < 1:
        sys.exit(f"--iterations {options.iterations} is not a whole number from 1")
    if options.long < 0:
        sys.exit(f"--long {options.long} is not a whole number of iterations (0: off)")
    common = ["--iterations", str(options.iterations), "--launch", options.launch]
    if options.utilization != "trace":
        common += ["--utilization", options.utilization]
    return options, common


def sweep_budgets(options, common):
    ratios = {u: [] for u in options.umctl}
    versus = {u: [] for u in options.umctl}
    falls = {u: 0 for u in options.umctl}
    for case in CASES:
        traces = [os.path.join(TRACES, f"{name}.ztrace.gz") for name in case]
        # The budgets go up to what the jobs hold all running together.
        top = simulate(options.umctl[0], ["--policy", "unlimited"] + common + ["--launch", "together"] + traces)["peak_bytes"]
        bound = simulate(options.umctl[0], ["--budget", str(top)] + common + traces)["exhaustive"]["peak_bytes"]
        line = []
        for umctl in options.umctl:
            case_ratios, case_versus, case_falls, case_together = [], [], 0, []
            factor = 1.0
            while bound * factor < top:
                everything = simulate(umctl, ["--policy", "all", "--budget", str(int(bound * factor))] + common + traces)
                z = everything["zico"]
                check_budget(umctl, case, int(bound * factor), z)
                unlimited = everything["unlimited"]["aggregate_iters_per_s"]
                if case_ratios and z["aggregate_iters_per_s"] < 0.99 * case_ratios[-1] * unlimited:
                    case_falls += 1
                case_ratios.append(z["aggregate_iters_per_s"] / unlimited)
                if case_ratios[-1] < 0.9 and options.long:
                    print(f"{umctl}: {'+'.join(case)} at {factor:.3f} x the bound's peak: {case_ratios[-1]:.3f} x "
                          f"unlimited; over {options.long} iterations "
                          f"{over_long(umctl, options, int(bound * factor), traces):.3f}", flush=True)
                case_versus.append(z["aggregate_iters_per_s"] / best_simpler(everything)[1])
                case_together.append(together(z) / unlimited)
                factor += options.step
            ratios[umctl] += case_ratios
            versus[umctl] += case_versus
            falls[umctl] += case_falls
            line.append(f"{umctl}: vs unlimited min {min(case_ratios):.3f} mean {sum(case_ratios) / len(case_ratios):.3f} "
                        f"below 0.9: {sum(r < 0.9 for r in case_ratios)} of {len(case_ratios)}; "
                        f"vs the best simpler policy min {min(case_versus):.3f}; falls as the budget grows: {case_falls}; "
                        f"launched together: vs unlimited min {min(case_together):.3f}, "
                        f"below 0.9: {sum(r < 0.9 for r in case_together)}")
        print(f"{'+'.join(case)}: " + " | ".join(line), flush=True)
    for umctl, values in ratios.items():
        print(f"{umctl}: zico / unlimited over {len(values)} runs: min {min(values):.3f}, "
              f"mean {sum(values) / len(values):.4f}, below 0.9: {sum(r < 0.9 for r in values)}; "
              f"zico / the best simpler policy: min {min(versus[umctl]):.3f}, "
              f"below 0.95: {sum(r < 0.95 for r in versus[umctl])}; falls: {falls[umctl]}")


def band(options, common):
    names = sorted(f[: -len(".ztrace.gz")] for f in os.listdir(TRACES) if f.endswith(".ztrace.gz"))
    cases = [c for k in (2, 3) for c in itertools.combinations_with_replacement(names, k)]
    counts = {u: {"runs": 0, "cannot_fit": 0, "below": 0, "turns": 0, "stretched": [], "other": 0, "loses": 0,
                  "versus": [], "together_versus": [], "together_below": 0, "at_bound": 0, "at_bound_together": 0,
                  "at_bound_long": 0}
              for u in options.umctl}
    for case in cases:
        traces = [os.path.join(TRACES, f"{name}.ztrace.gz") for name in case]
        alone = simulate(options.umctl[0], ["--policy", "unlimited"] + common + ["--launch", "together"] + traces)
        summed = sum(j["peak_bytes"] for j in alone["jobs"])
        for ratio in BAND:
            budget = str(int(summed / ratio))
            for umctl in options.umctl:
                everything = simulate(umctl, ["--policy", "all", "--budget", budget] + common + traces)
                z = everything["zico"]
                check_budget(umctl, case, budget, z)
                unlimited = everything["unlimited"]
                c = counts[umctl]
                c["runs"] += 1
                if z["failed_jobs"] > 0:
                    c["cannot_fit"] += 1
                    continue
                vs = z["aggregate_iters_per_s"] / unlimited["aggregate_iters_per_s"]
                simpler, simpler_rate = best_simpler(everything)
                versus = z["aggregate_iters_per_s"] / simpler_rate
                c["versus"].append(versus)
                together_vs = together(z) / unlimited["aggregate_iters_per_s"]
                c["together_versus"].append(together(z) / simpler_rate)
                c["together_below"] += together_vs < 0.9
                if versus < 0.95:
                    c["loses"] += 1
                if vs >= 0.9 and versus >= 0.95:
                    continue
                if vs < 0.9:
                    c["below"] += 1
                bound = z.get("exhaustive", {}).get("peak_bytes", 0)
                print(f"{umctl}: {'+'.join(case)} at summed peaks / {ratio}: {vs:.3f} x unlimited, "
                      f"{versus:.3f} x {simpler} (the best simpler policy), "
                      f"budget {int(budget) / bound if bound else 0:.3f} x the bound's peak, {z['yields']} yields, "
                      f"plan {plan_text(z)}, launched together {together_vs:.3f} x unlimited; "
                      + (below_bound(z, unlimited, c, alone, options, umctl, budget, traces) if vs < 0.9
                         else "above 0.9 x unlimited"), flush=True)
    for umctl, c in counts.items():
        print(f"{umctl}: {c['runs']} runs, {c['cannot_fit']} with a job that cannot fit; of the rest, zico / the "
              f"best simpler policy min {min(c['versus']):.3f}, {c['loses']} below 0.95; "
              f"{c['below']} below 0.9 x unlimited: {c['turns']} where no schedule co-runs the jobs "
              f"without moving memory off the GPU every iteration, {len(c['stretched'])} where fixed offsets fit "
              f"on a longer cycle" + (f" (zico / that schedule {min(c['stretched']):.3f} to "
                                      f"{max(c['stretched']):.3f})" if c["stretched"] else "")
              + f", {c['other']} where no cycle fits, {c['at_bound']} at or above the bound's peak "
              f"({c['at_bound_together']} of them below 0.9 x unlimited launched together"
              + (f", {c['at_bound_long']} over {options.long} iterations" if options.long else "")
              + ")" + f"; launched together: zico / the best simpler policy "
              f"min {min(c['together_versus']):.3f}, {sum(v < 0.95 for v in c['together_versus'])} below 0.95, "
              f"{c['together_below']} below 0.9 x unlimited")


def plan_text(z):
    """'together', or the launch order and cap of zico's best plan."""
    plan = z.get("launch_plan")
    if plan is None or plan["max_running"] is None:
        return "together"
    return f"{'>'.join(plan['order'])} at most {plan['max_running']}"


def over_long(umctl, options, budget, traces):
    """zico / unlimited on the same budget over options.long iterations: the jobs learn their
    patterns (each one's first iterations without a claim, one learner at a time) once per run,
    so a longer run shows how much of the loss that was."""
    common = ["--iterations", str(options.long)]
    if options.utilization != "trace":
        common += ["--utilization", options.utilization]
    everything = simulate(umctl, ["--policy", "all", "--budget", str(budget), "--launch", options.launch] + common
                          + traces)
    return everything["zico"]["aggregate_iters_per_s"] / everything["unlimited"]["aggregate_iters_per_s"]


def below_bound(z, unlimited, counts, alone, options, umctl, budget, traces):
    """What the best fixed-offset schedule can do on a budget below the bound's peak (exhaustive_bound.h);
    at or above it, zico against unlimited launched together (every job at once, as the bound
    assumes) and, with --long, over more iterations."""
    stretched = z.get("exhaustive", {}).get("stretched")
    if stretched is None:
        counts["at_bound"] += 1
        vs_together = z["aggregate_iters_per_s"] / alone["aggregate_iters_per_s"]
        counts["at_bound_together"] += vs_together < 0.9
        text = f"at or above the bound's peak; {vs_together:.3f} x unlimited launched together"
        if options.long:
            longer = over_long(umctl, options, budget, traces)
            counts["at_bound_long"] += longer < 0.9
            text += f"; over {options.long} iterations {longer:.3f} x unlimited"
        return text
    if not stretched["found"]:
        if stretched["shortfall_bytes"] > 0:
            counts["turns"] += 1
            shortfall = stretched["shortfall_bytes"] / 2**30
            return f"a job's peak and the others' least exceed the budget by {shortfall:.2f} GiB"
        counts["other"] += 1
        return "no cycle fits"
    best = stretched["iters_per_s"]
    counts["stretched"].append(z["aggregate_iters_per_s"] / best)
    return (f"fixed offsets fit at {stretched['stretch']:.3f} x the cycle: "
            f"{best / unlimited['aggregate_iters_per_s']:.3f} x unlimited, zico {z['aggregate_iters_per_s'] / best:.3f} x that")


def main():
    options, common = parse()
    if options.band:
        band(options, common)
    else:
        sweep_budgets(options, common)


if __name__ == "__main__":
    main()
