"""Compares training runs of the GPU suite (tests/gpu/torch_training.py):
    compare_training.py NATIVE_LOG ENABLE_LOG ZICO_RUN_LOG
        whether every run's losses are bitwise equal to native's, the iteration
        time of each against native's (same run), the peak reserved of each
        against PyTorch's own, and what a graph capture did under
        zicoum.torch.enable;
    compare_training.py --against NATIVE_LOG RUN_LOG [BUDGET_BYTES]
        one run against native: losses bitwise equal, iteration time against
        native's, and where the run printed zicoum.stats() (--zico-stats), its
        pages on the GPU at the peak (within BUDGET_BYTES, if given), faults,
        prefetches and evictions.
    compare_training.py --model-step OUTDIR PREFIX [CALIBRATION_JSON | LINK_GB/S]
        the figures of a GPU suite model step (um_gpt2, um_resnet50) from its
        runs' files in OUTDIR: PREFIX_{native,save_on_cpu,checkpoint}.log and
        PREFIX_{zico,um,zico_at_save_on_cpu_budget,zico_tuned}.json (the
        --against figures of each UM run), the link's rates from the
        calibration file or one rate both ways.
Prints one JSON object."""
import json
import sys


def result_of(path):
    try:
        with open(path, errors="replace") as log:
            lines = [line for line in log if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def against(native, run, budget):
    figures = {"equal": False}
    if not (native and run):
        return figures
    figures["equal"] = native["losses"] == run["losses"]
    figures["iteration_x_native"] = round(run["iteration_ms"] / native["iteration_ms"], 3)
    figures["native_iteration_ms"] = round(native["iteration_ms"], 3)
    figures["native_peak_reserved_bytes"] = native["peak_reserved_bytes"]
    for name in ("gpu_used_before_bytes", "gpu_used_peak_bytes"):
        if name in run and name in native:
            figures[name] = run[name]
            figures["native_" + name] = native[name]
    zico = run.get("zico")
    if zico:
        for name in ("peak_resident_bytes", "faulted_pages", "prefetched_pages", "evicted_pages", "iterations",
                     "kernels", "kernels_without_blocks", "gemm_kernels_seen", "unnamed_faults", "learnt_pages",
                     "unasked_arrivals", "copies"):
            figures[name] = zico.get(name)
        if budget is not None:
            figures["budget_bytes"] = budget
            figures["within_budget"] = zico.get("peak_resident_bytes", budget + 1) <= budget
    return figures


def three(native, enable, zico_run):
    figures = {"all_equal": False}
    if native and enable and zico_run:
        figures["all_equal"] = native["losses"] == enable["losses"] == zico_run["losses"]
        for name, run in (("enable", enable), ("zico_run", zico_run)):
            figures[f"{name}_iteration_x_native"] = round(run["iteration_ms"] / native["iteration_ms"], 3)
            figures[f"{name}_peak_reserved_x_native"] = round(run["peak_reserved_bytes"] / native["peak_reserved_bytes"], 3)
        figures["native_iteration_ms"] = round(native["iteration_ms"], 3)
        figures["graph_capture"] = enable.get("graph_capture")
        figures["record_stream"] = enable.get("record_stream")
    return figures


# The pager's page in UM mode (the UM block, zicoum's chunk there).
PAGE_BYTES = 2 << 20
# UM runs of a model step and their names in its figures.
UM_RUNS = (("zico", "zico_policy"), ("um", "demand_paging"), ("zico_at_save_on_cpu_budget", "zico_at_save_on_cpu_budget"),
           ("zico_tuned", "zico_policy_tuned"))


def link_rates(argument):
    """(h2d, d2h) bytes per second from a calibration file or one rate in GB/s; None where unknown."""
    if not argument:
        return None
    if argument.endswith(".json"):
        try:
            model = json.load(open(argument))["model"]
            return model["h2d_bytes_per_s"], model["d2h_bytes_per_s"]
        except (OSError, ValueError, KeyError):
            return None
    rate = float(argument.removesuffix("GB/s")) * 1e9
    return rate, rate


def model_step(out, prefix, link_argument):
    def json_of(name):
        try:
            return json.load(open(f"{out}/{prefix}_{name}.json"))
        except (OSError, ValueError):
            return None

    native = result_of(f"{out}/{prefix}_native.log")
    figures = {}
    for run, name in UM_RUNS:
        if json_of(run) is not None:
            figures[name] = json_of(run)
    for baseline in ("save_on_cpu", "checkpoint"):
        result = result_of(f"{out}/{prefix}_{baseline}.log")
        figures[baseline] = {"ran": bool(native and result)}
        if native and result:
            figures[baseline].update(iteration_ms=round(result["iteration_ms"], 3),
                                     peak_reserved_bytes=result["peak_reserved_bytes"],
                                     peak_allocated_bytes=result.get("peak_allocated_bytes"),
                                     losses_equal_native=result["losses"] == native["losses"])
    ratio = lambda run: figures.get(run, {}).get("iteration_x_native")  # noqa: E731
    figures["zico_x_native"] = ratio("zico_policy")
    figures["um_x_native"] = ratio("demand_paging")
    figures["zico_at_save_on_cpu_budget_x_native"] = ratio("zico_at_save_on_cpu_budget")
    for baseline in ("save_on_cpu", "checkpoint"):
        ran = figures[baseline]["ran"]
        figures[f"{baseline}_x_native"] = round(figures[baseline]["iteration_ms"] / native["iteration_ms"], 3) if ran else None
    figures["save_on_cpu_peak_bytes"] = figures["save_on_cpu"].get("peak_reserved_bytes")
    if native:
        figures["native_peak_bytes"] = native["peak_reserved_bytes"]
        figures["native_peak_allocated_bytes"] = native.get("peak_allocated_bytes")
    # The transfer bound: zico's run (half the native peak) cannot take less per iteration than its
    # compute (native's iteration) nor than the bytes its pager moved each way per iteration
    # (prefetched and faulted pages in, evicted pages out, over the iterations it marked) at the
    # rates the calibration measured in this run, each direction on its own copy engine.
    rates, zico = link_rates(link_argument), figures.get("zico_policy", {})
    figures["bound_x_native"] = None
    if native and rates and zico.get("iterations"):
        iterations = zico["iterations"]
        in_bytes = ((zico.get("prefetched_pages") or 0) + (zico.get("faulted_pages") or 0)) * PAGE_BYTES / iterations
        out_bytes = (zico.get("evicted_pages") or 0) * PAGE_BYTES / iterations
        native_s = native["iteration_ms"] / 1e3
        bound_s = max(native_s, in_bytes / rates[0], out_bytes / rates[1])
        figures["bound_x_native"] = round(bound_s / native_s, 3)
        figures["bound_bytes_in_per_iteration"] = round(in_bytes)
        figures["bound_bytes_out_per_iteration"] = round(out_bytes)
    # Every UM run's losses bitwise equal to native's.
    um_runs = [figures[name] for _, name in UM_RUNS if name in figures]
    figures["losses_equal"] = bool(um_runs) and all(run.get("equal") for run in um_runs)
    return figures


if sys.argv[1] == "--model-step":
    print(json.dumps(model_step(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")))
elif sys.argv[1] == "--against":
    budget = int(sys.argv[4]) if len(sys.argv) > 4 else None
    print(json.dumps(against(result_of(sys.argv[2]), result_of(sys.argv[3]), budget)))
else:
    print(json.dumps(three(*(result_of(path) for path in sys.argv[1:4]))))
