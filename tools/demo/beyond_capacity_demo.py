#!/usr/bin/env python3
"""One training job on a GPU with half the memory it needs, in UM mode.

    beyond_capacity_demo.py [--trace NAME|PATH] [--iterations N] [--fraction F] [--bin DIR] [--json]

Replays a committed trace's ops (trace_job --ops) through libzicoum on the
simulated backend four times: in memory (a budget the job never reaches);
with a budget of F (default 0.5) of its peak under zicoum's planner
(ZICO_PAGING_POLICY=zico) and under demand paging (um: pages fault in, and
zicoum's pager makes room for them before each kernel, on its own stream);
and as plain cudaMallocManaged would run on a GPU with only the budget's
memory (a simulated device of that size, no budget for zicoum to keep: the
driver evicts inside the fault path, as the UVM driver does when a GPU is
oversubscribed). Iteration times are on the simulated device's modelled
clock (H100 over PCIe Gen5), so they do not depend on this machine. Prints
the four side by side; exit 1 if a run failed or kept more than its budget on
the GPU, 2 for bad usage (a trace trace_job cannot read or replay among it).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.normpath(os.path.join(HERE, "..", "traces"))
IN_MEMORY_BUDGET = 80 << 30  # the simulated device: the whole card


def parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="bert_base", help="a committed trace's name, or a path (default bert_base)")
    parser.add_argument("--iterations", type=int, default=16, help="iterations per run, 2 to 1000 (default 16)")
    parser.add_argument("--fraction", type=float, default=0.5, help="the budget as a fraction of the peak, (0, 1)")
    parser.add_argument("--bin", default=os.path.join(os.getcwd(), "build", "bin"),
                        help="where zico-run and trace_job are (default build/bin)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    options = parser.parse_args()
    if not 2 <= options.iterations <= 1000:
        parser.error(f"--iterations {options.iterations} is not in 2 to 1000")
    if not 0 < options.fraction < 1:
        parser.error(f"--fraction {options.fraction} is not in (0, 1)")
    path = options.trace if os.sep in options.trace else os.path.join(TRACES, f"{options.trace}.ztrace.gz")
    if not os.path.isfile(path):
        parser.error(f"--trace '{options.trace}': no such trace ({path}); the committed ones are in {TRACES}")
    for tool in ("zico-run", "trace_job"):
        if not os.access(os.path.join(options.bin, tool), os.X_OK):
            parser.error(f"{os.path.join(options.bin, tool)} is missing; build it (cmake --build build) or pass --bin")
    return options, path


def replay(options, path, budget, policy, label, device_bytes=None):
    """trace_job's result line as a dict, for one run; `label` names the run if it fails. With
    `device_bytes`, the simulated device has only that much memory and the managed arena may be larger
    (oversubscription of the device itself, the driver evicting)."""
    command = [os.path.join(options.bin, "zico-run"), "--backend", "sim", "--mode", "um", "--budget", str(budget),
               "--", os.path.join(options.bin, "trace_job"), "--ops", "--trace", path,
               "--iterations", str(options.iterations)]
    environment = dict(os.environ, ZICO_PAGING_POLICY=policy, ZICO_SOCKET="off")
    if device_bytes is not None:
        environment.update(ZICO_SIM_CAPACITY=str(device_bytes), ZICO_ARENA_SIZE=str(IN_MEMORY_BUDGET))
    done = subprocess.run(command, capture_output=True, text=True, env=environment)
    lines = [line for line in done.stdout.splitlines() if line.startswith("result ")]
    if done.returncode != 0 or not lines:
        print(f"beyond_capacity_demo: the {label} run ({gib(budget)}, ZICO_PAGING_POLICY={policy}) failed "
              f"(exit {done.returncode}):\n" + done.stderr.strip()[-2000:], file=sys.stderr)
        # trace_job's 2 is a trace it cannot read or replay: this program's bad usage too.
        sys.exit(2 if done.returncode == 2 else 1)
    fields = dict(word.split("=", 1) for word in lines[-1].split()[1:] if "=" in word)
    run = {"policy": policy, "budget_bytes": budget, "first_iter_s": float(fields["first_iter_s"]),
           "last_iter_s": float(fields["last_iter_s"]), "peak_allocated_bytes": int(fields["peak_allocated_bytes"]),
           "peak_resident_bytes": int(fields["peak_resident_bytes"]), "faulted_pages": int(fields["faulted_pages"])}
    if device_bytes is not None:
        # The pager keeps no budget here and sees neither the driver's faults nor its evictions: what the
        # device holds is bounded by its size.
        run.update(device_bytes=device_bytes, peak_resident_bytes=device_bytes, faulted_pages=None)
    return run


def gib(n):
    """80 GiB, 4.39 GiB."""
    return f"{n >> 30} GiB" if n % (1 << 30) == 0 else f"{n / 2**30:.2f} GiB"


def main():
    options, path = parse()
    in_memory = replay(options, path, IN_MEMORY_BUDGET, "zico", "in-memory")
    budget = int(in_memory["peak_allocated_bytes"] * options.fraction)
    runs = [in_memory, replay(options, path, budget, "zico", "planner's"),
            replay(options, path, budget, "um", "demand paging"),
            replay(options, path, IN_MEMORY_BUDGET, "um", "plain UM", device_bytes=budget)]
    over = [r for r in runs[:3] if r["peak_resident_bytes"] > r["budget_bytes"]]
    if options.json:
        print(json.dumps({"trace": path, "iterations": options.iterations, "runs": runs}))
    else:
        name = os.path.basename(path).replace(".ztrace.gz", "")
        print(f"{name}: peak {gib(in_memory['peak_allocated_bytes'])}; budget {gib(budget)} "
              f"({options.fraction:g} of the peak) on a simulated H100 over PCIe Gen5, {options.iterations} iterations")
        print(f"  {'run':<42} {'last iteration':>15} {'x in memory':>12} {'on the GPU at most':>19} {'faults':>9}")
        labels = ["in memory", "zicoum's planner (zico)", "demand paging in zicoum's budget (um)",
                  "plain UM on a GPU of the budget's size"]
        for label, r in zip(labels, runs):
            faults = "-" if r["faulted_pages"] is None else r["faulted_pages"]
            print(f"  {label:<42} {r['last_iter_s'] * 1e3:>12.1f} ms {r['last_iter_s'] / in_memory['last_iter_s']:>11.2f}x "
                  f"{gib(r['peak_resident_bytes']):>19} {faults:>9}")
        zico, um, plain = runs[1], runs[2], runs[3]
        print(f"  zicoum's planner: {plain['last_iter_s'] / zico['last_iter_s']:.2f}x faster than plain UM, "
              f"{um['last_iter_s'] / zico['last_iter_s']:.2f}x faster than demand paging in its budget; "
              f"the budget was {'exceeded' if over else 'kept'}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
